"""`python -m bench.dp_step --windows`: the table behind nodes.training.dp_step.CONV_RULES."""

import torch

from bench import dp_step as bench_dp_step
from nodes.training import dp_step


def test_windows_table_has_a_row_per_conv_layer_with_its_shape_and_way_and_leaves_the_rule_as_shipped(capsys):
    shipped = dict(dp_step.CONV_RULES)
    assert (
        bench_dp_step.main(["--windows", "--models", "cnn_fmnist", "--batch", "4", "--repeats", "1", "--steps", "1"])
        == 0
    )
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("cnn_fmnist")]
    # conv1 sees (1, 28, 28): 13x13 positions, 8x8 windows of 1 channel in runs of 8, gathered by index;
    # conv2 (16, 12, 12): 5x5 positions, 4x4 windows of 16 channels in runs of 64, a strided copy
    assert [(r[1:4], r[4:7], r[-1]) for r in rows] == [
        (["(1,", "28,", "28)"], ["169", "64", "8"], "indexed"),
        (["(16,", "12,", "12)"], ["25", "256", "64"], "strided"),
    ]
    assert all(float(t) > 0 for r in rows for t in r[7:10])  # ms for the strided, indexed and grouped ways
    assert dp_step.CONV_RULES == shipped


def test_each_way_the_table_times_is_the_way_conv_per_sample_grads_takes():
    """The forcing constants reach every layer: cnn_fmnist's first conv (64-value windows, runs of 8)
    is timed grouped, indexed and strided, not twice one way."""
    layer = torch.nn.Conv2d(1, 16, 8, stride=2, padding=2)
    for way in bench_dp_step.CONV_WAYS:
        with bench_dp_step.conv_way_forced(way):
            assert dp_step.conv_way(layer, 13 * 13, torch.device("cpu")) == way

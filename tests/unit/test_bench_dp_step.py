"""`python -m bench.dp_step --windows`: the table behind nodes.dp_step.SHORT_RUN."""

from bench import dp_step as bench_dp_step
from nodes import dp_step


def test_windows_table_has_a_row_per_conv_layer_with_its_run_and_leaves_the_rule_as_shipped(capsys):
    shipped = dp_step.SHORT_RUN
    assert (
        bench_dp_step.main(["--windows", "--models", "cnn_fmnist", "--batch", "4", "--repeats", "1", "--steps", "1"])
        == 0
    )
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("cnn_fmnist")]
    # conv1 sees (1, 28, 28) with 8x8 windows of 1 channel, conv2 (16, 12, 12) with 4x4 of 16
    assert [(r[1:4], r[4]) for r in rows] == [(["(1,", "28,", "28)"], "8"), (["(16,", "12,", "12)"], "64")]
    assert all(float(r[5]) > 0 and float(r[6]) > 0 for r in rows)
    assert dp_step.SHORT_RUN == shipped

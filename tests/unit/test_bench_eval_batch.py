"""`python -m bench.eval_batch`: the table behind dp.batch_eval's default, alone and side by side."""

import pytest

from bench import eval_batch


@pytest.mark.parametrize("concurrent", [1, 2])
def test_table_has_a_timed_row_per_batch_and_the_ratio_to_1024(capsys, concurrent):
    argv = ["--models", "logreg", "--batches", "8,1024", "--samples", "40", "--repeats", "2"]
    assert eval_batch.main([*argv, "--concurrent", str(concurrent)]) == 0
    out = capsys.readouterr().out
    assert f"{concurrent} at once" in out.splitlines()[0]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines() if line.startswith("| logreg")]
    assert [r[1] for r in rows] == ["8", "1024"]
    assert all(float(r[i]) >= 0 for r in rows for i in (2, 3, 5, 6))
    assert [r[4] for r in rows][-1] == "1.00" and [r[7] for r in rows][-1] == "1.00"


def test_pool_table_times_torchs_max_pool_against_the_sliced_one(capsys):
    argv = ["--pool", "--models", "cnn_fmnist,mlp", "--batches", "16", "--samples", "32", "--repeats", "1"]
    assert eval_batch.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "sliced ÷ max_pool2d" in lines[1]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines if line.startswith(("| cnn", "| mlp"))]
    assert [r[:2] for r in rows] == [["cnn_fmnist", "16"], ["mlp", "16"]]
    assert all(
        len(r) == 7 and float(r[6]) >= 0 for r in rows
    )  # a ratio of timings: any number, on a loaded machine 0.00


def test_loss_table_times_torchs_cross_entropy_against_the_evaluations(capsys):
    argv = ["--loss", "--models", "logreg", "--batches", "16,64", "--samples", "64", "--repeats", "1"]
    assert eval_batch.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "logsumexp ÷ torch" in lines[1]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines if line.startswith("| logreg")]
    assert [r[1] for r in rows] == ["16", "64"] and all(len(r) == 7 and float(r[6]) >= 0 for r in rows)

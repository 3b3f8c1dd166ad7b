"""A user's own dataset: data.dataset=package.module:ClassName (tests/plugins/dataset.py), read by the
server, its workers and its evaluator, each importing the class by the same reference."""

import json

import pytest

from emulator.output.results import read_clients, read_table
from tests.cli import REPO, emulator

TINY = "tests.plugins.dataset:TinyImages"


def test_a_users_dataset_runs_end_to_end_from_the_command_line(tmp_path):
    r = emulator(
        REPO,
        f"data.dataset={TINY}",
        "model.name=mlp",
        "clients.n=4",
        "budget.rounds=2",
        "workers=1",
        f"output.dir={tmp_path}",
        "output.name=tiny",
        "output.progress=false",
    )
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "tiny"
    assert json.loads((run_dir / "run.json").read_text())["scenario"]["data"]["dataset"] == TINY
    # its 90 training images shared out iid: no shipped dataset gives these counts
    assert read_clients(run_dir).column("data_size").to_pylist() == [23, 23, 22, 22]
    rounds = read_table(run_dir, "rounds").to_pylist()
    assert [row["arrived"] for row in rounds] == [4, 4]  # the worker trained on it
    # the evaluator tested on its 30 test images: each accuracy a whole number of them
    assert all(abs(row["test_accuracy"] * 30 - round(row["test_accuracy"] * 30)) < 1e-9 for row in rounds)


@pytest.mark.parametrize(
    "dataset, message",
    [
        ("tests.plugins.dataset:NotADataset", "tests.plugins.dataset.NotADataset is not one; expected a subclass"),
        ("no_such_module:X", "cannot import no_such_module"),
    ],
)
def test_a_dataset_that_cannot_be_loaded_is_one_line_exit_2(tmp_path, dataset, message):
    r = emulator(REPO, f"data.dataset={dataset}", f"output.dir={tmp_path / 'runs'}")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: data.dataset = {dataset!r}: ") and message in r.stderr
    assert not (tmp_path / "runs").exists()

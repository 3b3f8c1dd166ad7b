"""`python -m bench.gpu_check`'s own logic, without running its lines: how two runs' tables are compared,
and how the table is written when a line passes, fails, breaks or does not fit the budget. The lines
themselves run in its dry run (`--device cpu --small`, docs/gpu.md)."""

from __future__ import annotations

import contextlib
import json
import math
import re

import pytest

from bench import gpu_check
from bench.gpu_check import Failed, Line, Partial, _difference
from emulator.results import RunWriter


def run_dir(tmp_path, name, accuracy=0.5, wall=1.0, loss=0.25):
    d = tmp_path / name
    rounds = [dict(round=r, test_accuracy=accuracy, test_loss=math.nan, wall_s=wall * (r + 1)) for r in range(2)]
    clients = [dict(round=r, client=c, train_loss=loss) for r in range(2) for c in range(3)]
    writer = RunWriter(d)
    for r in range(2):
        writer.write_round(r, {"rounds": [rounds[r]], "client_rounds": clients[3 * r : 3 * r + 3], "events": []})
    return d


def test_runs_that_differ_in_wall_clock_alone_are_identical_nan_included(tmp_path):
    assert _difference(run_dir(tmp_path, "a", wall=1.0), run_dir(tmp_path, "b", wall=7.0)) == ""


def test_a_difference_names_its_table_round_and_column(tmp_path):
    a = run_dir(tmp_path, "a")
    assert _difference(a, run_dir(tmp_path, "b", accuracy=0.75)) == "rounds, round 0: test_accuracy 0.5 against 0.75"
    assert _difference(a, run_dir(tmp_path, "c", loss=0.5)) == "client_rounds, round 0: train_loss 0.25 against 0.5"


def fake_line(key, estimate_s, outcome):
    def run(check):
        if isinstance(outcome, Exception):
            raise outcome
        check.numbers[key] = {"value": 1}
        return outcome

    return Line(key, f"title {key}", estimate_s, run)


@pytest.fixture
def fake_lines(monkeypatch):
    monkeypatch.setattr(gpu_check, "fashion_mnist", lambda data: contextlib.nullcontext("nowhere"))
    monkeypatch.setattr(
        gpu_check,
        "LINES",
        [
            fake_line("fine", 0, "3 things | measured"),
            fake_line("failed", 0, Failed("2 of 3 differ")),
            fake_line("broke", 0, KeyError("gpus")),
            fake_line("cut", 0, Partial("4 of 7 runs complete")),
            fake_line("long", 10**6, "never"),
        ],
    )


def test_each_line_is_a_row_ok_failed_or_skipped_and_a_failure_fails_the_check(tmp_path, fake_lines, capsys):
    assert gpu_check.main(["--device", "cpu", "--out", str(tmp_path), "--budget-s", "60"]) == 1
    rows = [line.split(" | ") for line in (tmp_path / "gpu_check.md").read_text().splitlines() if line[:2] == "| "]
    rows[-1][1] = re.sub(r"^\d+ s", "SECONDS s", rows[-1][1])  # what is left: 60 s less the lines before it
    assert [(r[0], r[1], r[3]) for r in rows[1:]] == [
        ("| title fine", "3 things / measured", "ok |"),  # a '|' of the result would split its row
        ("| title failed", "2 of 3 differ", "FAILED |"),
        ("| title broke", "KeyError: 'gpus'", "FAILED |"),
        ("| title cut", "4 of 7 runs complete", "partial |"),  # what the budget's end left measured
        ("| title long", "SECONDS s of the 60 s budget left, needs ~1000000 s", "skipped |"),
    ]
    assert "Skipped for time: long." in (tmp_path / "gpu_check.md").read_text()
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [line["status"] for line in saved["lines"]] == ["ok", "FAILED", "FAILED", "partial", "skipped"]
    assert saved["numbers"]["fine"] == {"value": 1} and (tmp_path / "log.txt").is_file()
    assert "title fine" in capsys.readouterr().out  # the table is printed last, for a call's output


def test_only_runs_the_lines_named_and_passes_when_they_pass_or_are_cut_short(tmp_path, fake_lines):
    assert gpu_check.main(["--device", "cpu", "--out", str(tmp_path), "--only", "fine,cut"]) == 0
    assert [line["key"] for line in json.loads((tmp_path / "results.json").read_text())["lines"]] == ["fine", "cut"]


def test_the_floor_evaluates_after_the_rounds_a_run_evaluates(monkeypatch, torch_settings):
    """bench.floor --evaluate: the GPU check's one-process floor evaluates the global model where a run
    would (eval.every and the last round), the weights FedAvg gave."""
    from bench import floor

    evaluated = []

    class Recorder:
        def __init__(self, data, device, **kwargs):
            assert device.type == "cpu"

        def __call__(self, weights):
            evaluated.append(weights)

    monkeypatch.setattr(floor, "GlobalEvaluation", Recorder)
    overrides = ["clients.n=3", "budget.rounds=5", "eval.every=2", "dp.tau=1", "model.name=logreg"]
    floor.main(["--evaluate", *overrides])
    assert len(evaluated) == 3  # after rounds 1, 3 and 4 (the last)
    assert len({w["fc.weight"].tobytes() for w in evaluated}) == 3  # each round's FedAvg, not one model
    floor.main(overrides)
    assert len(evaluated) == 3  # without --evaluate, none


def test_fashion_mnist_found_nowhere_is_linked_as_its_standard_location_while_the_check_runs(tmp_path, monkeypatch):
    """A lent machine has no FashionMNIST: --data's files are searched where every run, sweep and
    reproduction looks, until the check ends; not put in the cache, which wants the official .gz files."""
    from nodes.data.idx import IDX_FILES, find_idx_files
    from nodes.data.locate import STANDARD_DIRS

    standard = tmp_path / "share" / "fashion-mnist"
    monkeypatch.setitem(STANDARD_DIRS, "fashion_mnist", [str(standard)])
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # an empty dataset cache
    data = tmp_path / "carried"
    data.mkdir()
    for name in IDX_FILES.values():
        (data / f"{name}.gz").write_bytes(b"")
    cfg = gpu_check.load(None, [gpu_check.FMNIST, "data.download=false"]).data
    with gpu_check.fashion_mnist(data) as found:
        assert found == f"{data}, linked as {standard} while the check ran"
        assert find_idx_files(cfg)["train_images"] == standard / "train-images-idx3-ubyte.gz"
    assert not standard.exists() and not (tmp_path / "home" / ".cache").exists()
    with gpu_check.fashion_mnist(tmp_path / "nothing") as found:
        assert found.startswith("FashionMNIST: dataset fashion_mnist: ") and found.endswith(": its lines will fail")

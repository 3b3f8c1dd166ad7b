"""`python -m bench.gpu_check`'s own logic, without running its lines' commands: how two runs' tables are
compared, how the table is written when a line passes, fails, breaks or does not fit the budget, and
what the bundles line makes of its runs' rounds tables. The lines themselves run in its dry run
(`--device cpu --small`, docs/gpu.md)."""

from __future__ import annotations

import contextlib
import json
import math
import re

import pytest

from bench import gpu_check
from bench.gpu_check import Failed, Line, Partial, _difference
from emulator.output.results import RunWriter


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
    from nodes.data import locate
    from nodes.data.catalog import FashionMNIST
    from nodes.data.idx import IDX_FILES

    standard = tmp_path / "share" / "fashion-mnist"
    monkeypatch.setattr(locate, "SYSTEM_DIR", standard.parent)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # an empty dataset cache
    data = tmp_path / "carried"
    data.mkdir()
    for name in IDX_FILES.values():
        (data / f"{name}.gz").write_bytes(b"")
    cfg = gpu_check.load(None, [gpu_check.FMNIST, "data.download=false"]).data
    with gpu_check.fashion_mnist(data) as found:
        assert found == f"{data}, linked as {standard} while the check ran"
        assert FashionMNIST(cfg).find_files()["train_images"] == standard / "train-images-idx3-ubyte.gz"
    assert not standard.exists() and not (tmp_path / "home" / ".cache").exists()
    with gpu_check.fashion_mnist(tmp_path / "nothing") as found:
        assert found.startswith("FashionMNIST: dataset fashion_mnist: ") and found.endswith(": its lines will fail")


class BundlesCheck:
    """What the bundles line uses of a Check: each run's rounds table is written from `walls[name][k]`
    (each round's wall_s, and how many of its 100 selected clients arrived), none for a run that fails."""

    def __init__(self, tmp_path, walls):
        self.device, self.small, self.numbers, self.tmp, self.walls, self.ran = "cuda", False, {}, tmp_path, walls, []

    def emulator(self, name, overrides):
        k = int(next(o for o in overrides if o.startswith("train.bundle=")).split("=")[1])
        assert {"device=cuda", "workers=1"} <= set(overrides) and name == f"bundles-{overrides[0]}-{k}"
        self.ran.append(name)
        rounds = self.walls[overrides[0].upper()].get(k)
        if rounds is None:
            raise Failed(f"{name}: exit 1: CUDA out of memory")
        writer = RunWriter(self.tmp / name)
        for r, (wall, arrived) in enumerate(rounds):
            row = dict(round=r, selected=100, arrived=arrived, wall_s=wall)
            writer.write_round(r, {"rounds": [row], "client_rounds": [], "events": []})
        return gpu_check.Ran(0, 9.0, ""), self.tmp / name


def test_the_bundles_line_reports_steady_clients_a_second_the_best_k_and_its_ratio_to_k_1(tmp_path, monkeypatch):
    """Round 0 (start-up, CUDA's first kernels) is left out; a round's rate is its arrived updates over
    its wall_s, the median over the rounds after it; a K whose run fails is named and fails the line,
    after every other K has been measured."""
    monkeypatch.setattr(gpu_check, "BUNDLES", {"W2": (["w2"], (1, 10, 50)), "W1": (["w1"], (1, 5))})
    walls = {
        "W2": {
            1: [(60.0, 100), (2.0, 100), (4.0, 100), (1.0, 100)],  # 50, 25, 100 a second: median 50
            10: [(60.0, 100), (0.5, 100), (0.5, 100), (0.5, 100)],  # 200
            50: [(0.01, 100), (0.25, 100), (0.25, 90), (0.25, 100)],  # 400, 360, 400; 290 of 300 arrived
        },
        "W1": {1: [(9.0, 100), (4.0, 100)], 5: [(9.0, 100), (1.0, 100)]},
    }
    check = BundlesCheck(tmp_path, walls)
    text = gpu_check.bundles_line(check)
    assert text == (
        "clients trained a second, 1 worker on cuda, rounds after the first: "
        "W2 K=1 50, K=10 200, K=50 400 (290 of 300 arrived): best K=50, 8.00x K=1; "
        "W1 K=1 25, K=5 100: best K=5, 4.00x K=1"
    )
    assert check.numbers["bundles"]["W2"]["k"][10]["clients_per_s"] == 200.0
    w1 = check.numbers["bundles"]["W1"]
    assert (w1["overrides"], w1["best"], w1["ratio_to_1"], w1["k"][1]["clients_per_s"]) == (["w1"], 5, 4.0, 25.0)

    del walls["W2"][10], walls["W1"][1]
    failing = BundlesCheck(tmp_path / "again", walls)
    with pytest.raises(Failed) as failed:
        gpu_check.bundles_line(failing)
    assert str(failed.value) == (
        "clients trained a second, 1 worker on cuda, rounds after the first: "
        "W2 K=1 50, K=10 failed (bundles-w2-10: exit 1: CUDA out of memory), K=50 400 (290 of 300 arrived): "
        "best K=50, 8.00x K=1; W1 K=1 failed (bundles-w1-1: exit 1: CUDA out of memory), K=5 100: best K=5, "
        "no ratio to K=1"
    )
    assert failing.ran == ["bundles-w2-1", "bundles-w2-10", "bundles-w2-50", "bundles-w1-1", "bundles-w1-5"]


def test_a_run_without_a_round_after_the_first_has_no_steady_state_to_measure():
    with pytest.raises(Failed, match="no round after the first"):
        gpu_check.clients_per_s([])


def test_every_line_but_the_reproduction_fits_the_default_budget_by_its_estimate():
    """The reproduction, last, takes what the others leave: no other line is skipped for time when each
    takes its estimate."""
    assert gpu_check.LINES[-1].key == "reproduce"
    assert sum(line.estimate_s for line in gpu_check.LINES[:-1]) <= gpu_check.BUDGET_S

"""python -m emulator --multirun: grid expansion, validation before anything runs, hive layout, failures, re-runs."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from emulator import sweep
from emulator.__main__ import main

# 2 "policies" (σ stands in until more policies land) × 2 dropout rates × 2 seeds, tiny runs.
SWEEP_ARGS = [
    "policy=fedavg_dp",
    "dp.sigma=0.5,1.0",
    "links.dropout.model=bernoulli",
    "links.dropout.p=0.0,0.3",
    "seed=0,1",
    "budget.rounds=2",
    "clients.n=4",
    "workers=1",
    "jobs=2",
]
POINTS = [
    f"dp.sigma={s}/links.dropout.p={p}/seed={seed}"
    for s in ("0.5", "1.0")
    for p in ("0.0", "0.3")
    for seed in ("0", "1")
]
_built: dict[str, Path] = {}


def small_sweep(tmp_path_factory) -> Path:
    """The real 8-run sweep, run once per test session (tests/e2e/test_analysis.py imports this too)."""
    if "dir" not in _built:
        parent = tmp_path_factory.mktemp("sweeps")
        assert main(["--multirun", *SWEEP_ARGS, f"output.dir={parent}", "output.name=small"]) == 0
        _built["dir"] = parent / "small"
    return _built["dir"]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    return small_sweep(tmp_path_factory)


def sweep_record(sweep_dir: Path) -> dict[str, dict]:
    return {r["path"]: r for r in json.loads((sweep_dir / "sweep.json").read_text())["runs"]}


# --- parsing and validation (nothing runs) ---------------------------------------------------


def test_comma_lists_split_outside_brackets_and_quotes():
    assert sweep.split_values("0.0,0.1,0.3") == ["0.0", "0.1", "0.3"]
    assert sweep.split_values("[0.5,0.5],[1,0]") == ["[0.5,0.5]", "[1,0]"]
    assert sweep.split_values("'a,b',c") == ["'a,b'", "c"]
    assert sweep.split_values("fedavg_dp") == ["fedavg_dp"]


def test_swept_keys_keep_their_order_and_jobs_is_stripped():
    s = sweep.parse(["seed=0,1", "clients.n=4", "dp.sigma=0.5,1.0", "jobs=3"])
    assert s.axes == [("seed", ["0", "1"]), ("dp.sigma", ["0.5", "1.0"])]
    assert s.base == ["clients.n=4"] and s.jobs == 3


@pytest.mark.parametrize(
    "args, key",
    [
        (["dp.sigma=0.5,-1"], "dp.sigma"),
        (["policy=fedavg_dp,no_such_policy"], "policy"),
        (["seed=0,1", "clients.n=zero"], "clients.n"),
        (["seed=0,1", "jobs=0"], "jobs"),
        (["seed=0,1", "output.name=a,b"], "output.name"),
    ],
)
def test_bad_grid_exits_2_naming_the_key_before_running_anything(tmp_path, capsys, args, key):
    assert main(["--multirun", *args, f"output.dir={tmp_path}", "workers=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and key in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir()), "nothing may be created before every grid point validates"


# --- orchestration with a stand-in emulator (fast: no training) ------------------------------

FAKE_EMULATOR = """
import json, pathlib, sys
from emulator.config import load, split_args
from nodes.schema import to_dict
args = dict(a.split("=", 1) for a in sys.argv[1:])
run = pathlib.Path(args["output.dir"]) / args["output.name"]
if args["seed"] == "1" and not pathlib.Path(sys.argv[0]).with_name("fixed").exists():
    sys.exit("boom: seed 1 cannot run")
scenario = to_dict(load(*split_args(sys.argv[1:])))
(run / "run.json").write_text(json.dumps({"status": "complete", "seed": int(args["seed"]), "scenario": scenario}))
print("results:", run)
"""


def test_failed_run_is_recorded_and_rerun_retries_only_it(tmp_path, monkeypatch, capsys):
    script = tmp_path / "fake_emulator.py"
    script.write_text(FAKE_EMULATOR)
    monkeypatch.setattr(sweep, "EMULATOR", [sys.executable, str(script)])
    argv = ["--multirun", "seed=0,1,2", "dp.sigma=0.5", f"output.dir={tmp_path}", "output.name=sw", "jobs=2"]

    assert main(argv) == 1
    record = sweep_record(tmp_path / "sw")
    assert {p: r["status"] for p, r in record.items()} == {
        "seed=0": "complete",
        "seed=1": "failed",
        "seed=2": "complete",
    }
    assert "boom: seed 1 cannot run" in record["seed=1"]["error"]
    assert "boom" in (tmp_path / "sw" / "seed=1" / sweep.LOG_NAME).read_text()
    capsys.readouterr()

    (tmp_path / "fixed").write_text("")
    assert main(argv) == 0
    record = sweep_record(tmp_path / "sw")
    assert {p: (r["status"], r["ran"]) for p, r in record.items()} == {
        "seed=0": ("complete", False),
        "seed=1": ("complete", True),
        "seed=2": ("complete", False),
    }


def test_a_changed_override_re_runs_every_point_and_sweep_json_keeps_the_earlier_records(tmp_path, monkeypatch, capsys):
    script = tmp_path / "fake_emulator.py"
    script.write_text(FAKE_EMULATOR)
    (tmp_path / "fixed").write_text("")
    monkeypatch.setattr(sweep, "EMULATOR", [sys.executable, str(script)])

    def run(*overrides):
        capsys.readouterr()
        assert main(["-m", "seed=0,1", *overrides, f"output.dir={tmp_path}", "output.name=sw"]) == 0  # -m: --multirun
        doc = json.loads((tmp_path / "sw" / "sweep.json").read_text())
        return {r["path"]: r["ran"] for r in doc["runs"]}, doc, capsys.readouterr().out

    ran, first, _ = run("dp.sigma=0.5")
    assert ran == {"seed=0": True, "seed=1": True} and first["earlier"] == []
    ran, second, out = run("dp.sigma=0.7")  # not swept, but changed: the runs hold sigma 0.5
    assert ran == {"seed=0": True, "seed=1": True}
    assert "re-running seed=0: config changed: dp.sigma 0.5 -> 0.7" in out
    assert json.loads((tmp_path / "sw" / "seed=1" / "run.json").read_text())["scenario"]["dp"]["sigma"] == 0.7
    ran, third, out = run("dp.sigma=0.7", "workers=3", "transport.heartbeat_s=5")  # how it ran, not what
    assert ran == {"seed=0": False, "seed=1": False} and "re-running" not in out
    assert [e["base_overrides"] for e in third["earlier"]] == [first["base_overrides"], second["base_overrides"]]
    assert third["earlier"][1]["runs"] == second["runs"]  # wall times and exit codes of earlier runs stay


# --- the real sweep ---------------------------------------------------------------------------


def test_sweep_writes_one_hive_partitioned_directory(sweep_dir):
    runs = sorted(str(p.parent.relative_to(sweep_dir)) for p in sweep_dir.rglob("run.json"))
    assert runs == sorted(POINTS)
    for point in POINTS:
        manifest = json.loads((sweep_dir / point / "run.json").read_text())
        swept = dict(part.split("=", 1) for part in point.split("/"))
        scenario = manifest["scenario"]
        assert manifest["status"] == "complete"
        assert (scenario["dp"]["sigma"], scenario["links"]["dropout"]["p"], manifest["seed"]) == (
            float(swept["dp.sigma"]),
            float(swept["links.dropout.p"]),
            int(swept["seed"]),
        )
        assert scenario["clients"]["n"] == 4 and scenario["links"]["dropout"]["model"] == "bernoulli"
        assert all(any((sweep_dir / point / t).glob("*.parquet")) for t in ("rounds", "client_rounds", "events"))
    assert all(r["status"] == "complete" and r["ran"] for r in sweep_record(sweep_dir).values())


def test_rerun_runs_nothing_new_then_only_the_deleted_run(sweep_dir, tmp_path):
    copy = tmp_path / "small"
    shutil.copytree(sweep_dir, copy)
    argv = ["--multirun", *SWEEP_ARGS, f"output.dir={tmp_path}", "output.name=small"]
    before = {p: (copy / p / "run.json").stat().st_mtime_ns for p in POINTS}

    assert main(argv) == 0
    assert not any(r["ran"] for r in sweep_record(copy).values())
    assert {p: (copy / p / "run.json").stat().st_mtime_ns for p in POINTS} == before

    deleted = POINTS[5]
    shutil.rmtree(copy / deleted)
    assert main(argv) == 0
    record = sweep_record(copy)
    assert [p for p, r in record.items() if r["ran"]] == [deleted]
    assert json.loads((copy / deleted / "run.json").read_text())["status"] == "complete"
    assert {p: (copy / p / "run.json").stat().st_mtime_ns for p in POINTS if p != deleted} == {
        p: t for p, t in before.items() if p != deleted
    }


def test_seed_is_always_the_last_path_segment_even_when_not_swept():
    from emulator.sweep import expand, parse

    sweep = parse(["dp.sigma=0.5,1.0", "seed=4"])
    expand(sweep)
    assert [p.label for p in sweep.points] == ["dp.sigma=0.5/seed=4", "dp.sigma=1.0/seed=4"]
    one = parse(["policy=fedavg_dp"])  # no comma list: a one-point grid
    expand(one)
    assert [p.label for p in one.points] == ["seed=0"]


@pytest.mark.parametrize("code, status", [(130, "interrupted"), (143, "interrupted"), (1, "failed")])
def test_a_point_stopped_by_ctrl_c_or_sigterm_is_interrupted_not_failed(tmp_path, monkeypatch, code, status):
    monkeypatch.setattr(sweep, "EMULATOR", [sys.executable, "-c", f"import sys; sys.exit({code})"])
    point = sweep.Point(swept=[("seed", "0")], dir=tmp_path / "seed=0")
    assert sweep.run_point(sweep.Sweep(base=[], axes=[]), point).status == status

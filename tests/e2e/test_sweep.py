"""python -m emulator --multirun through Hydra: grid expansion, validation before anything runs,
hive layout, failures, re-runs, sweep.json history, and the launchers (joblib, submitit's local
executor) giving the tables of the same points run one by one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import FAST, rows

from analysis.load import discover
from emulator.__main__ import main
from emulator.cli import hydra_app, sweep

# 2 "policies" (σ stands in until more policies land) × 2 dropout rates × 2 seeds, tiny runs,
# two at a time through the joblib launcher.
TINY = ["budget.rounds=2", "clients.n=4", "workers=1", "links.dropout.model=bernoulli"]
SWEEP_ARGS = [
    "policy=fedavg_dp",
    "dp.sigma=0.5,1.0",
    "links.dropout.p=0.0,0.3",
    "seed=0,1",
    *TINY,
    "hydra/launcher=joblib",
    "hydra.launcher.n_jobs=2",
]
POINTS = [
    f"dp.sigma={s}/links.dropout.p={p}/seed={seed}"
    for s in ("0.5", "1.0")
    for p in ("0.0", "0.3")
    for seed in ("0", "1")
]
TABLES = ("rounds", "client_rounds", "events")
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


@pytest.fixture(scope="module")
def one_by_one(tmp_path_factory) -> dict[str, Path]:
    """The 2×2 points (σ × seed, dropout 0.3) of the sweeps below, each a plain `python -m emulator` run."""
    out = tmp_path_factory.mktemp("one_by_one")
    runs = {}
    for sigma in ("0.5", "1.0"):
        for seed in ("0", "1"):
            name = f"s{sigma}-{seed}"
            args = [*TINY, "links.dropout.p=0.3", f"dp.sigma={sigma}", f"seed={seed}", "output.progress=false"]
            assert main([*args, f"output.dir={out}", f"output.name={name}"]) == 0
            runs[f"dp.sigma={sigma}/seed={seed}"] = out / name
    return runs


def sweep_record(sweep_dir: Path) -> dict[str, dict]:
    return {r["path"]: r for r in json.loads((sweep_dir / "sweep.json").read_text())["runs"]}


# --- expansion and validation (nothing runs) -------------------------------------------------


def test_hydra_expands_the_grid_in_the_order_given():
    points, base, swept = sweep.expand(hydra_app.parse(["seed=0,1", "clients.n=4", "dp.sigma=0.5,1.0"]))
    assert swept == {"seed": ["0", "1"], "dp.sigma": ["0.5", "1.0"]} and base == ["clients.n=4"]
    assert points[:2] == [["seed=0", "clients.n=4", "dp.sigma=0.5"], ["seed=0", "clients.n=4", "dp.sigma=1.0"]]
    assert len(points) == 4
    _, _, swept = sweep.expand(hydra_app.parse(["seed=range(3)", "policy=choice(fedavg_dp,ali_dpfl)", "a=[1,2]"]))
    assert swept == {"seed": ["0", "1", "2"], "policy": ["fedavg_dp", "ali_dpfl"]}  # a list is one value


def test_seed_is_always_the_last_path_segment_even_when_not_swept():
    assert sweep.point_of(["seed=4", "dp.sigma=0.5"], {"seed"}, 4).path == "dp.sigma=0.5/seed=4"
    assert sweep.point_of(["seed=1", "dp.sigma=0.5"], set(), 1).path == "dp.sigma=0.5/seed=1"
    assert sweep.point_of(["policy=fedavg_dp"], {"policy"}, 0).path == "seed=0"  # no sweep: one point


@pytest.mark.parametrize(
    "args, key",
    [
        (["dp.sigma=0.5,-1"], "dp.sigma"),
        (["policy=fedavg_dp,no_such_policy"], "policy"),
        (["seed=0,1", "clients.n=zero"], "clients.n"),
        (["seed=0,1", "jobs=2"], "hydra.launcher.n_jobs"),  # the launcher's now
        (["seed=0,1", "output.name=a,b"], "output.name"),
        (["seed=0,1", "dp.sigma=[0.5"], "dp.sigma"),  # Hydra's grammar
        (["seed=0,1", "hydra/launcher=nope"], "hydra/launcher"),
    ],
)
def test_bad_grid_exits_2_naming_the_key_before_running_anything(tmp_path, capsys, args, key):
    assert main(["--multirun", *args, f"output.dir={tmp_path}", "workers=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and key in err and len(err.strip().splitlines()) == 1, err
    assert not any(tmp_path.iterdir()), "nothing may be created before every grid point validates"


@pytest.mark.parametrize("where", ["end", "middle"])
def test_multirun_flag_may_come_anywhere_among_the_overrides(tmp_path, where):
    """Most command lines take a flag at the end: `... seed=0,1 -m` sweeps, through the real command."""
    overrides = [*TINY, "budget.rounds=1", "seed=0,1", f"output.dir={tmp_path}", "output.name=sw"]
    argv = [*overrides, "-m"] if where == "end" else [*overrides[:2], "--multirun", *overrides[2:]]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-m", "emulator", *argv], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for seed in (0, 1):
        assert json.loads((tmp_path / "sw" / f"seed={seed}" / "run.json").read_text())["status"] == "complete"


def test_cfg_job_may_come_between_overrides(capsys):
    assert main(["clients.n=4", "--cfg", "job", "seed=3"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["clients"]["n"], printed["seed"]) == (4, 3)


# --- orchestration with a stand-in emulator (fast: no training) ------------------------------

FAKE_EMULATOR = """
import json, pathlib, sys
from emulator.config import load, parse_override, split_args
from emulator.run.bundles import with_bundle
from emulator.run.devices import placement
from nodes.contracts.schema import to_dict
args = {o.key_or_group: o.value() for o in map(parse_override, sys.argv[1:])}
run = pathlib.Path(args["output.dir"]) / args["output.name"]
if args["seed"] == 1 and not pathlib.Path(sys.argv[0]).with_name("fixed").exists():
    sys.exit("boom: seed 1 cannot run")
cfg = load(*split_args(sys.argv[1:]))
scenario = to_dict(with_bundle(cfg, placement(cfg))[0])  # resolved, as a run records it
(run / "run.json").write_text(json.dumps({"status": "complete", "seed": int(args["seed"]), "scenario": scenario}))
print("results:", run)
"""


@pytest.fixture
def fake_emulator(tmp_path, monkeypatch) -> Path:
    """Points run a stand-in that writes a complete run.json (the basic launcher runs them in this process)."""
    script = tmp_path / "fake_emulator.py"
    script.write_text(FAKE_EMULATOR)
    monkeypatch.setattr(sweep, "EMULATOR", [sys.executable, str(script)])
    return tmp_path


def test_failed_run_is_recorded_and_rerun_retries_only_it(fake_emulator, capsys):
    argv = ["--multirun", "seed=0,1,2", "dp.sigma=0.5", f"output.dir={fake_emulator}", "output.name=sw"]

    assert main(argv) == 1
    record = sweep_record(fake_emulator / "sw")
    assert {p: r["status"] for p, r in record.items()} == {
        "seed=0": "complete",
        "seed=1": "failed",
        "seed=2": "complete",
    }
    assert "boom: seed 1 cannot run" in record["seed=1"]["error"]
    assert "boom" in (fake_emulator / "sw" / "seed=1" / sweep.LOG_NAME).read_text()
    capsys.readouterr()

    (fake_emulator / "fixed").write_text("")
    assert main(argv) == 0
    record = sweep_record(fake_emulator / "sw")
    assert {p: (r["status"], r["ran"]) for p, r in record.items()} == {
        "seed=0": ("complete", False),
        "seed=1": ("complete", True),
        "seed=2": ("complete", False),
    }


def test_a_changed_override_re_runs_every_point_and_sweep_json_keeps_the_earlier_records(fake_emulator, capsys):
    (fake_emulator / "fixed").write_text("")

    def run(*overrides):
        capsys.readouterr()
        # at a given K (train.bundle = auto chooses K from the workers)
        assert (
            main(["-m", "seed=0,1", "train.bundle=1", *overrides, f"output.dir={fake_emulator}", "output.name=sw"]) == 0
        )
        doc = json.loads((fake_emulator / "sw" / "sweep.json").read_text())
        return {r["path"]: r["ran"] for r in doc["runs"]}, doc, capsys.readouterr().out

    ran, first, _ = run("dp.sigma=0.5")
    assert ran == {"seed=0": True, "seed=1": True} and first["earlier"] == []
    ran, second, out = run("dp.sigma=0.7")  # not swept, but changed: the runs hold sigma 0.5
    assert ran == {"seed=0": True, "seed=1": True}
    assert "re-running seed=0: config changed: dp.sigma 0.5 -> 0.7" in out
    assert json.loads((fake_emulator / "sw" / "seed=1" / "run.json").read_text())["scenario"]["dp"]["sigma"] == 0.7
    (kept,) = (fake_emulator / "sw" / ".replaced").glob("*/seed=1")  # moved aside, not deleted
    assert json.loads((kept / "run.json").read_text())["scenario"]["dp"]["sigma"] == 0.5
    ran, third, out = run("dp.sigma=0.7", "workers=3", "transport.heartbeat_s=5")  # how it ran, not what
    assert ran == {"seed=0": False, "seed=1": False} and "re-running" not in out
    assert [e["base_overrides"] for e in third["earlier"]] == [first["base_overrides"], second["base_overrides"]]
    assert third["earlier"][1]["runs"] == second["runs"]  # wall times and exit codes of earlier runs stay


@pytest.mark.parametrize("code, status", [(130, "interrupted"), (143, "interrupted"), (1, "failed")])
def test_a_point_stopped_by_ctrl_c_or_sigterm_is_interrupted_not_failed(tmp_path, monkeypatch, code, status):
    monkeypatch.setattr(sweep, "EMULATOR", [sys.executable, "-c", f"import sys; sys.exit({code})"])
    assert main(["-m", "seed=0", f"output.dir={tmp_path}", "output.name=sw"]) == 1
    assert sweep_record(tmp_path / "sw")["seed=0"]["status"] == status


def test_hydra_writes_nothing_of_its_own_but_multirun_yaml(fake_emulator, monkeypatch):
    monkeypatch.chdir(fake_emulator)
    assert main(["-m", "seed=0", "output.dir=runs", "output.name=sw"]) == 0
    made = {str(p.relative_to(fake_emulator)) for p in fake_emulator.rglob("*")}
    assert made == {
        "fake_emulator.py",
        "runs",
        "runs/sw",
        "runs/sw/sweep.json",
        "runs/sw/multirun.yaml",  # Hydra's record of the sweep's config
        "runs/sw/seed=0",
        "runs/sw/seed=0/run.json",
        "runs/sw/seed=0/emulator.log",
    }


def test_a_single_run_through_hydra_writes_only_its_run_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*FAST, "budget.rounds=1", "output.dir=runs", "output.name=one"]) == 0
    assert [str(p.relative_to(tmp_path)) for p in tmp_path.iterdir()] == ["runs"]  # no outputs/, .hydra/, logs
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["one"]
    assert (tmp_path / "runs" / "one" / "run.json").is_file()


# --- the real sweep (joblib launcher) ---------------------------------------------------------


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
        assert all(any((sweep_dir / point / t).glob("*.parquet")) for t in TABLES)
    assert all(r["status"] == "complete" and r["ran"] for r in sweep_record(sweep_dir).values())


def test_the_joblib_sweep_gives_the_tables_of_the_points_run_one_by_one(sweep_dir, one_by_one):
    for point, alone in one_by_one.items():
        sigma, seed = point.split("/")
        swept = sweep_dir / sigma / "links.dropout.p=0.3" / seed
        for name in TABLES:
            assert rows(swept, name) == rows(alone, name), (point, name)


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


def test_an_interrupted_point_is_resumed_and_an_outdated_one_kept_aside(tmp_path, capsys):
    argv = ["-m", *TINY, "seed=0,1", f"output.dir={tmp_path}", "output.name=sw"]
    assert main(argv) == 0
    first = rows(tmp_path / "sw" / "seed=0", "rounds")
    manifest = tmp_path / "sw" / "seed=0" / "run.json"
    doc = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**doc, "status": "interrupted"}))  # as if killed after its last checkpoint

    assert main(argv) == 0
    record = sweep_record(tmp_path / "sw")
    assert {p: r["ran"] for p, r in record.items()} == {"seed=0": True, "seed=1": False}
    resumed = json.loads(manifest.read_text())
    assert resumed["status"] == "complete" and [r["at_round"] for r in resumed["resumed"]] == [2]
    assert rows(tmp_path / "sw" / "seed=0", "rounds") == first
    assert not (tmp_path / "sw" / ".replaced").exists()

    capsys.readouterr()
    assert main([*argv, "budget.rounds=3"]) == 0  # both outdated: run again, the earlier runs kept
    assert "re-running seed=0: config changed: budget.rounds 2 -> 3" in capsys.readouterr().out
    kept = sorted(p.relative_to(tmp_path / "sw" / ".replaced") for p in (tmp_path / "sw" / ".replaced").glob("*/*"))
    assert [p.name for p in kept] == ["seed=0", "seed=1"]
    assert rows(tmp_path / "sw" / ".replaced" / kept[0], "rounds") == first
    assert discover([str(tmp_path / "sw")]).runs[0].table("rounds").num_rows == 3  # analysis: the current runs


# --- Slurm through submitit (its local executor stands in for the cluster) -----------------------


def test_a_submitit_sweep_gives_the_tables_of_the_points_run_one_by_one(one_by_one, tmp_path):
    argv = ["-m", *TINY, "links.dropout.p=0.3", "dp.sigma=0.5,1.0", "seed=0,1", "hydra/launcher=submitit_local"]
    assert main([*argv, f"output.dir={tmp_path}", "output.name=slurm"]) == 0
    for point, alone in one_by_one.items():
        for name in TABLES:
            assert rows(tmp_path / "slurm" / point, name) == rows(alone, name), (point, name)
    assert (tmp_path / "slurm" / ".submitit").is_dir()  # submitit's job logs, beside the runs


# --- Ray (a local instance, started and stopped by the sweep's own process) -----------------------


@pytest.mark.xdist_group("ray")  # one local Ray instance at a time (tests/e2e/test_ray_launcher.py)
def test_a_ray_sweep_gives_the_tables_of_the_points_run_one_by_one(one_by_one, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="needs the [ray] extra")
    ray_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    argv = [*TINY, "links.dropout.p=0.3", "dp.sigma=0.5,1.0", "seed=0,1", f"output.dir={tmp_path}", "output.name=ray"]
    ray = [
        "hydra/launcher=ray",
        "+hydra.launcher.ray.init.num_cpus=2",
        "+hydra.launcher.ray.init.include_dashboard=false",
        f"+hydra.launcher.ray.init._temp_dir={ray_dir}",
        "+hydra.launcher.ray.remote.num_cpus=1",
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a new local instance, not a cluster
    try:
        r = subprocess.run(
            [sys.executable, "-m", "emulator", "-m", *argv, *ray], capture_output=True, text=True, timeout=600, env=env
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        for point, alone in one_by_one.items():
            for name in TABLES:
                assert rows(tmp_path / "ray" / point, name) == rows(alone, name), (point, name)
        left = subprocess.run(["pgrep", "-f", str(ray_dir)], capture_output=True, text=True).stdout.split()
        assert not left, f"Ray processes outlived the sweep: {left}"
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)


# --- Optuna (an optimising sweeper: it chooses the points) ---------------------------------------


def test_an_optuna_search_runs_its_trials_as_points_of_the_sweep(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="needs the [optuna] extra")
    search = ["dp.sigma=interval(0.5,2.0)", "dp.tau=range(1,4)", "budget.bytes=2e5", "hydra/sweeper=optuna"]
    optuna = ["hydra.sweeper.direction=maximize", "hydra.sweeper.n_trials=3", "hydra.sweeper.sampler.seed=0"]
    assert main(["-m", *TINY, *search, *optuna, f"output.dir={tmp_path}", "output.name=opt"]) == 0
    runs = sweep_record(tmp_path / "opt")
    assert len(runs) == 3 and all(r["status"] == "complete" and r["ran"] for r in runs.values())
    for path, record in runs.items():
        assert path == f"dp.sigma={record['overrides']['dp.sigma']}/dp.tau={record['overrides']['dp.tau']}/seed=0"
        scenario = json.loads((tmp_path / "opt" / path / "run.json").read_text())["scenario"]
        assert 0.5 <= scenario["dp"]["sigma"] <= 2.0 and scenario["dp"]["tau"] in (1, 2, 3)
    best = yaml.safe_load((tmp_path / "opt" / "optimization_results.yaml").read_text())
    accuracy = {p: rows(tmp_path / "opt" / p, "rounds")[-1]["test_accuracy"] for p in runs}
    assert best["best_value"] == max(accuracy.values())  # the objective: a point's final test accuracy

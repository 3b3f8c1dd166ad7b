"""Kill the server with SIGKILL mid-run, resume, and get exactly the uninterrupted run's tables."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from emulator import checkpoint
from emulator.__main__ import main
from emulator.config import load
from emulator.results import read_table
from emulator.run import run
from tests.conftest import gone, rows

ROOT = Path(__file__).resolve().parents[2]
# ALI-DPFL (policy state: tau, mu, k, t; RDP ledgers) over Gilbert-Elliott links (link state).
SCENARIO = [
    "policy=ali_dpfl",
    "ali_dpfl.gamma=10",
    "dp.q=0.1",
    "dp.sigma=1.5",
    "dp.epsilon=3",
    "dp.tau=2",
    "budget.rounds=30",
    "clients.n=6",
    "data.samples_per_client=60",
    "workers=2",
    "output.progress=false",
    "links.dropout.model=gilbert_elliott",
    "links.dropout.p_good_to_bad=0.3",
    "links.dropout.loss_bad=0.7",
    "round.deadline_s=2",
]
KILL_ROUNDS = sorted(np.random.default_rng(7).choice(np.arange(2, 26), size=3, replace=False).tolist())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run(load(None, [*SCENARIO, f"output.dir={tmp_path_factory.mktemp('ref')}", "output.name=ref"]))


@pytest.mark.parametrize("kill_round", KILL_ROUNDS)
def test_resume_after_sigkill_gives_the_uninterrupted_tables(reference, tmp_path, kill_round):
    cmd = [sys.executable, "-m", "emulator", *SCENARIO, f"output.dir={tmp_path}", "output.name=killed"]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = tmp_path / "killed"
    deadline = time.monotonic() + 120
    while not (run_dir / "rounds" / f"round-{kill_round:06d}.parquet").exists():
        assert server.poll() is None and time.monotonic() < deadline, "the run ended before the kill point"
        time.sleep(0.01)
    server.send_signal(signal.SIGKILL)
    server.wait()
    m = json.loads((run_dir / "run.json").read_text())
    assert m["status"] == "running"
    killed_at = len(read_table(run_dir, "rounds"))
    assert kill_round < killed_at + 1 < 30
    # the orphaned workers notice their server is gone
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in m["workers"].values()):
        assert time.monotonic() < deadline, "workers outlived their server"
        time.sleep(0.1)

    assert main(["resume", str(run_dir)]) == 0
    for name in ("rounds", "client_rounds", "events"):
        assert rows(run_dir, name) == rows(reference, name), name
    m = json.loads((run_dir / "run.json").read_text())
    assert m["status"] == "complete" and len(m["resumed"]) == 1
    assert m["privacy"] == json.loads((reference / "run.json").read_text())["privacy"]


def test_resume_refuses_a_complete_run_and_a_directory_without_a_run(reference, tmp_path, capsys):
    assert main(["resume", str(reference)]) == 2
    assert "already complete" in capsys.readouterr().err
    assert main(["resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_checkpoint_round_trip_is_exact(tmp_path):
    weights = {"w": np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32), "b": np.zeros(2, np.float64)}
    state = {"next_round": 4, "now": 12.5, "policy": {"mu": None, "best": float("inf"), "sigmas": [0.1, 1 / 3]}}
    checkpoint.save(tmp_path, weights, checkpoint.snapshot(state))
    w, s = checkpoint.load(tmp_path)
    assert s == state and w.keys() == weights.keys()
    assert all(np.array_equal(w[k], weights[k]) and w[k].dtype == weights[k].dtype for k in w)
    assert not list(tmp_path.glob("*.tmp"))


# --- runs stranded before their first checkpoint, and damaged checkpoints ------------------


def stranded_copy(reference: Path, tmp_path: Path, status: str = "running") -> Path:
    """The reference run's directory as a kill would have left it: status not complete."""
    d = tmp_path / "stranded"
    shutil.copytree(reference, d)
    m = json.loads((d / "run.json").read_text())
    (d / "run.json").write_text(json.dumps({**m, "status": status}))
    return d


def assert_same_tables(run_dir: Path, reference: Path) -> None:
    for name in ("rounds", "client_rounds", "events"):
        assert rows(run_dir, name) == rows(reference, name), name
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"


def test_a_run_killed_during_start_up_resumes_from_round_0(reference, tmp_path):
    cmd = [sys.executable, "-m", "emulator", *SCENARIO, f"output.dir={tmp_path}", "output.name=killed"]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = tmp_path / "killed"
    deadline = time.monotonic() + 120
    while not (run_dir / "run.json").exists():
        assert server.poll() is None and time.monotonic() < deadline, "the run ended before the kill point"
        time.sleep(0.01)
    server.send_signal(signal.SIGKILL)
    server.wait()
    assert not (run_dir / checkpoint.FILE).exists()
    assert main(["resume", str(run_dir)]) == 0
    assert_same_tables(run_dir, reference)
    assert [r["at_round"] for r in json.loads((run_dir / "run.json").read_text())["resumed"]] == [0]


def test_a_run_killed_during_round_0s_writes_resumes_from_round_0(reference, tmp_path):
    run_dir = stranded_copy(reference, tmp_path)
    for f in (checkpoint.FILE, checkpoint.PREVIOUS):
        (run_dir / f).unlink()
    for f in run_dir.glob("*/round-*.parquet"):  # round 0's rounds row was written, nothing after it
        if not (f.parent.name == "rounds" and f.name == "round-000000.parquet"):
            f.unlink()
    assert main(["resume", str(run_dir)]) == 0
    assert_same_tables(run_dir, reference)


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else data[:100] + b"\xff" * 64 + data[164:])


@pytest.mark.parametrize("how", ["truncated", "corrupted"])
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(reference, tmp_path, how, caplog):
    run_dir = stranded_copy(reference, tmp_path, status="interrupted")
    damage(run_dir / checkpoint.FILE, how)
    assert main(["resume", str(run_dir)]) == 0
    assert "checkpoint.npz is unreadable" in caplog.text and "continuing from checkpoint.prev.npz" in caplog.text
    assert_same_tables(run_dir, reference)
    last = len(read_table(reference, "rounds")) - 1  # redone from the checkpoint before the damaged one
    assert [r["at_round"] for r in json.loads((run_dir / "run.json").read_text())["resumed"]] == [last]


def test_with_no_readable_checkpoint_resume_is_one_line_and_leaves_the_run_as_it_was(reference, tmp_path, capsys):
    run_dir = stranded_copy(reference, tmp_path, status="interrupted")
    damage(run_dir / checkpoint.FILE, "truncated")
    damage(run_dir / checkpoint.PREVIOUS, "corrupted")
    before = (run_dir / "run.json").read_text()
    assert main(["resume", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {run_dir}: no readable checkpoint"), err
    assert (run_dir / "run.json").read_text() == before


def test_each_checkpoint_keeps_the_one_before(tmp_path):
    for rnd in range(3):
        checkpoint.save(tmp_path, {"w": np.full(2, rnd, np.float32)}, checkpoint.snapshot({"next_round": rnd + 1}))
    assert checkpoint.load(tmp_path)[1] == {"next_round": 3}
    (tmp_path / checkpoint.FILE).unlink()  # a kill between the two renames
    assert checkpoint.load(tmp_path)[1] == {"next_round": 2}

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

from emulator.__main__ import main
from emulator.config import load
from emulator.output import checkpoint
from emulator.output.results import read_table
from emulator.run.lifecycle import run
from tests.conftest import FAST, gone, killed_after_round, rows

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
KILL_ROUNDS = sorted(np.random.default_rng(7).choice(np.arange(2, 14), size=3, replace=False).tolist())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = run(load(None, [*SCENARIO, f"output.dir={tmp_path_factory.mktemp('ref')}", "output.name=ref"]))
    assert len(read_table(run_dir, "rounds")) > max(KILL_ROUNDS) + 1, "the scenario ends before a kill round"
    return run_dir


@pytest.mark.parametrize("kill_round", KILL_ROUNDS)
def test_resume_after_sigkill_gives_the_uninterrupted_tables(reference, tmp_path, kill_round):
    run_dir = tmp_path / "killed"
    killed_after_round([*SCENARIO, f"output.dir={tmp_path}", "output.name=killed"], run_dir, kill_round)
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
    for name in ("rounds", "client_rounds", "events", "privacy"):
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
    w, s = checkpoint._read(tmp_path / checkpoint.FILE)
    assert s == {**state, checkpoint.VERSION_KEY: checkpoint.FORMAT_VERSION} and w.keys() == weights.keys()
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
    assert "checkpoint.npz cannot be used" in caplog.text and "continuing from checkpoint.prev.npz" in caplog.text
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
    assert len(err) == 1 and err[0].startswith(f"error: {run_dir}: no usable checkpoint"), err
    assert (run_dir / "run.json").read_text() == before


def test_each_checkpoint_keeps_the_one_before(tmp_path):
    run = checkpoint.Expected(3, 1, {"w": (2,)}, rounds_on_disk={0, 1, 2}, load_policy=lambda state: None)
    for rnd in range(3):
        state = {"next_round": rnd + 1, "now": float(rnd), "bytes_spent": 0, "links_bad": [], "policy": {}}
        checkpoint.save(tmp_path, {"w": np.full(2, rnd, np.float32)}, checkpoint.snapshot(state))
    assert checkpoint.load(tmp_path, run)[1]["next_round"] == 3
    (tmp_path / checkpoint.FILE).unlink()  # a kill between the two renames
    assert checkpoint.load(tmp_path, run)[1]["next_round"] == 2


# --- checkpoints that read fine but do not fit the run (checkpoint.validate) ---------------


def edit(path: Path, change) -> None:
    """Rewrite the checkpoint at `path` (save()'s) with change(weights, state) applied."""
    weights, state = checkpoint._read(path)
    change(weights, state)
    blob = np.frombuffer(json.dumps(state).encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **weights, **{checkpoint.STATE_KEY: blob})


def beyond_the_rows(w, s):
    s["next_round"] += 2


def ledger_of_a_seventh_client(w, s):
    s["policy"]["accountant"]["ledgers"]["6"] = {"entries": []}


# each: (the damage, what the one line names)
DAMAGES = {
    "missing state key": (lambda w, s: s.pop("bytes_spent"), "state keys: missing ['bytes_spent']"),
    "wrong tensor shape": (
        lambda w, s: w.update({"fc.weight": w["fc.weight"][:, :-1]}),
        "tensor fc.weight: float32 (10, 59), expected float32 (10, 60)",
    ),
    "extra tensor": (lambda w, s: w.update({"fc2.bias": w["fc.bias"]}), "tensors: unexpected ['fc2.bias']"),
    "missing tensor": (lambda w, s: w.pop("fc.bias"), "tensors: missing ['fc.bias']"),
    "next_round past the budget": (
        lambda w, s: s.update(next_round=31),
        "next_round = 31, expected an integer in [1, 30]",
    ),
    "next_round beyond the rows on disk": (beyond_the_rows, "but the rounds table lacks"),
    "non-finite now": (lambda w, s: s.update(now=float("inf")), "now = inf"),
    "a NaN weight": (
        lambda w, s: w["fc.weight"].__setitem__((0, 0), np.nan),
        "tensor fc.weight: non-finite values (1 of 600, the first nan), expected finite",
    ),
    "policy state without a key": (lambda w, s: s["policy"]["policy"].pop("tau"), "policy: ValueError: ali_dpfl"),
    "privacy ledger of a client the run lacks": (
        ledger_of_a_seventh_client,
        "policy: ValueError: accountant.ledgers: expected a map of client id (below 6, clients.n) to history",
    ),
    "no format version": (lambda w, s: s.pop(checkpoint.VERSION_KEY), "format_version = none, expected 3"),
    "another format version": (lambda w, s: s.update(format_version=0), "format_version = 0, expected 3"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_checkpoint_that_does_not_fit_the_run_falls_back_to_the_previous_one(reference, tmp_path, damage, caplog):
    change, named = DAMAGES[damage]
    run_dir = stranded_copy(reference, tmp_path, status="interrupted")
    last = len(read_table(reference, "rounds")) - 1
    assert last + 2 <= 30  # the reference stops early: beyond_the_rows claims unplayed rounds within the budget
    edit(run_dir / checkpoint.FILE, change)
    assert main(["resume", str(run_dir)]) == 0
    assert "checkpoint.npz cannot be used (checkpoint.npz: " in caplog.text and named in caplog.text
    assert f"continuing from checkpoint.prev.npz (round {last})" in caplog.text
    assert_same_tables(run_dir, reference)
    assert [r["at_round"] for r in json.loads((run_dir / "run.json").read_text())["resumed"]] == [last]


def files(run_dir: Path) -> dict[str, bytes]:
    """Every file in the run directory but the lock (which records the pid of whoever holds it)."""
    return {
        str(f.relative_to(run_dir)): f.read_bytes() for f in run_dir.rglob("*") if f.is_file() and f.name != ".lock"
    }


@pytest.mark.parametrize("damage", DAMAGES)
def test_with_neither_checkpoint_fitting_resume_is_one_line_and_changes_nothing(reference, tmp_path, damage):
    change, named = DAMAGES[damage]
    run_dir = stranded_copy(reference, tmp_path, status="interrupted")
    for f in (checkpoint.FILE, checkpoint.PREVIOUS):
        edit(run_dir / f, change)
    before = files(run_dir)
    out = subprocess.run(
        [sys.executable, "-m", "emulator", "resume", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(err) == 1, out.stderr
    newest, previous = err[0].split("; checkpoint.prev.npz: ")
    assert newest.startswith(f"error: {run_dir}: no usable checkpoint (checkpoint.npz: ") and named in newest, err
    assert named in previous, err
    after = files(run_dir)
    assert after["run.json"] == before["run.json"]
    assert after == before


def test_a_run_whose_rounds_table_lacks_a_round_it_played_is_failed_not_complete(tmp_path, monkeypatch, capsys):
    from emulator.output import results

    real = results.RunWriter.write_round

    def write_round(self, rnd, rows):  # round 1's rounds row is lost, as if its file had been removed
        real(self, rnd, {k: v for k, v in rows.items() if not (rnd == 1 and k == "rounds")})

    monkeypatch.setattr(results.RunWriter, "write_round", write_round)
    assert main([*FAST, "budget.rounds=3", f"output.dir={tmp_path}", "output.name=lost"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lacks 1 of the rounds 0-2 the run played (the first: 1)" in err[0], err
    m = json.loads((tmp_path / "lost" / "run.json").read_text())
    assert m["status"] == "failed" and "not marking it complete" in m["error"]

"""Worker faults: crashes, hangs, silence, restarts, and shutting everything down (Ctrl-C included)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.output.results import read_table
from nodes.transport.pool import WorkerPool
from tests.conftest import FAST, rows, sigint_as_in_a_terminal
from tests.faulty_worker import COMMAND as FAULTY_WORKER

ROOT = Path(__file__).resolve().parents[2]


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def by_task(run_dir: Path) -> dict:
    return {(r["round"], r["client"]): r for r in rows(run_dir, "client_rounds")}


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited child nobody has waited for yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.05)


def emulator_cli(
    tmp_path: Path, *overrides: str, env: dict | None = None, module: str = "emulator"
) -> subprocess.Popen:
    """`python -m emulator` (or `module`) on the FAST scenario in its own process; output in tmp_path/run."""
    with open(tmp_path / "console.log", "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", module, *FAST, f"output.dir={tmp_path}", "output.name=run", *overrides],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=sigint_as_in_a_terminal,
        )


def test_a_worker_stuck_in_training_is_timed_out_and_replaced(emulate, monkeypatch, faulty_workers):
    # The stuck worker still heartbeats (its network thread is fine): only the task timeout catches it.
    monkeypatch.setenv("DPFL_FAULT_HANG_AT", "1:2")
    run = emulate("budget.rounds=3", "transport.worker_timeout_s=5")
    cr = by_task(run)
    assert cr[(1, 2)]["outcome"] == "failed" and "no reply within transport.worker_timeout_s" in cr[(1, 2)]["failure"]
    assert [r["failed"] for r in rows(run, "rounds")] == [0, 1, 0]
    t = manifest(run)["transport"]
    assert t["death_causes"] == {"hung": 1} and t["restarts"] == 1 and t["retired_slots"] == []


def test_a_remote_worker_that_goes_silent_is_dead_after_missed_heartbeats(emulate, monkeypatch, tmp_path):
    from nodes.contracts.keys import keygen
    from tests.e2e.test_security import free_address

    address, keys = free_address(), tmp_path / "keys"
    keygen(keys)
    # frozen (SIGSTOP) at its first task: no reply, no heartbeat, and no process the server could watch
    hand = subprocess.Popen(
        [*FAULTY_WORKER, "--connect", address, "--id", "by-hand", "--keys", str(keys)],
        cwd=ROOT,
        env={**os.environ, "DPFL_FAULT_STOP_AT": "*:*"},
    )

    class WaitsForTheRemote(WorkerPool):  # so that it deterministically takes the first task
        def wait_ready(self, timeout_s=300.0):
            super().wait_ready(timeout_s)
            deadline = time.monotonic() + 120
            while not any(w.ready for w in self.workers.values() if w.proc is None):
                assert time.monotonic() < deadline, "the remote worker never got ready"
                self._poll(0.1)

    monkeypatch.setattr("emulator.run.lifecycle.WorkerPool", WaitsForTheRemote)
    try:
        started = time.monotonic()
        run = emulate(
            f"transport.address={address}",
            f"transport.keys_dir={keys}",
            "workers=1",
            "transport.heartbeat_s=0.3",
            "budget.rounds=2",
        )
        assert time.monotonic() - started < 60  # not worker_timeout_s (600 s)
    finally:
        hand.kill()
        hand.wait()
    cr = by_task(run)
    assert cr[(0, 0)]["outcome"] == "failed" and "silent for" in cr[(0, 0)]["failure"]
    assert [r["failed"] for r in rows(run, "rounds")] == [1, 0]
    t = manifest(run)["transport"]
    assert t["death_causes"] == {"silent": 1} and t["restarts"] == 0


def test_a_slot_out_of_restarts_is_retired_and_the_other_workers_finish_the_run(emulate, monkeypatch, faulty_workers):
    monkeypatch.setenv("DPFL_FAULT_KILL_AT", "1:2")
    run = emulate("budget.rounds=4", "transport.max_restarts=0")
    cr = by_task(run)
    assert cr[(1, 2)]["outcome"] == "failed" and "died" in cr[(1, 2)]["failure"]
    assert [r["failed"] for r in rows(run, "rounds")] == [0, 1, 0, 0]
    m = manifest(run)
    assert m["status"] == "complete"
    t = m["transport"]
    assert t["worker_deaths"] == 1 and t["restarts"] == 0 and len(t["retired_slots"]) == 1
    assert len(m["workers"]) == 2 and not any(running(p) for p in m["workers"].values())


def test_repeated_crashes_are_capped_and_the_run_fails_clearly(tmp_path):
    # client 2 kills whichever worker trains it, every round: slot 0 crashes 3 times, 2 restarts allowed
    proc = emulator_cli(
        tmp_path,
        "workers=1",
        "budget.rounds=5",
        "transport.max_restarts=2",
        env={"DPFL_FAULT_KILL_AT": "*:2"},
        module="tests.faulty_emulator",
    )
    assert proc.wait(timeout=300) == 1
    console = (tmp_path / "console.log").read_text()
    assert "error: no workers left" in console and "transport.max_restarts = 2" in console
    m = manifest(tmp_path / "run")
    assert m["status"] == "failed" and "no workers left" in m["error"]
    t = m["transport"]
    assert (t["worker_deaths"], t["restarts"], t["retired_slots"], t["death_causes"]) == (3, 2, [0], {"died": 3})
    assert [r["round"] for r in rows(tmp_path / "run", "rounds")] == [0, 1]  # completed rounds are kept
    assert len(m["workers"]) == 3 and not any(running(p) for p in m["workers"].values())


def test_an_exception_in_the_server_shuts_every_worker_down(emulate, monkeypatch, tmp_path):
    class Failing(WorkerPool):
        def run_tasks(self, rnd, frames, meanwhile=None):
            if rnd == 1:
                raise RuntimeError("boom")
            return super().run_tasks(rnd, frames, meanwhile)

    monkeypatch.setattr("emulator.run.lifecycle.WorkerPool", Failing)
    with pytest.raises(RuntimeError, match="boom"):
        emulate("budget.rounds=3")
    m = manifest(tmp_path / "run0")
    assert m["status"] == "failed" and "boom" in m["error"]
    assert len(m["workers"]) == 2 and not any(running(p) for p in m["workers"].values())


STOP_S = 60


def test_ctrl_c_stops_server_and_workers_and_keeps_completed_rounds(tmp_path):
    proc = emulator_cli(tmp_path, "budget.rounds=50", "dp.tau=100")
    run = tmp_path / "run"
    try:
        wait_until(lambda: len(list((run / "rounds").glob("*.parquet"))) >= 2, 240, "two completed rounds")
        workers = manifest(run)["workers"]
        proc.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        # ~1 s on a quiet machine, 2.5 s beside 4 busy loops on 2 cores: a bound that catches a hang
        assert proc.wait(timeout=STOP_S) == 130
        wait_until(
            lambda: not any(running(p) for p in workers.values()),
            STOP_S - (time.monotonic() - interrupted),
            "the workers to exit",
        )
    finally:
        proc.kill()
    m = manifest(run)
    assert m["status"] == "interrupted" and len(workers) == 2
    done = [r["round"] for r in read_table(run, "rounds").to_pylist()]
    assert len(done) >= 2 and done == list(range(len(done))) and len(done) < 50
    assert "interrupted; completed rounds are on disk" in (tmp_path / "console.log").read_text()


# --- resource guards ---------------------------------------------------------------------


def test_a_scenario_too_big_for_memory_fails_up_front_with_the_estimate(tmp_path, capsys):
    from emulator.__main__ import main as cli_main

    code = cli_main(
        ["clients.n=100000", "data.samples_per_client=1000", "data.dim=5000", "workers=2", f"output.dir={tmp_path}"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "estimated memory" in err and "GiB available" in err and "2 workers" in err
    assert not any(tmp_path.iterdir())


def test_disk_full_while_writing_results_is_a_clear_error_and_keeps_completed_rounds(emulate, monkeypatch):
    import errno

    import pyarrow.parquet as pq

    from emulator.output import results
    from emulator.output.results import ResultsWriteError

    real = pq.write_table

    def write_table(table, where, **kw):
        if "round-000002" in str(where):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(table, where, **kw)

    monkeypatch.setattr(results.pq, "write_table", write_table)
    with pytest.raises(ResultsWriteError, match=r"No space left on device.*rounds 0-1 are complete") as e:
        emulate("budget.rounds=4")
    run_dir = Path(str(e.value).split("resume ")[1].rstrip(")"))
    assert [r["round"] for r in read_table(run_dir, "rounds").to_pylist()] == [0, 1]
    assert not list((run_dir / "rounds").glob("*.tmp"))
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"


def test_a_disk_that_fills_mid_run_fails_it_in_one_line_with_run_json_failed_and_no_temporaries(tmp_path):
    """A real full disk (a 40 MiB tmpfs, in a mount namespace of its own, filled once round 2 is on disk):
    one line, exit 1, run.json `failed` with the reason (written into the room the run kept for it), no
    temporary file or reserve left, the completed rounds readable."""
    if not shutil.which("unshare"):
        pytest.skip("needs unshare(1)")
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    run = f"{disk}/runs/run"
    args = " ".join([*FAST, "budget.rounds=100000", f"output.dir={disk}/runs", "output.name=run"])
    script = (
        f"mount -t tmpfs -o size=40m tmpfs {disk} || exit 99; cd {ROOT}; "
        f"{sys.executable} -m emulator {args} 2>{out}/stderr & p=$!; "
        f"while [ ! -e {run}/rounds/round-000002.parquet ] && kill -0 $p 2>/dev/null; do sleep 0.05; done; "
        f"cat /dev/zero > {disk}/filler 2>/dev/null; wait $p; echo $? > {out}/rc; "
        f"rm {disk}/filler; cp -a {run} {out}/run"  # the tmpfs goes with the namespace
    )
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=240)
    if r.returncode == 99:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    err, rc = (out / "stderr").read_text(), int((out / "rc").read_text())
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert err.startswith("error: cannot write ") and "No space left on device" in err, err
    done = int(re.search(r"rounds 0-(\d+) are complete on disk", err).group(1)) + 1
    m = manifest(out / "run")
    assert m["status"] == "failed" and m["error"] == "ResultsWriteError: " + err.removeprefix("error: ").strip()
    assert not list((out / "run").rglob("*.tmp")) and not (out / "run" / ".reserve").exists()
    rounds = [r["round"] for r in read_table(out / "run", "rounds").to_pylist()]  # the round cut short may have
    assert rounds[:done] == list(range(done)) and len(rounds) <= done + 1 and done >= 3  # one table's rows


def test_a_full_disk_under_the_checkpoint_is_one_line_too(emulate, monkeypatch):
    """Not only the tables' writer: a checkpoint cut short by a full disk is the same one-line error, its
    temporary removed."""
    import errno

    from emulator.output import checkpoint
    from emulator.output.results import ResultsWriteError

    real = checkpoint.save

    def save(run_dir, weights, state):
        if json.loads(state)["next_round"] == 3:
            (run_dir / f"{checkpoint.FILE}.tmp").write_bytes(b"torn")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(run_dir, weights, state)

    monkeypatch.setattr(checkpoint, "save", save)
    with pytest.raises(ResultsWriteError, match=r"No space left on device; rounds 0-2 are complete on disk") as e:
        emulate("budget.rounds=5")
    run_dir = Path(str(e.value).split("resume ")[1].rstrip(")"))
    m = manifest(run_dir)
    assert m["status"] == "failed" and m["error"] == f"ResultsWriteError: {e.value}"
    assert not list(run_dir.rglob("*.tmp")) and not (run_dir / ".reserve").exists()


# --- the evaluator process killed from outside -------------------------------------------

# Each evaluation takes much longer than a round's training (thousands of test samples, one at a time),
# so that a kill as a round's rows appear lands in the next round's evaluation.
SLOW_EVALUATION = ["data.samples_per_client=2000", "data.test_fraction=0.97", "dp.batch_eval=1"]


def kill_the_evaluator_after_round(proc: subprocess.Popen, run_dir: Path, rnd: int) -> int:
    """Once round `rnd`'s rows are written (by then run.json names the evaluator's process), SIGKILL
    the evaluator, as the OOM killer would; its pid."""
    wait_until(
        lambda: (run_dir / "rounds" / f"round-{rnd:06d}.parquet").exists() or proc.poll() is not None,
        240,
        f"round {rnd}'s rows",
    )
    assert proc.poll() is None, "the run ended before the kill"
    pid = manifest(run_dir)["evaluator"]["evaluator.0"]
    os.kill(pid, signal.SIGKILL)
    return pid


def test_an_evaluator_killed_mid_run_is_restarted_and_the_run_ends_with_the_uninterrupted_tables(tmp_path):
    from emulator.__main__ import main

    scenario = [*SLOW_EVALUATION, "budget.rounds=6"]
    assert main([*FAST, *scenario, f"output.dir={tmp_path}", "output.name=reference"]) == 0
    proc = emulator_cli(tmp_path, *scenario)
    run = tmp_path / "run"
    try:
        killed = kill_the_evaluator_after_round(proc, run, 1)
        assert proc.wait(timeout=300) == 0
    finally:
        proc.kill()
    for name in ("rounds", "client_rounds", "events"):
        assert rows(run, name) == rows(tmp_path / "reference", name), name
    m = manifest(run)
    (death,) = m["transport"]["evaluator_deaths"]
    assert (death["process"], death["pid"], death["exit"], death["signal"], death["restarted"]) == (
        "evaluator.0",
        killed,
        -9,
        "SIGKILL",
        True,
    )
    assert 1 < death["round"] < 6  # the first evaluation asked for after the kill
    assert m["status"] == "complete" and m["evaluator"].keys() == {"evaluator.0", "evaluator.1"}
    assert not any(running(p) for p in m["evaluator"].values())
    console = (tmp_path / "console.log").read_text()
    assert f"for round {death['round']}: restarted (1 of transport.max_restarts = 3)" in console


def test_an_evaluator_killed_with_no_restarts_allowed_fails_the_run_in_one_line_and_keeps_its_rounds(tmp_path):
    cmd = [*FAST, *SLOW_EVALUATION, "budget.rounds=50", "transport.max_restarts=0"]
    with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "emulator", *cmd, f"output.dir={tmp_path}", "output.name=run"],
            cwd=ROOT,
            stdout=out,
            stderr=err,
        )
    run = tmp_path / "run"
    try:
        kill_the_evaluator_after_round(proc, run, 1)
        assert proc.wait(timeout=300) == 1
    finally:
        proc.kill()
    (line,) = (tmp_path / "stderr").read_text().splitlines()
    error = re.fullmatch(
        r"error: (the evaluator process ended \(exit -9\) before its evaluation, for round (\d+): "
        r"not restarted \(transport.max_restarts = 0\))",
        line,
    )
    assert error, line
    assert (tmp_path / "stdout").read_text() == ""
    m = manifest(run)
    failed_at = int(error[2])
    assert m["status"] == "failed" and m["error"] == f"EvaluatorError: {error[1]}"
    assert [(d["round"], d["restarted"]) for d in m["transport"]["evaluator_deaths"]] == [(failed_at, False)]
    assert 1 < failed_at < 50 and [r["round"] for r in rows(run, "rounds")] == list(range(failed_at))
    assert not any(running(p) for p in [*m["workers"].values(), *m["evaluator"].values()])

"""Signals a real `python -m emulator` gets from a terminal or a batch scheduler."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.output.results import read_table
from tests.conftest import FAST
from tests.e2e.test_faults import running, wait_until

ROOT = Path(__file__).resolve().parents[2]


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def start(tmp_path: Path, *overrides: str) -> subprocess.Popen:
    """The emulator in a session of its own, as a scheduler starts a job; output in tmp_path/run."""
    with open(tmp_path / "console.log", "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "emulator", *FAST, f"output.dir={tmp_path}", "output.name=run", *overrides],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def rounds_on_disk(run_dir: Path) -> int:
    return len(list((run_dir / "rounds").glob("*.parquet")))


@pytest.mark.parametrize("to", ["server", "process_group"])
def test_sigterm_stops_the_run_like_ctrl_c(tmp_path, to):
    # `kill PID` signals the server alone; a batch scheduler signals the whole job (the workers too)
    proc = start(tmp_path, "budget.rounds=50", "dp.tau=100")
    run = tmp_path / "run"
    try:
        wait_until(lambda: (run / "rounds").is_dir() and rounds_on_disk(run) >= 2, 240, "two completed rounds")
        workers = manifest(run)["workers"]
        (os.kill if to == "server" else os.killpg)(proc.pid, signal.SIGTERM)
        terminated = time.monotonic()
        assert proc.wait(timeout=10) == 143
        wait_until(
            lambda: not any(running(p) for p in workers.values()),
            10 - (time.monotonic() - terminated),
            "the workers to exit",
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    m = manifest(run)
    assert m["status"] == "interrupted" and len(workers) == 2
    done = [r["round"] for r in read_table(run, "rounds").to_pylist()]
    assert len(done) >= 2 and done == list(range(len(done))) and len(done) < 50
    assert m["transport"]["worker_deaths"] == 0  # shut down by the server, not killed by the signal
    console = (tmp_path / "console.log").read_text()
    assert "terminated; completed rounds are on disk" in console
    assert f"python -m emulator resume {run}" in console  # the summary's last line


def test_a_sigterm_a_library_turns_into_a_plain_keyboard_interrupt_still_exits_143(capsys):
    """Ray's blocking calls (ray.wait, ray.get) catch the SIGTERM handler's exception and raise a plain
    KeyboardInterrupt in its place (its _raylet.check_signals): a scheduler's stop of a run on Ray
    exited 130, as if interrupted by Ctrl-C."""
    from emulator.__main__ import _execute

    def start_blocked_in_a_library():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # the handler raises here
        except KeyboardInterrupt:
            raise KeyboardInterrupt from None  # what Ray raises, the handler's exception gone

    assert _execute(start_blocked_in_a_library) == 143
    assert "terminated; completed rounds are on disk" in capsys.readouterr().err

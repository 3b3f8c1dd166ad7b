"""One run directory, one writer; a transport address that cannot be bound leaves no run behind."""

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from emulator.__main__ import main as cli
from tests.conftest import FAST, sigint_as_in_a_terminal
from tests.e2e.test_faults import wait_until

ROOT = Path(__file__).resolve().parents[2]


def emulator(tmp_path: Path, log: str, *args: str) -> subprocess.Popen:
    with open(tmp_path / log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "emulator", *args],
            cwd=ROOT,
            stdout=out,
            stderr=out,
            preexec_fn=sigint_as_in_a_terminal,  # stopped with SIGINT
        )


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def test_two_runs_with_the_same_name_started_together_one_is_refused(tmp_path):
    args = [*FAST, "budget.rounds=6", f"output.dir={tmp_path}", "output.name=same"]
    first, second = emulator(tmp_path, "a.log", *args), emulator(tmp_path, "b.log", *args)
    codes = sorted([first.wait(timeout=300), second.wait(timeout=300)])
    assert codes == [0, 2]
    refused = next(tmp_path / log for log, p in (("a.log", first), ("b.log", second)) if p.returncode == 2)
    err = refused.read_text().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "same" in err[0], err
    assert status(tmp_path / "same")["status"] == "complete"


def test_a_second_resume_of_the_same_run_is_refused_while_the_first_runs(tmp_path):
    run_dir = tmp_path / "run"
    killed = emulator(
        tmp_path, "killed.log", *FAST, "budget.rounds=40", "dp.tau=50", f"output.dir={tmp_path}", "output.name=run"
    )
    wait_until(lambda: (run_dir / "checkpoint.npz").exists(), 240, "a first checkpoint")
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    first = emulator(tmp_path, "first.log", "resume", str(run_dir))
    try:
        wait_until(lambda: len(status(run_dir).get("resumed", [])) == 1, 120, "the first resume to start")
        second = subprocess.run(
            [sys.executable, "-m", "emulator", "resume", str(run_dir)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2
        err = second.stderr.splitlines()
        assert len(err) == 1 and "another process is writing this run" in err[0], err
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=60)
    assert len(status(run_dir)["resumed"]) == 1  # the refused one wrote nothing


def busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize(
    "address, why",
    [
        ("tcp://127.0.0.1:99999", "PORT in 1..65535"),
        ("tcp://127.0.0.1:busy", "Address already in use"),
        ("ipc:///nonexistent-dpfl-dir/s.sock", "the directory /nonexistent-dpfl-dir does not exist"),
    ],
)
def test_an_address_that_cannot_be_bound_is_one_line_and_no_run_directory(tmp_path, capsys, address, why):
    with busy_port() as s:
        address = address.replace("busy", str(s.getsockname()[1]))
        code = cli([*FAST, f"output.dir={tmp_path / 'out'}", "output.name=x", f"transport.address={address}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"error: transport.address = '{address}': ") and why in err[0], err
    assert not (tmp_path / "out" / "x").exists()

"""Local workers forked from one zygote (nodes/zygote.py): they become the server's own children,
their deaths are seen with their exit status and restarted, and none outlives a pool closed early."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.config import load
from nodes.pool import WorkerPool
from nodes.schema import to_dict
from nodes.zygote import ForkedWorker, Zygote
from tests.conftest import gone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote needs Linux's subreaper")

REPO = Path(__file__).resolve().parents[2]
PR_GET_CHILD_SUBREAPER = 37  # linux/prctl.h


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def command_of(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


ENV = dict(os.environ, PYTHONPATH=str(REPO))


def waiting_worker(tmp_path: Path, name: str) -> list[str]:
    """A worker's arguments for a server that never answers: it waits until killed."""
    return ["--connect", f"ipc://{tmp_path}/nobody.sock", "--id", name, "--parent", str(os.getpid())]


@pytest.fixture
def pool(tmp_path):
    p = WorkerPool(f"ipc://{tmp_path}/s.sock", load(None, []).transport)
    yield p
    p.close()


def test_local_workers_are_forked_from_one_zygote_and_become_the_servers_children(pool):
    pool.set_up(to_dict(load(None, ["clients.n=4"])))
    pool.start(2)
    pool.wait_ready()
    assert pool.zygote is not None and pool.zygote.proc.poll() == 0  # it forked both and ended
    pids = list(pool.pids().values())
    assert len(pids) == 2 and pool.zygote.proc.pid not in pids
    for pid in pids:
        assert "nodes.zygote" in command_of(pid)  # forked, not started afresh: torch was imported once
        assert parent_of(pid) == os.getpid()  # handed to us by the kernel (subreaper)
    assert not is_subreaper()  # no longer: orphans of anything else we start are not ours to keep


def is_subreaper() -> bool:
    flag = ctypes.c_int()
    assert ctypes.CDLL(None).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0
    return bool(flag.value)


def test_a_forked_worker_that_dies_is_seen_with_its_signal_and_restarted_as_a_process_of_its_own(pool):
    pool.set_up(to_dict(load(None, ["clients.n=4"])))
    pool.start(2)
    pool.wait_ready()
    victim = pool.pids()["local-0.0"]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while pool.counters.worker_deaths == 0 and time.monotonic() < deadline:
        pool._reap()
        time.sleep(0.05)
    assert pool.counters.death_causes == {"died": 1} and pool.counters.restarts == 1
    assert gone(victim)  # waited for: no zombie
    pool.wait_ready(timeout_s=60)
    replacement = pool.pids()["local-0.1"]
    assert "nodes.worker" in command_of(replacement) and parent_of(replacement) == os.getpid()


def test_workers_killed_before_the_zygote_forked_them_leave_no_process(tmp_path):
    """Killed at once, while the zygote still imports torch: it ends, forking none or some, and
    every process there was is reaped."""
    zygote = Zygote([waiting_worker(tmp_path, f"w{i}") for i in range(2)], ENV, str(REPO))
    workers = [ForkedWorker(zygote, i) for i in range(2)]
    for w in workers:
        w.kill()
    codes = [w.wait(timeout=60) for w in workers]
    assert all(code != 0 for code in codes)
    assert zygote.proc.returncode == -signal.SIGTERM
    assert all(gone(pid) for pid in [zygote.proc.pid, *zygote.pids])


def test_a_forked_worker_waits_like_popen_and_is_killed_by_its_pid(tmp_path):
    zygote = Zygote([waiting_worker(tmp_path, "w")], ENV, str(REPO))
    worker = ForkedWorker(zygote, 0)
    deadline = time.monotonic() + 60
    while not zygote.exited() and time.monotonic() < deadline:  # forked, reported, and ours
        time.sleep(0.05)
    assert worker.pid is not None and worker.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        worker.wait(timeout=0.2)
    worker.kill()
    assert worker.wait(timeout=60) == -signal.SIGKILL
    assert gone(worker.pid)

"""Local workers forked from one zygote (nodes/transport/zygote.py): they become the server's own children,
their deaths are seen with their exit status and restarted, and none outlives a pool closed early."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from emulator.config import load
from nodes.contracts.schema import to_dict
from nodes.transport import zygote as zygote_module
from nodes.transport.pool import WorkerPool
from nodes.transport.zygote import ForkedWorker, Zygote, worker_env
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
    pool.set_up(to_dict(load(None, ["clients.n=4", "train.bundle=1"])))
    pool.start(2)
    pool.wait_ready()
    assert pool.zygote is not None and pool.zygote.proc.poll() == 0  # it forked both and ended
    pids = list(pool.pids().values())
    assert len(pids) == 2 and pool.zygote.proc.pid not in pids
    for pid in pids:
        assert "nodes.transport.zygote" in command_of(pid)  # forked, not started afresh: torch was imported once
        assert parent_of(pid) == os.getpid()  # handed to us by the kernel (subreaper)
    assert not is_subreaper()  # no longer: orphans of anything else we start are not ours to keep


def is_subreaper() -> bool:
    flag = ctypes.c_int()
    assert ctypes.CDLL(None).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0
    return bool(flag.value)


def test_a_forked_worker_that_dies_is_seen_with_its_signal_and_restarted_as_a_process_of_its_own(pool):
    pool.set_up(to_dict(load(None, ["clients.n=4", "train.bundle=1"])))
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
    zygote = Zygote(ENV)
    zygote.fork([waiting_worker(tmp_path, f"w{i}") for i in range(2)], {})
    workers = [ForkedWorker(zygote, i) for i in range(2)]
    for w in workers:
        w.kill()
    codes = [w.wait(timeout=60) for w in workers]
    assert all(code != 0 for code in codes)
    assert zygote.proc.returncode == -signal.SIGTERM
    assert all(gone(pid) for pid in [zygote.proc.pid, *zygote.pids])


def test_a_forked_worker_waits_like_popen_and_is_killed_by_its_pid(tmp_path):
    zygote = Zygote(ENV)
    zygote.fork([waiting_worker(tmp_path, "w")], {})
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


def test_a_forked_worker_polls_for_its_exit_as_popen_does(monkeypatch):
    """Sleeps doubling from half a millisecond to WAIT_POLL_MAX_S: a worker that exits soon after the
    run's shutdown is seen soon after, and a long wait costs few polls."""
    worker = ForkedWorker(Zygote.__new__(Zygote), 0)  # its zygote never asked: poll is the fake below
    polls = iter([*[None] * 9, 0])

    def poll() -> int | None:
        worker.returncode = next(polls)
        return worker.returncode

    slept: list[float] = []
    monkeypatch.setattr(worker, "poll", poll)
    monkeypatch.setattr(zygote_module.time, "sleep", slept.append)
    assert worker.wait(timeout=60) == 0
    assert slept == [0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05]


def test_two_threads_watching_one_zygotes_children_see_every_pid_and_exit_status():
    """The pool's thread and the evaluator's ask after their processes at once (nodes/transport/evaluator.py):
    the zygote's report is read whole, by one of them at a time."""
    zygote = Zygote(worker_env())
    n = 6
    zygote.fork([["--connect", "nowhere"]] * n, {})  # each exits at once: status 2, a bad address
    workers = [ForkedWorker(zygote, i) for i in range(n)]
    errors: list[BaseException] = []

    def watch(order: list[ForkedWorker]) -> None:
        try:
            while any(w.poll() is None for w in order):
                pass
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=watch, args=([w],)) for w in workers]  # each process watched by one
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert [w.returncode for w in workers] == [2] * n
    assert len(set(zygote.pids)) == n and all(gone(pid) for pid in zygote.pids)


def test_a_prestarted_zygote_forks_the_pools_workers(pool):
    zygote_module.prestart()
    prestarted = zygote_module._prestarted
    pool.set_up(to_dict(load(None, ["clients.n=4", "train.bundle=1"])))
    pool.start(2)
    assert pool.zygote is prestarted and zygote_module._prestarted is None
    pool.wait_ready()
    assert all("nodes.transport.zygote" in command_of(pid) for pid in pool.pids().values())


def test_a_zygote_prestarted_under_another_environment_is_ended_unused(pool, monkeypatch):
    """Hydra's hydra.job.env_set changes the environment after the CLI prestarted the zygote: the
    workers must import torch under the run's environment (OMP_NUM_THREADS, ...), not the one before."""
    zygote_module.prestart()
    prestarted = zygote_module._prestarted
    assert prestarted is not None
    monkeypatch.setenv("OMP_NUM_THREADS", "1" if os.environ.get("OMP_NUM_THREADS") != "1" else "2")
    pool.set_up(to_dict(load(None, ["clients.n=4", "train.bundle=1"])))
    pool.start(1)
    assert pool.zygote is not prestarted and prestarted.proc.returncode == -signal.SIGKILL
    assert gone(prestarted.proc.pid)
    pool.wait_ready()


# The CLI in a process of its own, counting the zygotes it starts: what happened to them as JSON.
CLI = """
import json, sys
from nodes.transport import zygote
started = []
init = zygote.Zygote.__init__
def counted(self, env):
    init(self, env)
    self.before_config = "emulator.config" not in sys.modules  # the scenario not read yet
    started.append(self)
zygote.Zygote.__init__ = counted
from emulator.__main__ import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "zygotes": [z.proc.returncode for z in started],
                  "forked": [len(z.pids) for z in started], "prestarted": [z.before_config for z in started]}))
"""


@pytest.mark.parametrize(
    "args, code, zygotes, forked",
    [
        (["workers=2", "budget.rounds=1", "clients.n=4"], 0, [0], [3]),  # forked both and the evaluator, ended
        (["clients.n=0"], 2, [-signal.SIGKILL], [0]),  # a refused scenario: killed unused
        (["--cfg", "job"], 0, [], []),  # no run: none started
    ],
)
def test_the_cli_prestarts_one_zygote_for_a_run_and_ends_it_if_unused(tmp_path, args, code, zygotes, forked):
    """Started before the scenario is read (~0.5 s of CPU), so that the workers' import of torch overlaps it."""
    out = subprocess.run(
        [sys.executable, "-c", CLI, *args, f"output.dir={tmp_path}", "output.progress=false"],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    expected = {"code": code, "zygotes": zygotes, "forked": forked, "prestarted": [True] * len(zygotes)}
    assert report == expected, out.stderr[-2000:]

"""Local workers forked from one process that has done a worker's imports (torch, the trainer):
starting N workers costs one import of torch, not N: N at once would contend for the cores
(python -m bench --only startup: a run's start against one worker's own).

    python -m nodes.transport.zygote REPORT_FD     (started by the server, not by hand)

The zygote imports, then reads one line of JSON on stdin, {"argvs": [...], "env": {...}, "open_files":
[soft, hard]}: it forks one worker per argv (each runs `nodes.worker.cli(argv)` with "env" added to its
environment, the run's CURVE keys, and the server's open files limit, as a subprocess would inherit it),
writes each child's pid to REPORT_FD and exits; at end of input, without forking.
The server is a child subreaper (Linux) while it runs, so the kernel hands the orphaned workers to
it: they are its own children from then on, waited for with their exit status like any subprocess.
`Zygote` and `ForkedWorker` are the server's side.

`python -m emulator` starts its zygote first thing (`prestart`), before it reads the scenario
(Hydra and the config), so that the workers' import of torch overlaps it; the run's pool takes
it (`take_prestarted`), or it is killed unused (`discard_prestarted`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from nodes.training.determinism import CUBLAS_WORKSPACE

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # a local worker's working directory and path
WAIT_POLL_MIN_S, WAIT_POLL_MAX_S = 0.0005, 0.05  # ForkedWorker.wait's sleeps, as subprocess.Popen.wait's


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a local worker starts with: ours, with the project on its Python path and cuBLAS's
    deterministic workspace (nodes.training.determinism) unless ours names one. Our current directory
    ends its path: a user's class named in the scenario (a dataset, a codec: nodes.contracts.plugins) is imported
    from there too, as the server imports it."""
    path = os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", ""), os.getcwd()])
    return {CUBLAS_WORKSPACE[0]: CUBLAS_WORKSPACE[1], **os.environ, "PYTHONPATH": path, **(extra or {})}


def subreaper_available() -> bool:
    return sys.platform.startswith("linux")


# Zygotes of this process still running: it is a subreaper while there are any. Only then: a
# process that stays one (a notebook, a test session running runs in-process) would adopt every
# orphan of its descendants, an emulator's workers whose server was killed among them, and keep
# them as zombies.
_running = 0
_running_lock = threading.Lock()


def _set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _zygote_started() -> None:
    global _running
    with _running_lock:
        if _running == 0:
            _set_subreaper(True)
        _running += 1


def _zygote_ended() -> None:
    """Its children are ours now (reparented as it exited): adopting stops with the last zygote."""
    global _running
    with _running_lock:
        _running -= 1
        if _running == 0:
            _set_subreaper(False)


class Zygote:
    """The zygote process and the pids it has reported, in the order of the argvs it forked."""

    def __init__(self, env: dict[str, str]) -> None:
        _zygote_started()
        read_end, write_end = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nodes.transport.zygote", str(write_end)],
                env=env,
                cwd=PROJECT_ROOT,
                pass_fds=(write_end,),
                stdin=subprocess.PIPE,
            )
        except BaseException:
            os.close(read_end)
            _zygote_ended()
            raise
        finally:
            os.close(write_end)
        self.env = env
        self._ended = False
        # The pool's thread and the evaluator's (nodes/transport/evaluator.py) both ask after their processes:
        # the report is read, and the zygote's end counted, by one thread at a time.
        self._lock = threading.Lock()
        os.set_blocking(read_end, False)
        self._report, self._pending = read_end, b""
        self.pids: list[int] = []

    def fork(self, argvs: list[list[str]], env: dict[str, str]) -> None:
        """Fork one worker per argv, `env` added to their environment. A zygote that has died meanwhile
        forks none: its workers are seen as ended (ForkedWorker.poll)."""
        assert self.proc.stdin is not None
        # the server may have raised its open files limit since the zygote started (emulator.run.guards)
        request = {"argvs": argvs, "env": env, "open_files": resource.getrlimit(resource.RLIMIT_NOFILE)}
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()

    def discard(self) -> None:
        """End a zygote never asked to fork: it has no children."""
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        self.exited()
        with self._lock:
            if self._report >= 0:
                os.close(self._report)
                self._report = -1

    def pid(self, index: int) -> int | None:
        """The pid of worker `index`, once forked."""
        with self._lock:
            self._read()
            return self.pids[index] if index < len(self.pids) else None

    def exited(self) -> bool:
        """Whether the zygote has exited: its children, reported or not, are ours from then on."""
        if self.proc.poll() is None:
            return False
        with self._lock:
            if not self._ended:
                self._ended = True
                _zygote_ended()
            self._read()
        return True

    def terminate(self) -> None:
        """SIGTERM: the zygote holds it while it forks and reports, so no child goes unreported."""
        if self.proc.poll() is None:
            self.proc.terminate()

    def _read(self) -> None:  # under self._lock
        while self._report >= 0:
            try:
                chunk = os.read(self._report, 4096)
            except BlockingIOError:
                return
            if not chunk:  # every writer has closed it
                os.close(self._report)
                self._report = -1
            self._pending += chunk
            *lines, self._pending = self._pending.split(b"\n")
            self.pids += [int(line) for line in lines]


class ForkedWorker:
    """One worker forked by a `Zygote`, with subprocess.Popen's poll / wait / kill (nodes.transport.roster.Process)."""

    def __init__(self, zygote: Zygote, index: int) -> None:
        self._zygote, self._index = zygote, index
        self.returncode: int | None = None
        self._killed = False

    @property
    def pid(self) -> int | None:
        return self._zygote.pid(self._index)

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if not self._zygote.exited():  # until then it is the zygote's child, not ours to wait for
            return None
        pid = self.pid
        if pid is None:  # the zygote ended before forking it
            self.returncode = self._zygote.proc.returncode or 1
            return self.returncode
        if self._killed:  # killed before its pid was known
            self._signal(pid)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Polled as Popen.wait polls with a timeout: sleeps doubling from half a millisecond up to
        WAIT_POLL_MAX_S, so that an exit soon after a shutdown is seen soon after (a run's end waits
        for each of its workers and its evaluator in turn)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = WAIT_POLL_MIN_S
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker forked by zygote {self._zygote.proc.pid}", timeout or 0.0)
            time.sleep(delay)
            delay = min(2 * delay, WAIT_POLL_MAX_S)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        self._killed = True
        pid = self.pid
        if pid is None:  # not forked yet: stop the zygote before it does
            self._zygote.terminate()
        else:
            self._signal(pid)

    @staticmethod
    def _signal(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # already reaped
            os.kill(pid, signal.SIGKILL)


_prestarted: Zygote | None = None


def prestart() -> None:
    """Start this process's zygote now, before its run has read the scenario (see the module's doc)."""
    global _prestarted
    if _prestarted is None and subreaper_available():
        _prestarted = Zygote(worker_env())


def take_prestarted(env: dict[str, str]) -> Zygote | None:
    """The prestarted zygote, if any and if started with `env`: one started before the run changed
    the environment (Hydra's hydra.job.env_set) did its imports under another, and is ended."""
    global _prestarted
    zygote, _prestarted = _prestarted, None
    if zygote is not None and zygote.env != env:
        zygote.discard()
        return None
    return zygote


def discard_prestarted() -> None:
    global _prestarted
    if _prestarted is not None:
        _prestarted.discard()
        _prestarted = None


def main() -> None:
    report = int(sys.argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the workers: Ctrl-C is the server's to handle
    # Python's recipe for a process that forks without exec (gc.freeze's documentation): no collection
    # while importing (collections during torch's import, of objects that all live on, are wasted:
    # python -m bench --only startup), the imports frozen before forking (the children's collections
    # skip them and leave their pages shared), the collector back on in each child
    gc.disable()
    from nodes import worker
    from nodes.training import dp_step, trainer  # noqa: F401  what every worker imports: once, here

    gc.freeze()

    line = sys.stdin.buffer.readline()
    if not line:  # the run started no workers here
        os._exit(0)
    request = json.loads(line)
    os.environ.update(request["env"])
    resource.setrlimit(resource.RLIMIT_NOFILE, tuple(request["open_files"]))
    for argv in request["argvs"]:
        # SIGTERM (Zygote.terminate) waits until the child's pid is written: no child goes unreported
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        pid = os.fork()
        if pid == 0:
            os.close(report)
            gc.enable()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            worker.cli(argv)  # never returns
        os.write(report, f"{pid}\n".encode())
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os._exit(0)


if __name__ == "__main__":
    main()

"""Local workers forked from one process that has done a worker's imports (torch, the trainer):
starting N workers costs one import of torch (~2 s of CPU), not N. On 2 cores a run's server and
its 2 workers importing torch at once took 1.6x one worker's own start to reach round 0.

    python -m nodes.zygote REPORT_FD ARGVS_JSON     (started by nodes.pool, not by hand)

The zygote imports, forks one worker per argv (each runs `nodes.worker.cli(argv)`), writes each
child's pid to REPORT_FD and exits. The server is a child subreaper (Linux) while it runs, so the
kernel hands the orphaned workers to it: they are its own children from then on, waited for with
their exit status like any subprocess. `Zygote` and `ForkedWorker` are the server's side.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


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
    """The zygote process and the pids it has reported, in the order of `argvs`."""

    def __init__(self, argvs: list[list[str]], env: dict[str, str], cwd: str) -> None:
        _zygote_started()
        read_end, write_end = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nodes.zygote", str(write_end), json.dumps(argvs)],
                env=env,
                cwd=cwd,
                pass_fds=(write_end,),
            )
        except BaseException:
            os.close(read_end)
            _zygote_ended()
            raise
        finally:
            os.close(write_end)
        self._ended = False
        os.set_blocking(read_end, False)
        self._report, self._pending = read_end, b""
        self.pids: list[int] = []

    def pid(self, index: int) -> int | None:
        """The pid of worker `index`, once forked."""
        self._read()
        return self.pids[index] if index < len(self.pids) else None

    def exited(self) -> bool:
        """Whether the zygote has exited: its children, reported or not, are ours from then on."""
        if self.proc.poll() is None:
            return False
        if not self._ended:
            self._ended = True
            _zygote_ended()
        self._read()
        return True

    def terminate(self) -> None:
        """SIGTERM: the zygote holds it while it forks and reports, so no child goes unreported."""
        if self.proc.poll() is None:
            self.proc.terminate()

    def _read(self) -> None:
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
    """One worker forked by a `Zygote`, with subprocess.Popen's poll / wait / kill (nodes.pool.Process)."""

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
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker forked by zygote {self._zygote.proc.pid}", timeout or 0.0)
            time.sleep(0.01)
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


def main() -> None:
    report, argvs = int(sys.argv[1]), json.loads(sys.argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the workers: Ctrl-C is the server's to handle
    from nodes import dp_step, trainer, worker  # noqa: F401  what every worker imports: once, here

    for argv in argvs:
        # SIGTERM (Zygote.terminate) waits until the child's pid is written: no child goes unreported
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        pid = os.fork()
        if pid == 0:
            os.close(report)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            worker.cli(argv)  # never returns
        os.write(report, f"{pid}\n".encode())
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os._exit(0)


if __name__ == "__main__":
    main()

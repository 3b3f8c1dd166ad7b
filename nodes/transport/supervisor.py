"""The supervisor: starts the server's workers, declares the dead, restarts them and shuts all down.

A worker that dies, stops answering a task (`transport.worker_timeout_s`) or goes silent (no
heartbeat for HEARTBEAT_MISSES periods of `transport.heartbeat_s`) costs the task it held
(reported as a failure); when it is one of ours it is restarted, at most
`transport.max_restarts` times per local slot. One that refused the run's setup (its data, device or
codec cannot be set up there) is not: its slot is retired at once, since a restart would be refused
alike, and when no worker is left the run's error names what it said. Local workers running `python -m nodes.worker`,
and the server's evaluator, are forked from one zygote that imports torch once for them all
(Linux); restarts, and other commands, are subprocesses of their own; transport.launcher starts
the workers elsewhere (nodes/transport/ray_workers.py).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from nodes.contracts import protocol
from nodes.contracts.keys import ServerKeys, reachable_from_here, worker_keys_env
from nodes.contracts.protocol import MessageType
from nodes.transport.roster import Process, Worker
from nodes.transport.zygote import (
    PROJECT_ROOT,
    ForkedWorker,
    Zygote,
    discard_prestarted,
    subreaper_available,
    take_prestarted,
    worker_env,
)

if TYPE_CHECKING:
    from nodes.contracts.schema import TransportConfig
    from nodes.transport.dispatch import Dispatcher
    from nodes.transport.inbound import InboundGate
    from nodes.transport.roster import Roster

log = logging.getLogger("dpfl.server")
DEFAULT_WORKER_COMMAND = (sys.executable, "-m", "nodes.worker")
WORKER_COMMAND = DEFAULT_WORKER_COMMAND  # what a local worker runs; the fault tests swap it

HEARTBEAT_MISSES = 10  # a worker silent for this many heartbeat periods is dead
SHUTDOWN_GRACE_S = 5.0  # how long shut_down() waits for local workers before killing them

LocalProcess = subprocess.Popen[bytes] | ForkedWorker  # a local worker's process; its pid is known once it runs


class NoWorkersLeft(RuntimeError):
    """Every local worker slot used up its restarts and no remote worker is serving."""


class WorkerLauncher(Protocol):
    """Starts the run's workers elsewhere than in subprocesses of the server (transport.launcher)."""

    kind: str  # the transport.launcher it is: its workers' names start with it

    def start(self, name: str, address: str, keys: ServerKeys | None, max_bytes: int) -> Process: ...
    def placements(self) -> dict[str, dict[str, Any]]: ...  # worker name -> where it runs (run.json)
    def close(self) -> None: ...  # ends every worker it started


@dataclass
class Deaths:
    worker_deaths: int = 0
    # died | hung | silent | unreachable | refused (the run's valid setup) -> workers
    death_causes: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    retired_slots: list[int] = field(default_factory=list)  # local slots that used up max_restarts or refused


class Supervisor:
    """Owns the workers' processes: the zygote, the launcher, every local process ever started, the
    restarts per slot and the death counters. Adds the workers it starts to the roster and removes
    the dead; writes each worker's `proc`, `slot` and `local`."""

    def __init__(self, transport: TransportConfig, roster: Roster, gate: InboundGate, dispatcher: Dispatcher):
        self.timeout_s, self.heartbeat_s = transport.worker_timeout_s, transport.heartbeat_s
        self.max_restarts = transport.max_restarts
        self.roster, self.gate, self.dispatcher = roster, gate, dispatcher
        self.deaths = Deaths()
        self.restarts: list[int] = []  # per local slot
        self.refusals: dict[int, str] = {}  # local slot -> what its worker said refusing the setup (retired)
        self.started: dict[str, LocalProcess] = {}  # every local worker ever started, by name
        self.zygote: Zygote | None = None  # what the first local workers were forked from (start)
        self.devices: list[str] = []  # each local slot's device (start); empty: the scenario's, resolved by the worker
        self.launcher: WorkerLauncher | None = None  # set before start for transport.launcher != local

    # --- starting ------------------------------------------------------------------------------
    def start(
        self, n_local: int, evaluator: list[str] | None = None, devices: list[str] | None = None
    ) -> LocalProcess | None:
        """Start `n_local` workers, slot k on `devices[k]` if given (emulator.run.devices), and, given its
        arguments, the server's evaluator (`python -m nodes.worker` with `evaluator`, nodes/transport/evaluator.py),
        whose process is returned. They connect and load torch at once, while the server loads its data;
        a worker's hello is answered with the setup (InboundGate.set_up)."""
        self.restarts = [0] * n_local
        self.devices = devices or []
        if self.launcher is None and WORKER_COMMAND == DEFAULT_WORKER_COMMAND and subreaper_available():
            idents = [self._ident(slot) for slot in range(n_local)]
            env = worker_env()
            self.zygote = take_prestarted(env) or Zygote(env)
            argvs = [self._worker_args(i, slot) for slot, i in enumerate(idents)]
            argvs += [with_parent(evaluator)] if evaluator else []
            self.zygote.fork(argvs, self._keys_env())
            for slot, ident in enumerate(idents):
                self._add_local(ident, slot, ForkedWorker(self.zygote, slot))
            return ForkedWorker(self.zygote, n_local) if evaluator else None
        discard_prestarted()
        for slot in range(n_local):
            self._spawn(slot)
        return start_evaluator(evaluator) if evaluator else None

    def _spawn(self, slot: int) -> None:
        if self.launcher is not None:  # a slot whose process runs elsewhere: watched, restarted, killed alike
            ident = f"{self.launcher.kind}-{slot}.{self.restarts[slot]}".encode()
            proc = self.launcher.start(ident.decode(), self.gate.address, self.gate.keys, self.gate.max_bytes)
            self.roster.add(Worker(ident=ident, proc=proc, slot=slot))
            return
        ident = self._ident(slot)
        cmd = [*WORKER_COMMAND, *self._worker_args(ident, slot)]
        self._add_local(ident, slot, subprocess.Popen(cmd, env=worker_env(self._keys_env()), cwd=PROJECT_ROOT))

    def _ident(self, slot: int) -> bytes:
        return f"local-{slot}.{self.restarts[slot]}".encode()

    def _worker_args(self, ident: bytes, slot: int) -> list[str]:
        return with_parent(
            [
                "--connect",
                reachable_from_here(self.gate.address),
                "--id",
                ident.decode(),
                "--max-message-bytes",
                str(self.gate.max_bytes),
                *(["--device", self.devices[slot]] if self.devices else []),
            ]
        )

    def _keys_env(self) -> dict[str, str]:
        return worker_keys_env(self.gate.keys) if self.gate.keys else {}

    def _add_local(self, ident: bytes, slot: int, proc: LocalProcess) -> None:
        self.roster.add(Worker(ident=ident, proc=proc, slot=slot, local=True))
        self.started[ident.decode()] = proc

    def pids(self) -> dict[str, int]:
        """Every local worker process started so far (restarted ones included), by name: a forked one
        once the zygote has reported it."""
        return {name: proc.pid for name, proc in self.started.items() if proc.pid is not None}

    # --- watching ------------------------------------------------------------------------------
    def listen(self) -> None:
        """Silence is measured from when the server listens: heartbeats that queued up while it
        was busy elsewhere (evaluating, writing results) are read only now."""
        now = time.monotonic()
        for w in self.roster.values():
            w.last_seen = max(w.last_seen, now)

    def reap(self) -> None:
        now = time.monotonic()
        for w in list(self.roster.values()):
            cause, why = self._diagnose(w, now)
            if cause:
                self.bury(w, cause, why)

    def _diagnose(self, w: Worker, now: float) -> tuple[str, str]:
        if w.proc is not None and w.proc.poll() is not None:
            return "died", f"worker {w.name} died (exit {w.proc.returncode})"
        if w.task is not None and now - w.task.sent > self.timeout_s:
            return "hung", f"worker {w.name} gave no reply within transport.worker_timeout_s = {self.timeout_s:g} s"
        silent = now - w.last_seen
        if w.greeted and silent > HEARTBEAT_MISSES * self.heartbeat_s:
            return "silent", f"worker {w.name} silent for {silent:.1f} s ({HEARTBEAT_MISSES} heartbeats missed)"
        return "", ""

    def bury(self, w: Worker, cause: str, why: str, refusal: str = "") -> None:
        """A dead worker loses its task; a local one is restarted unless its slot is used up, or unless it
        refused the setup: `refusal`, what it said, for which its slot is retired at once."""
        refused = bool(refusal) and w.proc is not None
        log.warning("%s; its slot is retired, not restarted" if refused else "%s", why)
        d = self.deaths
        d.worker_deaths += 1
        d.death_causes[cause] = d.death_causes.get(cause, 0) + 1
        self.dispatcher.fail_task(w, why)
        self.roster.remove(w)
        if w.proc is None:  # not ours to kill: tell it to go rather than linger
            self.gate.send_quietly(w.ident, protocol.encode(MessageType.SHUTDOWN))
            return
        _stop(w.proc)
        if refused:
            self.refusals[w.slot] = refusal
            d.retired_slots.append(w.slot)
        elif self.restarts[w.slot] < self.max_restarts:
            self.restarts[w.slot] += 1
            d.restarts += 1
            self._spawn(w.slot)
        else:
            d.retired_slots.append(w.slot)
            log.error(
                "local worker slot %d failed %d times (transport.max_restarts = %d): not restarted",
                w.slot,
                self.restarts[w.slot] + 1,
                self.max_restarts,
            )

    def no_workers_message(self) -> str:
        """Why no worker is left, in one line: the slots that refused the setup, naming what the first said,
        and those that used up their restarts."""
        retired = self.deaths.retired_slots
        refused = [s for s in retired if s in self.refusals]
        failed = [s for s in retired if s not in self.refusals]
        whys = []
        if refused:
            said = list(dict.fromkeys(self.refusals[s] for s in refused))
            others = "; other slots said otherwise: see the log" if len(said) > 1 else ""
            who = "every local worker" if not failed else f"local worker slots {refused}"
            whys.append(f"{who} refused the setup ({said[0]}{others})")
        if failed:
            whys.append(
                f"local worker slots {failed} each failed more than transport.max_restarts = {self.max_restarts} times"
            )
        why = "; ".join(whys) or "no local worker was started"
        return f"no workers left: {why}, and no remote worker is ready"

    # --- stopping ------------------------------------------------------------------------------
    def shut_down(self) -> None:
        """Ask every worker to go, give local ones SHUTDOWN_GRACE_S, then kill them."""
        try:
            for w in self.roster.values():
                self.gate.send_quietly(w.ident, protocol.encode(MessageType.SHUTDOWN))
            deadline = time.monotonic() + SHUTDOWN_GRACE_S
            # One that never said hello holds nothing, and may not have connected to hear us: killed at once.
            for w in self.roster.ours():
                assert w.proc is not None  # one of ours
                if not w.greeted:
                    continue
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        finally:  # also on a second Ctrl-C while waiting: no worker outlives the server
            for w in self.roster.ours():
                assert w.proc is not None  # one of ours
                _stop(w.proc)


def with_parent(args: list[str]) -> list[str]:
    """A local worker's or the evaluator's arguments: it exits when the server is gone."""
    return [*args, "--parent", str(os.getpid())]


def start_evaluator(args: list[str]) -> subprocess.Popen[bytes]:
    """The server's evaluator (`python -m nodes.worker` with `args`) in a process of its own: where no
    zygote forks it, and every restart. The project's own worker, whatever WORKER_COMMAND the fault
    tests give the workers."""
    return subprocess.Popen([*DEFAULT_WORKER_COMMAND, *with_parent(args)], env=worker_env(), cwd=PROJECT_ROOT)


def _stop(proc: Process) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


# --- the run's private directory -------------------------------------------------------------------

PRIVATE_PREFIX = "dpfl-"  # dpfl-<the server's pid>-<random>; before the pid was in it, dpfl-<random>
PRIVATE_NAME = re.compile(r"dpfl-(?:(\d+)-)?[A-Za-z0-9_]+")
SOCKETS = {"server.sock", "evaluator.sock"}  # all a server puts there
SETTLED_S = 60.0  # a directory without a pid is swept only this long after its last change: not a start's


def private_dir() -> str:
    """A fresh directory only we may enter, for the run's ipc sockets (the server's and its evaluator's),
    named after this process: the run removes it as it ends. A server that is SIGKILLed, which no
    handler sees, leaves its own behind: each start first sweeps those (sweep_private_dirs)."""
    sweep_private_dirs(tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-")


def sweep_private_dirs(root: str) -> list[str]:
    """Remove our user's private directories in `root` whose server is gone; the paths removed. A directory
    is a dead server's when the pid in its name is no process here (or, in an older version's name without
    one, nothing changed it for SETTLED_S), it holds nothing but a server's sockets and none of them accepts
    a connection: so a live run's is never touched, not even one in another pid namespace sharing `root`."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            m = PRIVATE_NAME.fullmatch(entry.name)
            if m is None or not _dead_servers(entry.path, int(m[1]) if m[1] else None):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            if not os.path.lexists(entry.path):
                removed.append(entry.path)
    return removed


def _dead_servers(path: str, pid: int | None) -> bool:
    try:
        st = os.lstat(path)
        names = os.listdir(path)
    except OSError:  # gone already, or not ours to read
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or not set(names) <= SOCKETS:
        return False
    if pid is not None and _running(pid):
        return False
    if pid is None and time.time() - st.st_mtime < SETTLED_S:
        return False
    return not any(_listening(os.path.join(path, name)) for name in names)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: a process all the same
        return True
    return True


def _listening(path: str) -> bool:
    """Whether a process accepts connections on the unix socket `path` (where it cannot be told: yes)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError as e:
            return e.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK)
    return True

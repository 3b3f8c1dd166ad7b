"""Worker pool: the server's ZeroMQ ROUTER, which supervises worker processes and runs a round's tasks.

Workers are stateless: any idle worker takes the next task (in client-id order; first, though,
a client it trained last, whose data it still holds), so the number of workers changes only
wall-clock time. A worker that dies, stops answering a task
(`transport.worker_timeout_s`) or goes silent (no heartbeat for HEARTBEAT_MISSES periods
of `transport.heartbeat_s`) costs the task it held (reported as a failure); when it is one
of ours it is restarted, at most `transport.max_restarts` times per local slot.

Everything a socket delivers is untrusted: a message that does not decode, names another
worker than the connection it came on (its ZeroMQ identity), comes from a peer that never
said hello, or answers a task its sender does not hold is rejected, counted per reason
(`counters`, stored in run.json) and logged (the first LOG_FIRST per reason). A peer is a
worker only after its own hello and its own ready. Unless the socket is an ipc:// file in a
private directory, it only admits workers holding a CURVE key (nodes/keys.py).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import zmq

from nodes import protocol
from nodes.keys import (
    ServerKeys,
    address_problem,
    exposure_problem,
    is_ipv6,
    reachable_from_here,
    server_keys,
    worker_keys_env,
)
from nodes.protocol import MAX_FRAMES, Message, ProtocolError
from nodes.schema import Launcher
from nodes.zygote import (
    PROJECT_ROOT,
    ForkedWorker,
    Zygote,
    discard_prestarted,
    subreaper_available,
    take_prestarted,
    worker_env,
)

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

    from nodes.schema import TransportConfig

log = logging.getLogger("dpfl.server")
DEFAULT_WORKER_COMMAND = (sys.executable, "-m", "nodes.worker")
WORKER_COMMAND = DEFAULT_WORKER_COMMAND  # what a local worker runs; the fault tests swap it

HEARTBEAT_MISSES = 10  # a worker silent for this many heartbeat periods is dead
LOG_FIRST = 5  # rejections logged per reason; the rest are only counted
POLL_S = 0.05  # how long the task loop waits for a message before checking on workers
BATCH = 1000  # messages read per poll, so that a flood cannot starve the checks
SHUTDOWN_GRACE_S = 5.0  # how long close() waits for local workers before killing them
PEER_QUEUE = 16  # whole messages ZeroMQ holds per peer until we read them (its RCVHWM)
CURVE_FRAMING = 64  # bytes CURVE adds to a frame on the wire (a MESSAGE command: name, nonce, MAC)


class NoWorkersLeft(RuntimeError):
    """Every local worker slot used up its restarts and no remote worker is serving."""


class AddressError(ValueError):
    """transport.address cannot be bound; the message names it and says why, in one line."""


@dataclass
class Reply:
    """A task's outcome on the real system: the update message, or why there is none."""

    client: int
    message: dict[str, Any] | None = None
    nbytes: int = 0
    failure: str = ""


@dataclass
class Task:
    round: int
    client: int
    sent: float  # time.monotonic() when it was sent


class PendingTasks:
    """A round's tasks not yet sent. Each worker is offered first the clients it trained last, whose
    data its cache holds (a FashionMNIST client took 46 ms to build, and with any idle worker taking
    the next client every worker came to build and hold every client's data); then the next in the
    round's order. Which worker trains a client changes no result (nodes.rng streams)."""

    def __init__(self, frames: list[tuple[int, Message]], trainer_of: dict[int, bytes]):
        self.frames = frames
        self.sent = [False] * len(frames)
        self.left = len(frames)
        self.in_order = deque(range(len(frames)))
        self.own: dict[bytes, deque[int]] = {}  # worker -> its former clients' tasks, in the round's order
        for i, (client, _) in enumerate(frames):
            if client in trainer_of:
                self.own.setdefault(trainer_of[client], deque()).append(i)

    def __len__(self) -> int:
        return self.left

    def next_for(self, ident: bytes) -> int:
        """The index in `frames` of the task to offer worker `ident` (there must be one left)."""
        for queue in (self.own.get(ident), self.in_order):
            while queue and self.sent[queue[0]]:
                queue.popleft()
            if queue:
                return queue[0]
        raise IndexError("no task left")

    def mark_sent(self, i: int) -> None:
        self.sent[i] = True
        self.left -= 1


class Process(Protocol):
    """What the pool needs of one of its workers' processes: subprocess.Popen's own methods."""

    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...  # subprocess.TimeoutExpired when it runs on
    def kill(self) -> None: ...


LocalProcess = subprocess.Popen[bytes] | ForkedWorker  # a local worker's process; its pid is known once it runs


class WorkerLauncher(Protocol):
    """Starts the run's workers elsewhere than in subprocesses of the server (transport.launcher)."""

    kind: str  # the transport.launcher it is: its workers' names start with it

    def start(self, name: str, address: str, keys: ServerKeys | None, max_bytes: int) -> Process: ...
    def placements(self) -> dict[str, dict[str, Any]]: ...  # worker name -> where it runs (run.json)
    def close(self) -> None: ...  # ends every worker it started


@dataclass
class Worker:
    ident: bytes  # its ZeroMQ identity (= the name in its hello)
    proc: Process | None = None  # None for a worker that joined from elsewhere
    slot: int = -1  # local workers: the slot its restarts are counted against
    greeted: bool = False  # its hello arrived
    ready: bool = False  # it has built the data and the model
    task: Task | None = None
    last_seen: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return self.ident.decode(errors="replace")


@dataclass
class Counters:
    rejected: int = 0  # messages rejected, all reasons
    reasons: dict[str, int] = field(default_factory=dict)  # reason -> messages
    worker_deaths: int = 0
    death_causes: dict[str, int] = field(default_factory=dict)  # died | hung | silent | unreachable -> workers
    restarts: int = 0
    retired_slots: list[int] = field(default_factory=list)  # local slots that used up max_restarts


class WorkerPool:
    def __init__(self, address: str, transport: TransportConfig):
        """Bind `address` (the resolved transport.address; `transport` is the scenario's
        TransportConfig). Nothing is started until start(): a bad address costs nothing."""
        malformed = address_problem(address)
        problem = (
            f"transport.address = {address!r}: {malformed}"
            if malformed
            else exposure_problem(address, transport.curve, transport.keys_dir, transport.launcher == Launcher.RAY)
        )
        if problem:
            raise AddressError(problem)
        self.max_bytes, self.timeout_s = transport.max_message_bytes, transport.worker_timeout_s
        self.heartbeat_s, self.max_restarts = transport.heartbeat_s, transport.max_restarts
        self.keys = server_keys(address, transport.keys_dir)
        self.setup_frame = Message(())  # what every worker gets after its hello: set by set_up()
        self.workers: dict[bytes, Worker] = {}
        self.counters = Counters()
        self.restarts: list[int] = []  # per local slot
        self.started: dict[str, LocalProcess] = {}  # every local worker ever started, by name
        self.joined: dict[str, int] = {}  # every worker started by hand that joined: name -> its pid
        self.dead: set[bytes] = set()  # local workers declared dead (identities are never reused)
        self.zygote: Zygote | None = None  # what the first local workers were forked from (start)
        self.replies: dict[int, Reply] | None = None  # the current round's, inside run_tasks
        self.trainer_of: dict[int, bytes] = {}  # client -> the worker its last task went to (PendingTasks)
        self.initial_model: dict[str, np.ndarray] | None = None  # the first local worker's, in its ready
        self.launcher: WorkerLauncher | None = None  # set after the bind for transport.launcher != local
        self.ctx = zmq.Context()
        self.auth: ThreadAuthenticator | None = None
        self.sock = self.ctx.socket(zmq.ROUTER)
        try:
            self._bind(address)
        except BaseException:
            self.close()
            raise

    def start(self, n_local: int, evaluator: list[str] | None = None) -> LocalProcess | None:
        """Start `n_local` workers and, given its arguments, the server's evaluator (`python -m
        nodes.worker` with `evaluator`, nodes/evaluator.py), whose process is returned. They connect and
        load torch at once, while the server loads its data; a worker's hello is answered with the
        setup from `set_up`, in `wait_ready`. Local workers running `python -m nodes.worker`, and
        the evaluator, are forked from one zygote that imports torch once for them all (Linux);
        restarts, and other commands, are subprocesses of their own."""
        self.restarts = [0] * n_local
        if self.launcher is None and WORKER_COMMAND == DEFAULT_WORKER_COMMAND and subreaper_available():
            idents = [self._ident(slot) for slot in range(n_local)]
            env = worker_env()
            self.zygote = take_prestarted(env) or Zygote(env)
            argvs = [self._worker_args(i) for i in idents] + ([self._local_args(evaluator)] if evaluator else [])
            self.zygote.fork(argvs, self._keys_env())
            for slot, ident in enumerate(idents):
                self._add_local(ident, slot, ForkedWorker(self.zygote, slot))
            return ForkedWorker(self.zygote, n_local) if evaluator else None
        discard_prestarted()
        for slot in range(n_local):
            self._spawn(slot)
        return start_evaluator(evaluator) if evaluator else None

    def set_up(self, scenario: dict[str, Any], wire_log: str = "") -> None:
        """Every worker, local or joining, is set up with `scenario`: before the first `wait_ready`."""
        self.setup_frame = protocol.encode("setup", scenario=scenario, wire_log=wire_log, heartbeat_s=self.heartbeat_s)

    # --- lifecycle -----------------------------------------------------------------------
    def _bind(self, address: str) -> None:
        s = self.sock
        s.setsockopt(zmq.LINGER, 1000)  # lets the shutdown messages leave on close
        # A send to a worker that is gone raises instead of vanishing (the task goes elsewhere).
        s.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # No ROUTER_HANDOVER: a second connection claiming a worker's identity is ignored,
        # so nobody can take over a worker's tasks.
        # Memory: ZeroMQ disconnects a peer whose frame is over the limit as soon as it reads the
        # frame's size, and queues at most PEER_QUEUE whole messages per peer.
        s.setsockopt(zmq.MAXMSGSIZE, self.max_bytes + CURVE_FRAMING)
        s.setsockopt(zmq.RCVHWM, PEER_QUEUE)
        s.setsockopt(zmq.IPV6, is_ipv6(address))
        if self.keys:
            self._authenticate(self.keys)
        try:
            s.bind(address)
        except zmq.ZMQError as e:  # in use, no such directory, no such interface...
            raise AddressError(f"transport.address = {address!r}: {_bind_failure(address, e)}") from None
        self.address = s.getsockopt_string(zmq.LAST_ENDPOINT)  # resolves tcp://host:0

    def _authenticate(self, keys: ServerKeys) -> None:
        """CURVE: the handshake admits keygen's authorized workers, or only this run's own."""
        from zmq.auth.thread import ThreadAuthenticator

        self.auth = ThreadAuthenticator(self.ctx)
        self.auth.start()
        if keys.authorized is not None:
            self.auth.configure_curve(domain="*", location=str(keys.authorized))
        else:
            self.auth.configure_curve_callback(domain="*", credentials_provider=_OnlyKey(keys.worker[0]))
        s = self.sock
        s.curve_publickey, s.curve_secretkey, s.curve_server = keys.public, keys.secret, True

    def _spawn(self, slot: int) -> None:
        if self.launcher is not None:  # a slot whose process runs elsewhere: watched, restarted, killed alike
            ident = f"{self.launcher.kind}-{slot}.{self.restarts[slot]}".encode()
            proc = self.launcher.start(ident.decode(), self.address, self.keys, self.max_bytes)
            self.workers[ident] = Worker(ident=ident, proc=proc, slot=slot)
            return
        ident = self._ident(slot)
        cmd = [*WORKER_COMMAND, *self._worker_args(ident)]
        self._add_local(ident, slot, subprocess.Popen(cmd, env=worker_env(self._keys_env()), cwd=PROJECT_ROOT))

    def _ident(self, slot: int) -> bytes:
        return f"local-{slot}.{self.restarts[slot]}".encode()

    def _worker_args(self, ident: bytes) -> list[str]:
        return self._local_args(
            [
                "--connect",
                reachable_from_here(self.address),
                "--id",
                ident.decode(),
                "--max-message-bytes",
                str(self.max_bytes),
            ]
        )

    @staticmethod
    def _local_args(args: list[str]) -> list[str]:
        return [*args, "--parent", str(os.getpid())]  # it exits when the server is gone

    def _keys_env(self) -> dict[str, str]:
        return worker_keys_env(self.keys) if self.keys else {}

    def _add_local(self, ident: bytes, slot: int, proc: LocalProcess) -> None:
        self.workers[ident] = Worker(ident=ident, proc=proc, slot=slot)
        self.started[ident.decode()] = proc

    def wait_ready(self, min_workers: int = 0, timeout_s: float = 300.0) -> None:
        """Block until every local worker has loaded the data and model and at least
        `min_workers` workers (local or joined from elsewhere) are ready."""
        deadline = time.monotonic() + timeout_s
        self._listen()
        while True:
            local = self._local()
            if not local and not min_workers:
                raise NoWorkersLeft(self._no_workers_message())
            ready = sum(w.ready for w in self.workers.values())
            if all(w.ready for w in local) and ready >= min_workers:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{ready} workers ready after {timeout_s:.0f} s, "
                    f"{max(min_workers, len(local))} expected (transport.min_workers)"
                )
            self._poll(0.1)
            self._reap()

    def pids(self) -> dict[str, int]:
        """Every local worker process started so far (restarted ones included), by name: a forked one
        once the zygote has reported it."""
        return {name: proc.pid for name, proc in self.started.items() if proc.pid is not None}

    def remote_pids(self) -> dict[str, int]:
        """Every worker started elsewhere (by hand) that joined so far, by name: the pid it gave in its hello."""
        return dict(self.joined)

    def close(self) -> None:
        """Shut every worker down: ask, give local ones SHUTDOWN_GRACE_S, then kill them.
        Closing again does nothing."""
        if self.sock.closed:
            return
        try:
            for w in self.workers.values():
                self._send_quietly(w.ident, protocol.encode("shutdown"))
            deadline = time.monotonic() + SHUTDOWN_GRACE_S
            # One that never said hello holds nothing, and may not have connected to hear us: killed at once.
            for w in self._local():
                assert w.proc is not None  # a local worker's
                if not w.greeted:
                    continue
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        finally:  # also on a second Ctrl-C while waiting: no worker outlives the server
            for w in self._local():
                assert w.proc is not None  # a local worker's
                _stop(w.proc)
            if self.counters.rejected:
                log.warning("rejected %d messages in all: %s", self.counters.rejected, self.counters.reasons)
            if self.auth is not None:
                self.auth.stop()
            self.sock.close()
            self.ctx.term()
            if self.launcher is not None:  # last: its own errors leave no socket open
                self.launcher.close()

    # --- a round's tasks -------------------------------------------------------------------
    def run_tasks(self, rnd: int, frames: list[tuple[int, Message]]) -> dict[int, Reply]:
        """Send each (client, task message) to an idle worker; return every client's Reply."""
        pending = PendingTasks(frames, self.trainer_of)
        self.replies = {}
        self._listen()
        try:
            while len(self.replies) < len(frames):
                self._dispatch(rnd, pending)
                self._poll(POLL_S)
                self._reap()
                if not any(w.ready or w.proc is not None for w in self.workers.values()):
                    raise NoWorkersLeft(self._no_workers_message())
            return self.replies
        finally:
            self.replies = None

    def _dispatch(self, rnd: int, pending: PendingTasks) -> None:
        for w in sorted(self.workers.values(), key=lambda w: w.ident):
            if pending and w.ready and w.task is None:
                i = pending.next_for(w.ident)
                client, message = pending.frames[i]
                if self._send(w, message):
                    pending.mark_sent(i)
                    w.task = Task(rnd, client, time.monotonic())
                    self.trainer_of[client] = w.ident

    def _send(self, w: Worker, message: Message) -> bool:
        """Send without blocking; a worker that is no longer connected is dead. The tensor frames go
        uncopied (ZeroMQ keeps the arrays alive until they are sent): nothing writes the model while
        run_tasks runs, and each reply it returns answers a task already delivered."""
        try:
            self.sock.send_multipart([w.ident, *message.frames], flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            self._bury(w, "unreachable", f"worker {w.name} disconnected")
            return False

    def _send_quietly(self, ident: bytes, message: Message) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.sock.send_multipart([ident, *message.frames], flags=zmq.NOBLOCK)

    # --- receiving -------------------------------------------------------------------------
    def _poll(self, timeout_s: float) -> None:
        if not self.sock.poll(int(timeout_s * 1000)):
            return
        for _ in range(BATCH):
            if not self.sock.poll(0):
                return
            self._receive(*self._recv_parts())

    def _recv_parts(self) -> tuple[bytes, list[memoryview], int]:
        """A message's sender, its first MAX_FRAMES frames uncopied (views of ZeroMQ's memory) and
        the number of further frames it had, dropped one by one as read."""
        ident, dropped = self.sock.recv(), 0
        frames: list[memoryview] = []
        while self.sock.getsockopt(zmq.RCVMORE):
            frame = self.sock.recv(copy=False)
            if len(frames) < MAX_FRAMES:
                frames.append(frame.buffer)
            else:
                dropped += 1
        return ident, frames, dropped

    def _receive(self, ident: bytes, frames: list[memoryview], dropped: int = 0) -> None:
        sender = self.workers.get(ident)
        if sender is not None:
            sender.last_seen = time.monotonic()
        if dropped:
            self._reject_malformed(ident, "frames", f"{len(frames) + dropped} frames, expected 1 to {MAX_FRAMES}")
            return
        try:
            msg = protocol.decode(frames, self.max_bytes)
        except ProtocolError as e:
            self._reject_malformed(ident, e.reason, str(e))
            return
        self._handle(ident, msg, sum(f.nbytes for f in frames))

    def _handle(self, ident: bytes, msg: dict[str, Any], nbytes: int) -> None:
        kind = msg["type"]
        if ident in self.dead:  # what it sent before we stopped it, read only now
            self._reject(ident, "dead_worker", f"{kind} from a worker declared dead")
            return
        if "worker" in msg and msg["worker"].encode() != ident:  # a name is only ever its sender's own
            self._reject(ident, "identity_mismatch", f"{kind} as {msg['worker']!r} on connection {_short(ident)}")
            return
        if kind == "hello":
            self._greet(ident, msg)
            return
        w = self.workers.get(ident)
        if w is None or not w.greeted:
            self._reject(ident, "unknown_worker", f"{kind} from a peer that never said hello")
        elif kind == "ready":
            w.ready = True
            if self.initial_model is None and self.launcher is None and w.proc is not None:
                # one of our own workers (this machine, this code) built the model the server would
                # build; a worker that joined from elsewhere may run another torch
                self.initial_model = {k: np.array(v) for k, v in msg["model"].items()}
        elif kind in ("update", "error"):
            self._settle(w, msg, nbytes)
        elif kind != "heartbeat":
            self._reject(ident, "unexpected_type", f"{kind} is not a worker's message")

    def _greet(self, ident: bytes, msg: dict[str, Any]) -> None:
        w = self.workers.get(ident)
        if w is not None and w.greeted:
            self._reject(ident, "duplicate_worker", f"second hello from {w.name}")
            return
        if w is None:  # a worker started by hand elsewhere joins the run
            w = self.workers[ident] = Worker(ident=ident)
            self.joined[w.name] = msg["pid"]
            log.info("worker %s joined from pid %s", w.name, msg["pid"])
        w.greeted, w.last_seen = True, time.monotonic()
        self._send(w, self.setup_frame)

    def _settle(self, w: Worker, msg: dict[str, Any], nbytes: int) -> None:
        """An update or error answers the task its sender holds, or it is stale."""
        t = w.task
        if self.replies is None or t is None or (msg["round"], msg["client"]) != (t.round, t.client):
            held = f"it holds round {t.round} client {t.client}" if t else "it holds no task"
            self._reject(w.ident, "stale", f"{msg['type']} for round {msg['round']} client {msg['client']}, {held}")
            return
        w.task = None
        self.replies[t.client] = (
            Reply(client=t.client, message=msg, nbytes=nbytes)
            if msg["type"] == "update"
            else Reply(client=t.client, failure=f"worker error: {msg['message']}")
        )

    def _reject_malformed(self, ident: bytes, reason: str, detail: str) -> None:
        """A worker that sends garbage has broken the reply it owed: fail its task now rather
        than at the timeout. (Only its own connection can carry its identity.)"""
        self._reject(ident, reason, detail)
        w = self.workers.get(ident)
        if w is not None:
            self._fail_task(w, f"bad reply from worker {w.name}: {detail}")

    def _reject(self, ident: bytes, reason: str, detail: str) -> None:
        c = self.counters
        c.rejected += 1
        n = c.reasons[reason] = c.reasons.get(reason, 0) + 1
        if n <= LOG_FIRST:
            more = f" (further {reason} rejections are counted, not logged)" if n == LOG_FIRST else ""
            log.warning("rejected a message from %s: %s: %s%s", _short(ident), reason, detail[:200], more)

    # --- worker health ---------------------------------------------------------------------
    def _listen(self) -> None:
        """Silence is measured from when the server listens: heartbeats that queued up while it
        was busy elsewhere (evaluating, writing results) are read only now."""
        now = time.monotonic()
        for w in self.workers.values():
            w.last_seen = max(w.last_seen, now)

    def _reap(self) -> None:
        now = time.monotonic()
        for w in list(self.workers.values()):
            cause, why = self._diagnose(w, now)
            if cause:
                self._bury(w, cause, why)

    def _diagnose(self, w: Worker, now: float) -> tuple[str, str]:
        if w.proc is not None and w.proc.poll() is not None:
            return "died", f"worker {w.name} died (exit {w.proc.returncode})"
        if w.task is not None and now - w.task.sent > self.timeout_s:
            return "hung", f"worker {w.name} gave no reply within transport.worker_timeout_s = {self.timeout_s:g} s"
        silent = now - w.last_seen
        if w.greeted and silent > HEARTBEAT_MISSES * self.heartbeat_s:
            return "silent", f"worker {w.name} silent for {silent:.1f} s ({HEARTBEAT_MISSES} heartbeats missed)"
        return "", ""

    def _bury(self, w: Worker, cause: str, why: str) -> None:
        """A dead worker loses its task; a local one is restarted unless its slot is used up."""
        log.warning(why)
        c = self.counters
        c.worker_deaths += 1
        c.death_causes[cause] = c.death_causes.get(cause, 0) + 1
        self._fail_task(w, why)
        del self.workers[w.ident]
        if w.proc is None:  # not ours to kill: tell it to go rather than linger
            self._send_quietly(w.ident, protocol.encode("shutdown"))
            return
        _stop(w.proc)
        self.dead.add(w.ident)
        if self.restarts[w.slot] < self.max_restarts:
            self.restarts[w.slot] += 1
            c.restarts += 1
            self._spawn(w.slot)
        else:
            c.retired_slots.append(w.slot)
            log.error(
                "local worker slot %d failed %d times (transport.max_restarts = %d): not restarted",
                w.slot,
                self.restarts[w.slot] + 1,
                self.max_restarts,
            )

    def _fail_task(self, w: Worker, why: str) -> None:
        if w.task is not None and self.replies is not None:
            self.replies[w.task.client] = Reply(client=w.task.client, failure=why)
        w.task = None

    def _local(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.proc is not None]

    def _no_workers_message(self) -> str:
        retired = self.counters.retired_slots
        why = (
            f"local worker slots {retired} each failed more than transport.max_restarts = {self.max_restarts} times"
            if retired
            else "no local worker was started"
        )
        return f"no workers left: {why}, and no remote worker is ready"


def start_evaluator(args: list[str]) -> subprocess.Popen[bytes]:
    """The server's evaluator (`python -m nodes.worker` with `args`) in a process of its own: where no
    zygote forks it, and every restart. The project's own worker, whatever WORKER_COMMAND the fault
    tests give the workers."""
    cmd = [*DEFAULT_WORKER_COMMAND, *WorkerPool._local_args(args)]
    return subprocess.Popen(cmd, env=worker_env(), cwd=PROJECT_ROOT)


def _bind_failure(address: str, e: zmq.ZMQError) -> str:
    if address.startswith("ipc://") and e.errno == errno.ENOENT:
        return f"no directory {os.path.dirname(address[len('ipc://') :])} for the ipc socket"
    return e.strerror


class _OnlyKey:
    """ZAP credentials for a run's own key pair: the one worker public key it made."""

    def __init__(self, public: bytes):
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.public


def _stop(proc: Process) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _short(ident: bytes) -> str:
    text = repr(ident)
    return text if len(text) <= 60 else text[:60] + "..."

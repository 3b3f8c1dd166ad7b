"""The inbound gate: the server's ZeroMQ ROUTER socket, and the checks on everything it delivers.

Everything a socket delivers is untrusted: a message that does not decode, names another
worker than the connection it came on (its ZeroMQ identity), comes from a peer that never
said hello, or answers a task its sender does not hold is rejected, counted per reason
(`rejections`, stored in run.json) and logged (the first LOG_FIRST per reason). A peer is a
worker only after its own hello and its own ready. Unless the socket is an ipc:// file in a
private directory, it only admits workers holding a CURVE key (nodes/contracts/keys.py).

What the server sends goes out through the gate's socket too; a send that finds its worker
disconnected raises Disconnected, for the pool to declare it dead.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from nodes.contracts import protocol
from nodes.contracts.keys import ServerKeys, address_problem, exposure_problem, is_ipv6, server_keys
from nodes.contracts.protocol import MAX_FRAMES, Message, MessageType, ProtocolError
from nodes.contracts.schema import Launcher
from nodes.transport.roster import Worker

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

    from nodes.contracts.schema import TransportConfig
    from nodes.transport.dispatch import Dispatcher
    from nodes.transport.roster import Roster

log = logging.getLogger("dpfl.server")

LOG_FIRST = 5  # rejections logged per reason; the rest are only counted
BATCH = 1000  # messages read per poll, so that a flood cannot starve the checks
PEER_QUEUE = 16  # whole messages ZeroMQ holds per peer until we read them (its RCVHWM)
CURVE_FRAMING = 64  # bytes CURVE adds to a frame on the wire (a MESSAGE command: name, nonce, MAC)

TASK_KINDS = (
    MessageType.TASK,
    MessageType.TASK_RESIDUAL,
    MessageType.BUNDLE,
    "",
)  # what a worker's rejection of its task names ("": unread)
Received = tuple[bytes, list[memoryview], int]  # a message's sender, its frames, and how many more were dropped


class AddressError(ValueError):
    """transport.address cannot be bound; the message names it and says why, in one line."""


class Disconnected(Exception):
    """A send found `worker` no longer connected: it is dead."""

    def __init__(self, worker: Worker):
        super().__init__(worker.name)
        self.worker = worker


class Unfit(Exception):
    """`worker` rejected the run's setup, which the server's own check passes: it cannot serve this run
    (another version, a lower --max-message-bytes, data, a device or a codec it cannot set up). `said` is
    the first line of its reason and detail. The pool drops it as dead (cause `refused`) and retires its slot."""

    def __init__(self, worker: Worker, why: str, said: str):
        super().__init__(why)
        self.worker, self.said = worker, said


class OwnFault(Exception):
    """A worker rejected a message of the server's, and the server's own check of that message fails
    too: the fault is the server's (a checkpoint's NaN model, a setup over transport.max_message_bytes).
    The pool stops the run with it (nodes.transport.pool.RejectedByWorker), restarting and blaming no worker."""


@dataclass
class Rejections:
    rejected: int = 0  # messages rejected, all reasons
    reasons: dict[str, int] = field(default_factory=dict)  # reason -> messages


class InboundGate:
    """Owns the socket, the rejection counters, the setup every worker gets after its hello, the
    identities and pids of workers that joined from elsewhere, and the initial model a local
    worker sent in its ready. Writes each worker's `greeted`, `ready` and `last_seen`."""

    def __init__(self, address: str, transport: TransportConfig, roster: Roster, dispatcher: Dispatcher):
        """Bind `address` (the resolved transport.address; `transport` is the scenario's TransportConfig)."""
        malformed = address_problem(address)
        problem = (
            f"transport.address = {address!r}: {malformed}"
            if malformed
            else exposure_problem(address, transport.curve, transport.keys_dir, transport.launcher == Launcher.RAY)
        )
        if problem:
            raise AddressError(problem)
        self.roster, self.dispatcher = roster, dispatcher
        self.max_bytes, self.heartbeat_s = transport.max_message_bytes, transport.heartbeat_s
        self.keys = server_keys(address, transport.keys_dir)
        self.setup_frame = Message(())  # what every worker gets after its hello: set by set_up()
        self.rejections = Rejections()
        self.joined: dict[str, int] = {}  # every worker started by hand that joined: name -> its pid
        self.initial_model: dict[str, np.ndarray] | None = None  # the first local worker's, in its ready
        self.ctx = zmq.Context()
        self.auth: ThreadAuthenticator | None = None
        self.sock = self.ctx.socket(zmq.ROUTER)
        try:
            self._bind(address)
        except BaseException:
            self.close()
            raise

    def set_up(self, scenario: dict[str, Any], wire_log: str = "") -> None:
        """Every worker, local or joining, is set up with `scenario`: before the first worker is waited for."""
        self.setup_frame = protocol.encode(
            MessageType.SETUP, scenario=scenario, wire_log=wire_log, heartbeat_s=self.heartbeat_s
        )

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

    @property
    def closed(self) -> bool:
        return bool(self.sock.closed)

    def close(self) -> None:
        if self.rejections.rejected:
            log.warning("rejected %d messages in all: %s", self.rejections.rejected, self.rejections.reasons)
        if self.auth is not None:
            self.auth.stop()
        self.sock.close()
        self.ctx.term()

    # --- sending -------------------------------------------------------------------------------
    def send(self, w: Worker, message: Message) -> bool:
        """Send without blocking: False if ZeroMQ cannot take it now, Disconnected if `w` is gone. The
        tensor frames go uncopied (ZeroMQ keeps the arrays alive until they are sent): nothing writes
        the model while a round's tasks run, and each reply answers a task already delivered."""
        try:
            self.sock.send_multipart([w.ident, *message.frames], flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            raise Disconnected(w) from None

    def send_quietly(self, ident: bytes, message: Message) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.sock.send_multipart([ident, *message.frames], flags=zmq.NOBLOCK)

    # --- receiving -----------------------------------------------------------------------------
    def read(self, timeout_s: float) -> Iterator[Received]:
        """The messages waiting, or arriving within `timeout_s`: at most BATCH, one at a time."""
        if not self.sock.poll(int(timeout_s * 1000)):
            return
        for _ in range(BATCH):
            if not self.sock.poll(0):
                return
            yield self._recv_parts()

    def _recv_parts(self) -> Received:
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

    def receive(self, ident: bytes, frames: list[memoryview], dropped: int = 0) -> None:
        """Check one message and act on it, or count it rejected. Raises only Disconnected: the
        worker that said hello is gone before its setup could be sent."""
        sender = self.roster.get(ident)
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
        if self.roster.is_dead(ident):  # what it sent before we stopped it, read only now
            self._reject(ident, "dead_worker", f"{kind} from a worker declared dead")
            return
        if "worker" in msg and msg["worker"].encode() != ident:  # a name is only ever its sender's own
            self._reject(ident, "identity_mismatch", f"{kind} as {msg['worker']!r} on connection {_short(ident)}")
            return
        if kind == MessageType.HELLO:
            self._greet(ident, msg)
            return
        w = self.roster.get(ident)
        if w is None or not w.greeted:
            self._reject(ident, "unknown_worker", f"{kind} from a peer that never said hello")
        elif kind == MessageType.READY:
            w.ready = True
            if self.initial_model is None and w.local:
                # one of our own workers (this machine, this code) built the model the server would
                # build; a worker that joined from elsewhere may run another torch
                self.initial_model = {k: np.array(v) for k, v in msg["model"].items()}
        elif kind in (MessageType.UPDATE, MessageType.COMPRESSED, MessageType.ERROR):
            self._answer(w, msg, nbytes)
        elif kind == MessageType.REJECTED:
            self._refused(w, msg)
        elif kind != MessageType.HEARTBEAT:
            self._reject(ident, "unexpected_type", f"{kind} is not a worker's message")

    def _greet(self, ident: bytes, msg: dict[str, Any]) -> None:
        w = self.roster.get(ident)
        if w is not None and w.greeted:
            self._reject(ident, "duplicate_worker", f"second hello from {w.name}")
            return
        if w is None:  # a worker started by hand elsewhere joins the run
            w = Worker(ident=ident)
            self.roster.add(w)
            self.joined[w.name] = msg["pid"]
            log.info("worker %s joined from pid %s", w.name, msg["pid"])
        w.greeted, w.last_seen = True, time.monotonic()
        self.send(w, self.setup_frame)

    def _answer(self, w: Worker, msg: dict[str, Any], nbytes: int) -> None:
        """An update or error answers the task its sender holds in the round in progress, or it is stale."""
        t = w.task
        if self.dispatcher.replies is None or t is None or (msg["round"], msg["client"]) != (t.round, t.client):
            self._stale(w, msg)
            return
        self.dispatcher.settle(w, msg, nbytes)

    def _stale(self, w: Worker, msg: dict[str, Any]) -> None:
        """A reply (or rejection) for no task `w` holds is counted `stale`. A late one, owed by a task that
        already failed, is only dropped; any other came in place of the reply to the task `w` holds (a
        worker answers in order), which fails now, so that the worker is free again rather than held
        until transport.worker_timeout_s."""
        t, rnd, client = w.task, msg["round"], msg["client"]
        held = f"it holds round {t.round} client {t.client}" if t else "it holds no task"
        what = f"{msg['type']} for round {_unread(rnd)} client {_unread(client)}"
        self._reject(w.ident, "stale", f"{what}, {held}")
        if t is None or self.dispatcher.replies is None:
            return
        if rnd is not None and client is not None and self.dispatcher.late(w, rnd, client):
            return
        self.dispatcher.fail_task(w, f"worker {w.name} sent a {what} in reply to this task")

    def _refused(self, w: Worker, msg: dict[str, Any]) -> None:
        """`w` rejected a message of the server's: the setup while it is not ready, else the task it holds
        (whose round and client the rejection names, where it could read them). The server checks that
        message itself (protocol.own_problem): failing there too, it is the server's fault and the run
        stops (OwnFault); passing, the worker is at fault: the task fails as an error reply's
        would, and a worker that cannot take the setup is dropped (Unfit)."""
        said = f"{msg['reason']}: {msg['detail']}"[:300]
        t = w.task
        if not w.ready and msg["of_type"] in (MessageType.SETUP, ""):
            problem = protocol.own_problem(self.setup_frame, self.max_bytes)
            if problem:
                raise OwnFault(f"worker {w.name} rejected the setup: {problem}")
            why = f"worker {w.name} rejected the setup, which the server's own check passes: {said}"
            raise Unfit(w, why, said.splitlines()[0])
        owed = t is not None and all(msg[k] in (None, v) for k, v in (("round", t.round), ("client", t.client)))
        if t is None or self.dispatcher.replies is None or not owed or msg["of_type"] not in TASK_KINDS:
            self._stale(w, msg)
            return
        problem = protocol.own_problem(t.message, self.max_bytes) if t.message is not None else ""
        if problem:
            raise OwnFault(f"round {t.round}: worker {w.name} rejected the task: {problem}")
        self.dispatcher.fail_task(w, f"worker {w.name} rejected its task, which the server's own check passes: {said}")

    def _reject_malformed(self, ident: bytes, reason: str, detail: str) -> None:
        """A worker that sends garbage has broken the reply it owed: fail its task now rather
        than at the timeout. (Only its own connection can carry its identity.)"""
        self._reject(ident, reason, detail)
        w = self.roster.get(ident)
        if w is not None:
            self.dispatcher.fail_task(w, f"bad reply from worker {w.name}: {detail}")

    def _reject(self, ident: bytes, reason: str, detail: str) -> None:
        r = self.rejections
        r.rejected += 1
        n = r.reasons[reason] = r.reasons.get(reason, 0) + 1
        if n <= LOG_FIRST:
            more = f" (further {reason} rejections are counted, not logged)" if n == LOG_FIRST else ""
            log.warning("rejected a message from %s: %s: %s%s", _short(ident), reason, detail[:200], more)


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


def _unread(v: int | None) -> str:
    return "(unread)" if v is None else str(v)


def _short(ident: bytes) -> str:
    text = repr(ident)
    return text if len(text) <= 60 else text[:60] + "..."

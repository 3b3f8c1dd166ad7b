"""The server's evaluator: a process of its own (`python -m nodes.worker --evaluator`, forked from the
workers' zygote with them) that builds the initial model as the seed gives it and evaluates the
global model on the test set. The server itself never imports torch: that import and the model's
build used to take the cores from the workers as the first round trained (python -m bench --only w2).

It talks to the server over an ipc:// socket in the server's private directory, with the workers'
messages (nodes/contracts/protocol.py: hello, evaluator_setup, ready, evaluate, evaluation, shutdown), each
decoded with its checks. Its set-up carries the test set where the server has drawn it (synthetic
data, nodes.data.federated.ServerData), so that drawing it again does not take the cores from the
first rounds' training. One thread here owns the socket (ZeroMQ sockets are not thread-safe): every
request is a job on it, answered by a Future; one request is in flight at a time.

A process that ends (a kill, the OOM killer) is restarted, at most `transport.max_restarts` times
as a worker slot is: it holds nothing the server cannot send again, the scenario and then the
weights it was evaluating, so the new one is set up and asked again, and answers with the same
numbers. Each end is recorded (`deaths`: run.json's transport.evaluator_deaths).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from nodes.contracts import protocol
from nodes.contracts.protocol import MessageType
from nodes.contracts.tasks import Weights
from nodes.transport.supervisor import start_evaluator

if TYPE_CHECKING:
    from nodes.data.federated import Samples
    from nodes.transport.supervisor import LocalProcess

log = logging.getLogger("dpfl.evaluator")
NAME = "evaluator"  # its ZeroMQ identity is NAME.<restarts before it>, as it says in its hello
POLL_MS = 100  # how often a wait for its reply checks that it still runs
HEARTBEAT_S = 60.0  # its heartbeats are not read: only its process is watched
GRACE_S = 5.0  # how long close() waits for it to exit before killing it


class EvaluatorError(RuntimeError):
    """The evaluator process ended, sent what it should not have, or its evaluation failed."""


class _Rejected(EvaluatorError):
    """The evaluator rejected the server's message (protocol.FIELDS['rejected']). The run stops in one line
    (`blamed`) naming the server's own check of that message where it fails too, else what the evaluator said."""

    def __init__(self, kind: str, said: str) -> None:
        super().__init__(f"the evaluator rejected the server's {kind}: {said}")
        self.kind, self.said = kind, said

    def blamed(self, message: protocol.Message, max_bytes: int, rnd: int | None) -> EvaluatorError:
        problem = protocol.own_problem(message, max_bytes)
        during = f"round {rnd}: " if rnd is not None else ""
        return EvaluatorError(f"{during}the evaluator rejected the server's {self.kind}: {problem or self.said}")


class _Ended(EvaluatorError):
    """The evaluator process ended before it answered: it is restarted, if it may be."""

    def __init__(self, code: int, kind: str) -> None:
        super().__init__(f"the evaluator process ended (exit {code}) before its {kind}")
        self.code = code


class EvaluatorProcess:
    """The server's end: the socket, the thread that owns it, and the process once started."""

    def __init__(self, address: str, max_bytes: int, max_restarts: int = 0, device: str = "") -> None:
        """Bind `address` (an ipc:// path in a private directory); WorkerPool.start forks the process,
        which is restarted at most `max_restarts` times, and evaluates on `device` ('': the scenario's)."""
        self.address, self.max_bytes, self.max_restarts, self.device = address, max_bytes, max_restarts, device
        self.proc: LocalProcess | None = None  # set once started (WorkerPool.start), replaced by each restart
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
        self._sock.bind(address)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="evaluator")
        self._requests = 0
        self._closing = threading.Event()  # ends a wait for a reply that close() no longer needs
        self._failed: BaseException | None = None  # why its set-up failed, or why it ended for good
        self._setup = protocol.Message(())  # what every one of its processes is set up with (set_up)
        self._initial: Weights | None = None  # the first process's initial model: every restart's must be it
        self._restarts = 0
        # The thread replaces the process as the run's thread reads pids() and deaths() for run.json.
        self._lock = threading.Lock()
        self._ended: dict[str, int | None] = {}  # every process that ended: name -> its pid
        self._deaths: list[dict[str, Any]] = []

    @property
    def name(self) -> str:
        """The current process's name and ZeroMQ identity."""
        return f"{NAME}.{self._restarts}"

    def args(self) -> list[str]:
        """What `python -m nodes.worker` runs as this evaluator with."""
        return self._args(self.name)

    def _args(self, name: str) -> list[str]:
        args = ["--evaluator", "--connect", self.address, "--id", name, "--max-message-bytes", str(self.max_bytes)]
        return args + (["--device", self.device] if self.device else [])

    def set_up(self, scenario: dict[str, Any], test: Samples | None = None) -> Future[Weights]:
        """Answer its hello with the scenario and `test`, the test set as the server drew it (None, or
        one over the message limit: the evaluator builds it); the Future is its initial model."""
        return self._thread.submit(self._set_up, scenario, test)

    def evaluate(self, rnd: int, weights: Weights) -> Future[tuple[float, float]]:
        """(test loss, test accuracy) of `weights`, round `rnd`'s model, after set_up."""
        return self._thread.submit(self._evaluate, rnd, weights)

    def pids(self) -> dict[str, int]:
        """Every evaluator process started so far, by name (run.json's `evaluator`, as `workers`)."""
        with self._lock:
            pids = {**self._ended, self.name: self.proc.pid if self.proc is not None else None}
        return {name: pid for name, pid in pids.items() if pid is not None}

    def deaths(self) -> list[dict[str, Any]]:
        """Each end of an evaluator process: which, its pid and exit status (and signal), the round it
        was evaluating (None: setting up), when, and whether it was restarted."""
        with self._lock:
            return list(self._deaths)

    def ask_to_exit(self) -> None:
        """Tell its process to exit, without waiting for it (close() waits): a run's end lets it exit
        while the workers do. It evaluates nothing more; asking again does nothing."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._thread.shutdown(wait=True, cancel_futures=True)
        with contextlib.suppress(zmq.ZMQError):
            self._sock.send_multipart(
                [self.name.encode(), *protocol.encode(MessageType.SHUTDOWN).frames], flags=zmq.NOBLOCK
            )

    def close(self) -> None:
        """Ask it to exit (if not yet asked), give it GRACE_S, then kill it. Closing again does nothing."""
        if self._sock.closed:
            return
        self.ask_to_exit()
        try:
            if self.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=GRACE_S)
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._sock.close()
            self._ctx.term()

    def _set_up(self, scenario: dict[str, Any], test: Samples | None) -> Weights:
        try:
            setup = {"scenario": scenario, "heartbeat_s": HEARTBEAT_S}
            self._setup = protocol.encode(
                MessageType.EVALUATOR_SETUP, **setup, test=dict(zip("xy", test)) if test else {}
            )
            if len(self._setup) > self.max_bytes:  # the message's frames are views: encoding copies nothing
                self._setup = protocol.encode(MessageType.EVALUATOR_SETUP, **setup, test={})
            return self._serving(None)
        except BaseException as e:
            self._failed = e  # every evaluation raises it: the initial model's Future may go unread
            raise

    def _serving(self, rnd: int | None) -> Weights:
        """Set the process up, restarting it as it ends; its initial model, which must be the first's
        (emulator/run/lifecycle.py checks the first's against the local workers')."""
        while True:
            try:
                self._receive(MessageType.HELLO)
                self._send(self._setup)
                model = {k: np.array(v) for k, v in self._receive(MessageType.READY)["model"].items()}
                break
            except _Ended as ended:
                self._restart(ended, rnd)
            except _Rejected as rejected:
                self._failed = rejected.blamed(self._setup, self.max_bytes, rnd)
                raise self._failed from None
        if self._initial is None:
            self._initial = model
        elif model.keys() != self._initial.keys() or any(
            not np.array_equal(model[k], v) for k, v in self._initial.items()
        ):
            self._failed = EvaluatorError(
                f"the restarted evaluator {self.name}'s initial model differs from the first's: "
                "the same code, seed and torch should build it bit for bit"
            )
            raise self._failed
        return model

    def _evaluate(self, rnd: int, weights: Weights) -> tuple[float, float]:
        if self._failed is not None:
            raise self._failed
        self._requests += 1
        request = protocol.encode(MessageType.EVALUATE, request=self._requests, model=weights)
        while True:
            self._send(request)
            try:
                reply = self._receive(MessageType.EVALUATION)
                break
            except _Ended as ended:
                self._restart(ended, rnd)
                self._serving(rnd)
            except _Rejected as rejected:
                self._failed = rejected.blamed(request, self.max_bytes, rnd)
                raise self._failed from None
        if reply["request"] != self._requests:
            raise EvaluatorError(f"the evaluator answered request {reply['request']}, expected {self._requests}")
        if reply["error"]:
            raise EvaluatorError(f"the global model's evaluation failed: {reply['error']}")
        return float(reply["loss"]), float(reply["accuracy"])

    def _restart(self, ended: _Ended, rnd: int | None) -> None:
        """Record the end of the process and start another in its place, or raise why not: its
        restarts are spent, it would not start, or the run is ending."""
        assert self.proc is not None  # only a process can end
        during = ended if rnd is None else f"{ended}, for round {rnd}"
        proc, why = None, ""
        if self._restarts >= self.max_restarts:
            spent = ", all spent" if self._restarts else ""
            why = f"not restarted (transport.max_restarts = {self.max_restarts}{spent})"
        elif not self._closing.is_set():
            try:
                proc = start_evaluator(self._args(f"{NAME}.{self._restarts + 1}"))
            except OSError as e:
                why = f"its restart failed: {e}"
        with self._lock:
            self._deaths.append(
                {
                    "process": self.name,
                    "pid": self.proc.pid,
                    "exit": ended.code,
                    "signal": _signal_name(ended.code),
                    "round": rnd,
                    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "restarted": proc is not None,
                }
            )
            if proc is not None:
                self._ended[self.name] = self.proc.pid
                self._restarts += 1
                self.proc = proc
        if proc is None:
            self._failed = EvaluatorError(f"{during}: {why}") if why else ended
            raise self._failed
        log.warning("%s: restarted (%d of transport.max_restarts = %d)", during, self._restarts, self.max_restarts)

    def _send(self, message: protocol.Message) -> None:
        self._sock.send_multipart([self.name.encode(), *message.frames], copy=False)

    def _receive(self, kind: str) -> dict[str, Any]:
        """Its next message but heartbeats, which must be of `kind`; its end raises _Ended."""
        while True:
            if not self._sock.poll(POLL_MS):
                code = self.proc.poll() if self.proc is not None else None
                if code is not None:
                    raise _Ended(code, kind)
                if self._closing.is_set():
                    raise EvaluatorError(f"the run ended before the evaluator's {kind}")
                continue
            ident, *frames = self._sock.recv_multipart(copy=False)
            try:
                msg = protocol.decode([f.buffer for f in frames], self.max_bytes)
            except protocol.ProtocolError as e:
                raise EvaluatorError(f"the evaluator sent a message that does not decode: {e}") from None
            if ident.bytes != self.name.encode():
                if ident.bytes.decode(errors="replace") in self._ended:  # sent before it ended, read only now
                    continue
                raise EvaluatorError(f"a {msg['type']} from {ident.bytes[:60]!r} on the evaluator's socket")
            if msg["type"] == MessageType.HEARTBEAT:
                continue
            if msg["type"] == MessageType.REJECTED:  # what it will never answer: said at once, not waited for
                raise _Rejected(msg["of_type"] or "message", f"{msg['reason']}: {msg['detail']}"[:300])
            if msg["type"] != kind:
                raise EvaluatorError(f"the evaluator sent {msg['type']}, expected {kind}")
            return msg


def _signal_name(code: int) -> str | None:
    """The signal that ended a process of exit status `code` (Popen's: -9 for SIGKILL), by name."""
    try:
        return signal.Signals(-code).name
    except ValueError:  # an exit, or a signal without a name (a real-time one)
        return None

"""The server's evaluator: a process of its own (`python -m nodes.worker --evaluator`, forked from the
workers' zygote with them) that builds the initial model as the seed gives it and evaluates the
global model on the test set. The server itself never imports torch: that import (~1.5 s of CPU)
and the model's build used to take the cores from the workers as the first round trained.

It talks to the server over an ipc:// socket in the server's private directory, with the workers'
messages (nodes/protocol.py: hello, setup, ready, evaluate, evaluation, shutdown), each decoded
with its checks. One thread here owns the socket (ZeroMQ sockets are not thread-safe): every
request is a job on it, answered by a Future; one request is in flight at a time.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from nodes import protocol

if TYPE_CHECKING:
    from nodes.pool import Process

NAME = "evaluator"  # its ZeroMQ identity, as it says in its hello
POLL_MS = 100  # how often a wait for its reply checks that it still runs
HEARTBEAT_S = 60.0  # its heartbeats are not read: only its process is watched
GRACE_S = 5.0  # how long close() waits for it to exit before killing it

Weights = dict[str, np.ndarray]


class EvaluatorError(RuntimeError):
    """The evaluator process ended, sent what it should not have, or its evaluation failed."""


class EvaluatorProcess:
    """The server's end: the socket, the thread that owns it, and the process once started."""

    def __init__(self, address: str, max_bytes: int) -> None:
        """Bind `address` (an ipc:// path in a private directory); start() forks the process."""
        self.address, self.max_bytes = address, max_bytes
        self.proc: Process | None = None  # set once started (WorkerPool.start)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
        self._sock.bind(address)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="evaluator")
        self._requests = 0
        self._closing = threading.Event()  # ends a wait for a reply that close() no longer needs
        self._failed: BaseException | None = None  # why its set-up failed

    def args(self) -> list[str]:
        """What `python -m nodes.worker` runs as this evaluator with."""
        return ["--evaluator", "--connect", self.address, "--id", NAME, "--max-message-bytes", str(self.max_bytes)]

    def set_up(self, scenario: dict[str, Any]) -> Future[Weights]:
        """Answer its hello with the scenario; the Future is its initial model."""
        return self._thread.submit(self._set_up, scenario)

    def evaluate(self, weights: Weights) -> Future[tuple[float, float]]:
        """(test loss, test accuracy) of `weights`, after set_up."""
        return self._thread.submit(self._evaluate, weights)

    def close(self) -> None:
        """Ask it to exit, give it GRACE_S, then kill it. Closing again does nothing."""
        if self._sock.closed:
            return
        self._closing.set()
        self._thread.shutdown(wait=True, cancel_futures=True)
        with contextlib.suppress(zmq.ZMQError):
            self._sock.send_multipart([NAME.encode(), *protocol.encode("shutdown").frames], flags=zmq.NOBLOCK)
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

    def _set_up(self, scenario: dict[str, Any]) -> Weights:
        try:
            self._receive("hello")
            self._send(protocol.encode("setup", scenario=scenario, wire_log="", heartbeat_s=HEARTBEAT_S))
            return {k: np.array(v) for k, v in self._receive("ready")["model"].items()}
        except BaseException as e:
            self._failed = e  # every evaluation raises it: the initial model's Future may go unread
            raise

    def _evaluate(self, weights: Weights) -> tuple[float, float]:
        if self._failed is not None:
            raise self._failed
        self._requests += 1
        self._send(protocol.encode("evaluate", request=self._requests, model=weights))
        reply = self._receive("evaluation")
        if reply["request"] != self._requests:
            raise EvaluatorError(f"the evaluator answered request {reply['request']}, expected {self._requests}")
        if reply["error"]:
            raise EvaluatorError(f"the global model's evaluation failed: {reply['error']}")
        return float(reply["loss"]), float(reply["accuracy"])

    def _send(self, message: protocol.Message) -> None:
        self._sock.send_multipart([NAME.encode(), *message.frames], copy=False)

    def _receive(self, kind: str) -> dict[str, Any]:
        """Its next message but heartbeats, which must be of `kind`; its end raises EvaluatorError."""
        while True:
            if not self._sock.poll(POLL_MS):
                code = self.proc.poll() if self.proc is not None else None
                if code is not None:
                    raise EvaluatorError(f"the evaluator process ended (exit {code}) before its {kind}")
                if self._closing.is_set():
                    raise EvaluatorError(f"the run ended before the evaluator's {kind}")
                continue
            ident, *frames = self._sock.recv_multipart(copy=False)
            try:
                msg = protocol.decode([f.buffer for f in frames], self.max_bytes)
            except protocol.ProtocolError as e:
                raise EvaluatorError(f"the evaluator sent a message that does not decode: {e}") from None
            if ident.bytes != NAME.encode():
                raise EvaluatorError(f"a {msg['type']} from {ident.bytes[:60]!r} on the evaluator's socket")
            if msg["type"] == "heartbeat":
                continue
            if msg["type"] != kind:
                raise EvaluatorError(f"the evaluator sent {msg['type']}, expected {kind}")
            return msg

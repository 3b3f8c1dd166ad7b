"""Server node: a ZeroMQ ROUTER that supervises worker processes and runs a round's tasks.

Workers are stateless: any idle worker takes the next task (in client-id order), so the
number of workers changes only wall-clock time. A worker that dies or stops answering
costs the tasks it held (reported as failures) and, when it is one of ours, is restarted.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import zmq

from nodes import protocol
from nodes.protocol import ProtocolError

log = logging.getLogger("dpfl.server")
PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Reply:
    """A task's outcome on the real system: the update message, or why there is none."""
    client: int
    message: Optional[dict] = None
    nbytes: int = 0
    failure: str = ""


@dataclass
class Worker:
    ident: bytes
    proc: Optional[subprocess.Popen] = None   # None for a worker that joined from elsewhere
    ready: bool = False
    task: Optional[tuple[int, int, float]] = None   # (round, client, real time sent)
    deaths: int = 0


@dataclass
class Counters:
    rejected: int = 0
    stale: int = 0
    worker_deaths: int = 0
    reasons: dict = field(default_factory=dict)


class WorkerPool:
    def __init__(self, address: str, scenario: dict, n_local: int, max_message_bytes: int,
                 timeout_s: float, wire_log: str = ""):
        self.address, self.scenario, self.max_bytes = address, scenario, max_message_bytes
        self.timeout_s, self.wire_log = timeout_s, wire_log
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.sock.bind(address)
        self.address = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()  # resolves tcp://host:0
        self.workers: dict[bytes, Worker] = {}
        self.counters = Counters()
        self._spawned = 0
        for _ in range(n_local):
            self._spawn()

    # --- lifecycle -----------------------------------------------------------------------
    def _spawn(self, deaths: int = 0) -> None:
        ident = f"local-{self._spawned}".encode()
        self._spawned += 1
        cmd = [sys.executable, "-m", "nodes.worker", "--connect", self.address, "--id", ident.decode(),
               "--parent", str(os.getpid()), "--max-message-bytes", str(self.max_bytes)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen(cmd, env=env, cwd=PROJECT_ROOT)
        self.workers[ident] = Worker(ident=ident, proc=proc, deaths=deaths)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until every local worker has loaded the data and model."""
        deadline = time.monotonic() + timeout_s
        while not all(w.ready for w in self.workers.values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready after {timeout_s:.0f} s")
            self._poll(0.1)
            self._reap(lambda *_: None)

    def pids(self) -> dict[str, int]:
        return {w.ident.decode(): w.proc.pid for w in self.workers.values() if w.proc is not None}

    def close(self) -> None:
        for w in self.workers.values():
            try:
                self.sock.send_multipart([w.ident, protocol.encode("shutdown")], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        deadline = time.monotonic() + 5
        for w in self.workers.values():
            if w.proc is None:
                continue
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        self.sock.close(linger=0)
        self.ctx.term()

    # --- a round's tasks -------------------------------------------------------------------
    def run_tasks(self, rnd: int, frames: list[tuple[int, bytes]]) -> dict[int, Reply]:
        """Send each (client, task frame) to an idle worker; return every client's Reply."""
        pending = deque(frames)
        replies: dict[int, Reply] = {}

        def fail(client: int, why: str) -> None:
            replies[client] = Reply(client=client, failure=why)

        while len(replies) < len(frames):
            for w in sorted(self.workers.values(), key=lambda w: w.ident):
                if pending and w.ready and w.task is None:
                    client, frame = pending.popleft()
                    self.sock.send_multipart([w.ident, frame])
                    w.task = (rnd, client, time.monotonic())
            self._poll(0.05, rnd, replies)
            self._reap(fail)
        return replies

    def _poll(self, timeout_s: float, rnd: int = -1, replies: Optional[dict] = None) -> None:
        if not self.sock.poll(int(timeout_s * 1000)):
            return
        while self.sock.poll(0):
            parts = self.sock.recv_multipart()
            if len(parts) != 2:
                self._reject(b"?", f"{len(parts)} frames")
                continue
            ident, frame = parts
            try:
                msg = protocol.decode(frame, self.max_bytes)
            except ProtocolError as e:
                self._reject(ident, str(e))
                continue
            self._handle(ident, msg, len(frame), rnd, replies)

    def _handle(self, ident: bytes, msg: dict, nbytes: int, rnd: int, replies: Optional[dict]) -> None:
        kind = msg["type"]
        w = self.workers.get(ident)
        if kind == "hello":
            if w is None:  # a worker started by hand elsewhere joins the run
                w = self.workers[ident] = Worker(ident=ident)
                log.info("worker %s joined from pid %s", ident.decode(), msg.get("pid"))
            self.sock.send_multipart([ident, protocol.encode("setup", scenario=self.scenario, wire_log=self.wire_log)])
            return
        if w is None:
            self._reject(ident, f"{kind} from unknown worker")
            return
        if kind == "ready":
            w.ready = True
            return
        if kind in ("update", "error"):
            if w.task is None or (msg["round"], msg["client"]) != w.task[:2] or replies is None:
                self.counters.stale += 1
                log.warning("stale %s from %s for round %s client %s", kind, ident.decode(), msg["round"], msg["client"])
                return
            client = w.task[1]
            w.task = None
            replies[client] = (Reply(client=client, message=msg, nbytes=nbytes) if kind == "update"
                               else Reply(client=client, failure=f"worker error: {msg['message']}"))
            return
        self._reject(ident, f"unexpected {kind}")

    def _reject(self, ident: bytes, why: str) -> None:
        self.counters.rejected += 1
        self.counters.reasons[why.split(":")[0]] = self.counters.reasons.get(why.split(":")[0], 0) + 1
        log.warning("rejected message from %r: %s", ident, why)

    def _reap(self, fail) -> None:
        """Dead or silent workers lose their task; our own are restarted."""
        now = time.monotonic()
        for ident, w in list(self.workers.items()):
            died = w.proc is not None and w.proc.poll() is not None
            hung = w.task is not None and now - w.task[2] > self.timeout_s
            if not (died or hung):
                continue
            why = f"worker {ident.decode()} died (exit {w.proc.returncode})" if died else \
                f"worker {ident.decode()} silent for {self.timeout_s:.0f} s"
            log.warning(why)
            self.counters.worker_deaths += 1
            if w.task is not None:
                fail(w.task[1], why)
            del self.workers[ident]
            if w.proc is not None:
                if not died:
                    w.proc.kill()
                    w.proc.wait()
                self._spawn(deaths=w.deaths + 1)

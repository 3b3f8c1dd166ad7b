"""Worker pool: the server's side of its workers, one facade over three parts and the loops that drive them.

InboundGate (nodes/transport/inbound.py) owns the ZeroMQ ROUTER socket and checks everything that arrives
on it; Supervisor (nodes/transport/supervisor.py) starts the workers, declares the dead, restarts them and
shuts them down; Dispatcher (nodes/transport/dispatch.py) hands a round's tasks to idle workers and collects
the replies. The workers' records are the Roster's (nodes/transport/roster.py). The pool waits for the
workers to be ready (wait_ready) and runs a round's tasks (run_tasks): in both, it reads what
arrived, then has the supervisor check on the workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nodes.transport.dispatch import Dispatcher, Reply
from nodes.transport.inbound import Disconnected, InboundGate, OwnFault, Unfit
from nodes.transport.roster import Roster, Worker
from nodes.transport.supervisor import LocalProcess, NoWorkersLeft, Supervisor, WorkerLauncher

if TYPE_CHECKING:
    import numpy as np

    from nodes.contracts.protocol import Message
    from nodes.contracts.schema import TransportConfig
    from nodes.transport.zygote import Zygote

POLL_S = 0.05  # how long the task loop waits for a message before checking on workers
MEANWHILE_POLL_S = 0.002  # ... and while the server's own work waits to be done (run_tasks' meanwhile)


class RejectedByWorker(NoWorkersLeft):
    """A worker rejected a message of the server's that the server's own check fails too (inbound.OwnFault):
    the run stops in one line naming the server's side of it, blaming and restarting no worker. (A
    NoWorkersLeft only so that the command line reports it as it does that: one line, exit 1.)"""


@dataclass
class Counters:
    """The transport's counters in run.json: the gate's rejections, then the supervisor's deaths."""

    rejected: int
    reasons: dict[str, int]
    worker_deaths: int
    death_causes: dict[str, int]
    restarts: int
    retired_slots: list[int]


class WorkerPool:
    def __init__(self, address: str, transport: TransportConfig):
        """Bind `address` (the resolved transport.address; `transport` is the scenario's
        TransportConfig). Nothing is started until start(): a bad address costs nothing."""
        self.workers = Roster()
        self.dispatcher = Dispatcher(self.workers)
        self.gate = InboundGate(address, transport, self.workers, self.dispatcher)
        self.supervisor = Supervisor(transport, self.workers, self.gate, self.dispatcher)

    def start(
        self, n_local: int, evaluator: list[str] | None = None, devices: list[str] | None = None
    ) -> LocalProcess | None:
        """Start `n_local` workers, each on its device if `devices` are given, and, given its arguments,
        the evaluator (Supervisor.start)."""
        return self.supervisor.start(n_local, evaluator, devices)

    def set_up(self, scenario: dict[str, Any], wire_log: str = "") -> None:
        """Every worker, local or joining, is set up with `scenario`: before the first `wait_ready`. Its
        train.bundle is how many clients a unit of work holds (nodes.transport.dispatch): a K, as the run
        resolved `auto` (emulator.run.bundles)."""
        self.gate.set_up(scenario, wire_log)
        self.dispatcher.bundle = int(scenario.get("train", {}).get("bundle", 1))

    def wait_ready(self, min_workers: int = 0, timeout_s: float = 300.0) -> None:
        """Block until every local worker has loaded the data and model and at least
        `min_workers` workers (local or joined from elsewhere) are ready."""
        deadline = time.monotonic() + timeout_s
        self.supervisor.listen()
        while True:
            ours = self.workers.ours()
            if not ours and not min_workers:
                raise NoWorkersLeft(self.supervisor.no_workers_message())
            ready = sum(w.ready for w in self.workers.values())
            if all(w.ready for w in ours) and ready >= min_workers:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{ready} workers ready after {timeout_s:.0f} s, "
                    f"{max(min_workers, len(ours))} expected (transport.min_workers)"
                )
            self._poll(0.1)
            self._reap()

    def run_tasks(
        self, rnd: int, frames: list[tuple[int, Message]], meanwhile: Callable[[], bool] | None = None
    ) -> dict[int, Reply]:
        """Send each (client, task message) to an idle worker; return every client's Reply. `meanwhile`, the
        server's own work while they train, is offered a turn after each hand-out until it says it is done
        (True); it must not block. While it is not, the loop polls every MEANWHILE_POLL_S."""
        replies = self.dispatcher.begin(rnd, frames)
        self.supervisor.listen()
        try:
            while len(replies) < len(frames):
                self.dispatcher.hand_out(self._send)
                if meanwhile is not None and meanwhile():
                    meanwhile = None
                self._poll(POLL_S if meanwhile is None else MEANWHILE_POLL_S)
                self._reap()
                if not any(w.ready or w.proc is not None for w in self.workers.values()):
                    raise NoWorkersLeft(self.supervisor.no_workers_message())
            return replies
        finally:
            self.dispatcher.end()

    def close(self) -> None:
        """Shut every worker down (Supervisor.shut_down), then the socket. Closing again does nothing."""
        if self.gate.closed:
            return
        try:
            self.supervisor.shut_down()
        finally:
            self.gate.close()
            if self.launcher is not None:  # last: its own errors leave no socket open
                self.launcher.close()

    def pids(self) -> dict[str, int]:
        """Every local worker process started so far (restarted ones included), by name."""
        return self.supervisor.pids()

    def remote_pids(self) -> dict[str, int]:
        """Every worker started elsewhere (by hand) that joined so far, by name: the pid it gave in its hello."""
        return dict(self.gate.joined)

    # --- the steps of the loops -------------------------------------------------------------------
    def _poll(self, timeout_s: float) -> None:
        for received in self.gate.read(timeout_s):
            self._receive(*received)

    def _receive(self, ident: bytes, frames: list[memoryview], dropped: int = 0) -> None:
        try:
            self.gate.receive(ident, frames, dropped)
        except Disconnected as gone:  # a worker whose setup found it gone
            self._bury_disconnected(gone.worker)
        except Unfit as unfit:  # a worker that rejects the run's valid setup
            self.supervisor.bury(unfit.worker, "refused", str(unfit), unfit.said)
        except OwnFault as fault:
            raise RejectedByWorker(str(fault)) from None

    def _send(self, w: Worker, message: Message) -> bool:
        """InboundGate.send; a worker that is no longer connected is dead."""
        try:
            return self.gate.send(w, message)
        except Disconnected:
            self._bury_disconnected(w)
            return False

    def _bury_disconnected(self, w: Worker) -> None:
        self.supervisor.bury(w, "unreachable", f"worker {w.name} disconnected")

    def _reap(self) -> None:
        self.supervisor.reap()

    # --- the parts' state, as the server and the tests read it ------------------------------------
    @property
    def counters(self) -> Counters:
        return Counters(**vars(self.gate.rejections), **vars(self.supervisor.deaths))

    @property
    def replies(self) -> dict[int, Reply] | None:
        return self.dispatcher.replies

    @replies.setter
    def replies(self, replies: dict[int, Reply] | None) -> None:
        self.dispatcher.replies = replies

    @property
    def launcher(self) -> WorkerLauncher | None:
        return self.supervisor.launcher

    @launcher.setter
    def launcher(self, launcher: WorkerLauncher | None) -> None:
        self.supervisor.launcher = launcher

    @property
    def zygote(self) -> Zygote | None:
        return self.supervisor.zygote

    @property
    def address(self) -> str:
        return self.gate.address

    @property
    def max_bytes(self) -> int:
        return self.gate.max_bytes

    @property
    def joined(self) -> dict[str, int]:
        return self.gate.joined

    @property
    def initial_model(self) -> dict[str, np.ndarray] | None:
        return self.gate.initial_model

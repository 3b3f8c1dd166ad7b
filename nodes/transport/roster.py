"""The roster: one record per worker the server knows of, the state the pool's three parts share.

The roster alone adds and removes records: the supervisor adds the workers it starts and removes
the dead, and the inbound gate adds a worker started elsewhere when it says hello. Each part
writes only its own fields of a record (Worker says whose each is).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from nodes.contracts.protocol import Message

ABANDONED_KEPT = 16  # per worker: the tasks failed before it answered them whose late replies are recognised


class Process(Protocol):
    """What the pool needs of one of its workers' processes: subprocess.Popen's own methods."""

    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...  # subprocess.TimeoutExpired when it runs on
    def kill(self) -> None: ...


@dataclass
class Task:
    round: int
    client: int  # the client whose reply is due next
    sent: float  # time.monotonic() when it (its bundle) was sent
    rest: list[int] = field(default_factory=list)  # a bundle's clients whose replies follow, in order
    message: Message | None = None  # what was sent: the server checks it itself when the worker rejects it

    def owes(self, rnd: int, client: int) -> bool:
        """Whether (rnd, client) is one of the replies this task is still owed."""
        return rnd == self.round and (client == self.client or client in self.rest)


@dataclass
class Worker:
    ident: bytes  # its ZeroMQ identity (= the name in its hello)
    # the supervisor's
    proc: Process | None = None  # None for a worker that joined from elsewhere
    slot: int = -1  # local workers: the slot its restarts are counted against
    local: bool = False  # a subprocess of the server (transport.launcher = local): this machine, this code
    # the inbound gate's
    greeted: bool = False  # its hello arrived
    ready: bool = False  # it has built the data and the model
    last_seen: float = field(default_factory=time.monotonic)  # the supervisor's too, when it starts listening
    # the dispatcher's
    task: Task | None = None
    # tasks failed before it answered them (the newest ABANDONED_KEPT): a late reply to one is dropped,
    # where any other stale reply takes the held task's place and fails it (Dispatcher.late)
    abandoned: deque[Task] = field(default_factory=lambda: deque(maxlen=ABANDONED_KEPT))

    @property
    def name(self) -> str:
        return self.ident.decode(errors="replace")


class Roster(Mapping[bytes, Worker]):
    """Every worker the server knows of, by identity: read as a mapping, changed by add and remove."""

    def __init__(self) -> None:
        self._workers: dict[bytes, Worker] = {}
        self._dead: set[bytes] = set()  # the server's own workers declared dead (identities are never reused)

    def __getitem__(self, ident: bytes) -> Worker:
        return self._workers[ident]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._workers)

    def __len__(self) -> int:
        return len(self._workers)

    def add(self, w: Worker) -> None:
        self._workers[w.ident] = w

    def remove(self, w: Worker) -> None:
        """Forget a dead worker. One the server started stays dead: what it sent before it was stopped,
        read only later, is refused (is_dead), and its restart comes under a new identity."""
        del self._workers[w.ident]
        if w.proc is not None:
            self._dead.add(w.ident)

    def is_dead(self, ident: bytes) -> bool:
        return ident in self._dead

    def ours(self) -> list[Worker]:
        """The workers the server started (it holds their processes): its local slots or its launcher's."""
        return [w for w in self._workers.values() if w.proc is not None]

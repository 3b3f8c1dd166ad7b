"""Dispatch: a round's tasks to idle workers, and each client's reply, or why there is none.

Workers are stateless: any idle worker takes the next task (in client-id order; first, though,
a client it trained last, whose data it still holds), so the number of workers changes only
wall-clock time. Which worker trains a client changes no result (nodes.contracts.rng streams).

With train.bundle = K > 1 the unit handed out is a bundle: the round's tasks cut in client-id order
into groups of at most K (`cut_bundles`, a pure function of the round's clients and K), sent as one
`bundle` message (the global model once) and answered by one reply per client, in the bundle's order
(nodes/training/bundle.py trains it). Tasks with an error-feedback residual (`task_residual`) go one by one.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nodes.contracts import protocol
from nodes.contracts.protocol import Message, MessageType
from nodes.transport.roster import Roster, Task, Worker


def cut_bundles(clients: list[int], k: int) -> list[list[int]]:
    """The round's `clients` in client-id order, cut into consecutive bundles of at most `k`."""
    order = sorted(clients)
    return [order[i : i + k] for i in range(0, len(order), k)]


@dataclass
class Reply:
    """A task's outcome on the real system: the update message, or why there is none."""

    client: int
    message: dict[str, Any] | None = None
    nbytes: int = 0
    failure: str = ""


class PendingTasks:
    """A round's units of work not yet sent: each a task, or with `bundle` = K > 1 a bundle of tasks
    (`units`: their indices in `frames`). Each worker is offered first the units whose first client it
    trained last, whose data its cache holds (with any idle worker taking the next client, each worker
    of `python -m bench`'s W1 came to build and hold every client's data); then the next in order."""

    def __init__(self, frames: list[tuple[int, Message]], trainer_of: dict[int, bytes], bundle: int = 1):
        self.frames = frames
        at = {client: i for i, (client, _) in enumerate(frames)}
        self.units = (
            [[at[c] for c in cut] for cut in cut_bundles(list(at), bundle)]
            if bundle > 1
            else [[i] for i in range(len(frames))]
        )
        self.sent = [False] * len(self.units)
        self.left = len(self.units)
        self.in_order = deque(range(len(self.units)))
        self.own: dict[bytes, deque[int]] = {}  # worker -> the units of its former clients, in order
        for u, unit in enumerate(self.units):
            client = frames[unit[0]][0]
            if client in trainer_of:
                self.own.setdefault(trainer_of[client], deque()).append(u)

    def __len__(self) -> int:
        return self.left

    def message(self, u: int) -> Message:
        """Unit `u`'s message: its task's, or its tasks' bundle."""
        unit = self.units[u]
        return self.frames[unit[0]][1] if len(unit) == 1 else protocol.bundle([self.frames[i][1] for i in unit])

    def clients(self, u: int) -> list[int]:
        return [self.frames[i][0] for i in self.units[u]]

    def next_for(self, ident: bytes) -> int:
        """The index in `units` of the unit to offer worker `ident` (there must be one left); with
        bundle = 1 also the index of its task in `frames`."""
        for queue in (self.own.get(ident), self.in_order):
            while queue and self.sent[queue[0]]:
                queue.popleft()
            if queue:
                return queue[0]
        raise IndexError("no task left")

    def mark_sent(self, i: int) -> None:
        self.sent[i] = True
        self.left -= 1


class Dispatcher:
    """Owns the round in progress (its tasks not yet sent and its replies) and, across rounds, which
    worker each client's last task went to. Writes each worker's `task`."""

    def __init__(self, roster: Roster, bundle: int = 1):
        self.roster = roster
        self.bundle = bundle  # train.bundle: K
        self.round = -1  # the round in progress, between begin and end
        self.pending: PendingTasks | None = None  # its tasks not yet sent
        self.replies: dict[int, Reply] | None = None  # its replies so far
        self.trainer_of: dict[int, bytes] = {}  # client -> the worker its last task went to (PendingTasks)

    def begin(self, rnd: int, frames: list[tuple[int, Message]]) -> dict[int, Reply]:
        """Open round `rnd` of (client, task message): its replies, filled in as they come."""
        plain = self.bundle > 1 and all(protocol.kind_of(m) == MessageType.TASK for _, m in frames)
        self.round, self.pending = rnd, PendingTasks(frames, self.trainer_of, self.bundle if plain else 1)
        self.replies = {}
        return self.replies

    def end(self) -> None:
        self.pending = self.replies = None

    def hand_out(self, send: Callable[[Worker, Message], bool]) -> None:
        """Offer each ready worker that holds no task its next task; `send` says whether it went."""
        pending = self.pending
        assert pending is not None  # between begin and end
        for w in sorted(self.roster.values(), key=lambda w: w.ident):
            if pending and w.ready and w.task is None:
                u = pending.next_for(w.ident)
                first, *rest = clients = pending.clients(u)
                message = pending.message(u)
                if send(w, message):
                    pending.mark_sent(u)
                    w.task = Task(self.round, first, time.monotonic(), rest, message)
                    for client in clients:
                        self.trainer_of[client] = w.ident

    def settle(self, w: Worker, msg: dict[str, Any], nbytes: int) -> None:
        """`w`'s update or error, which the inbound gate found to answer the task it holds."""
        t, replies = w.task, self.replies
        assert t is not None and replies is not None  # the gate's check
        w.task = Task(t.round, t.rest[0], t.sent, t.rest[1:], t.message) if t.rest else None  # a bundle's next
        w.abandoned.clear()  # a worker answers in order: no reply to a task before this one is still coming
        replies[t.client] = (
            Reply(client=t.client, message=msg, nbytes=nbytes)
            if msg["type"] in (MessageType.UPDATE, MessageType.COMPRESSED)
            else Reply(client=t.client, failure=f"worker error: {msg['message']}")
        )

    def fail_task(self, w: Worker, why: str) -> None:
        """`w` will not answer the task it holds, if any (every client of its bundle still owed): the reply
        is the failure `why`."""
        if w.task is not None and self.replies is not None:
            for client in (w.task.client, *w.task.rest):
                self.replies[client] = Reply(client=client, failure=why)
        if w.task is not None:  # its replies may still come after the failure: `late` tells them apart
            w.abandoned.append(dataclasses.replace(w.task, message=None))  # not holding a model for them
        w.task = None

    def late(self, w: Worker, rnd: int, client: int) -> bool:
        """Whether (rnd, client) is owed by a task of `w`'s failed before it answered: a late reply, not one
        in place of the reply to the task it holds."""
        return any(t.owes(rnd, client) for t in w.abandoned)

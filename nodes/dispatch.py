"""Dispatch: a round's tasks to idle workers, and each client's reply, or why there is none.

Workers are stateless: any idle worker takes the next task (in client-id order; first, though,
a client it trained last, whose data it still holds), so the number of workers changes only
wall-clock time. Which worker trains a client changes no result (nodes.rng streams).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nodes.protocol import Message
from nodes.roster import Roster, Task, Worker


@dataclass
class Reply:
    """A task's outcome on the real system: the update message, or why there is none."""

    client: int
    message: dict[str, Any] | None = None
    nbytes: int = 0
    failure: str = ""


class PendingTasks:
    """A round's tasks not yet sent. Each worker is offered first the clients it trained last, whose
    data its cache holds (with any idle worker taking the next client, each worker of `python -m
    bench`'s W1 came to build and hold every client's data); then the next in the round's order."""

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


class Dispatcher:
    """Owns the round in progress (its tasks not yet sent and its replies) and, across rounds, which
    worker each client's last task went to. Writes each worker's `task`."""

    def __init__(self, roster: Roster):
        self.roster = roster
        self.round = -1  # the round in progress, between begin and end
        self.pending: PendingTasks | None = None  # its tasks not yet sent
        self.replies: dict[int, Reply] | None = None  # its replies so far
        self.trainer_of: dict[int, bytes] = {}  # client -> the worker its last task went to (PendingTasks)

    def begin(self, rnd: int, frames: list[tuple[int, Message]]) -> dict[int, Reply]:
        """Open round `rnd` of (client, task message): its replies, filled in as they come."""
        self.round, self.pending = rnd, PendingTasks(frames, self.trainer_of)
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
                i = pending.next_for(w.ident)
                client, message = pending.frames[i]
                if send(w, message):
                    pending.mark_sent(i)
                    w.task = Task(self.round, client, time.monotonic())
                    self.trainer_of[client] = w.ident

    def settle(self, w: Worker, msg: dict[str, Any], nbytes: int) -> None:
        """`w`'s update or error, which the inbound gate found to answer the task it holds."""
        t, replies = w.task, self.replies
        assert t is not None and replies is not None  # the gate's check
        w.task = None
        replies[t.client] = (
            Reply(client=t.client, message=msg, nbytes=nbytes)
            if msg["type"] in ("update", "compressed")
            else Reply(client=t.client, failure=f"worker error: {msg['message']}")
        )

    def fail_task(self, w: Worker, why: str) -> None:
        """`w` will not answer the task it holds, if any: the reply is the failure `why`."""
        if w.task is not None and self.replies is not None:
            self.replies[w.task.client] = Reply(client=w.task.client, failure=why)
        w.task = None

"""A round's tasks as the pool hands them out (nodes.transport.dispatch.PendingTasks): each worker first gets the
clients it trained last, whose data it holds, then the next in the round's order."""

import time

import numpy as np
import pytest

from nodes.contracts import protocol
from nodes.contracts.protocol import Message
from nodes.transport.dispatch import Dispatcher, PendingTasks
from nodes.transport.roster import Roster, Task, Worker


def tasks(*clients: int) -> list[tuple[int, Message]]:
    return [(c, Message(())) for c in clients]


def hand_out(pending: PendingTasks, workers: list[bytes]) -> list[tuple[bytes, int]]:
    """Every task, to the workers in turn: (worker, client) in the order they were sent."""
    sent = []
    while pending:
        for w in workers:
            if pending:
                i = pending.next_for(w)
                pending.mark_sent(i)
                sent.append((w, pending.frames[i][0]))
    return sent


def test_without_history_the_tasks_go_out_in_the_rounds_order():
    assert hand_out(PendingTasks(tasks(4, 1, 7), {}), [b"a", b"b"]) == [(b"a", 4), (b"b", 1), (b"a", 7)]


def test_a_worker_gets_its_former_clients_first_then_the_next_in_order():
    trainer_of = {1: b"b", 2: b"b", 5: b"a", 9: b"gone"}
    got = hand_out(PendingTasks(tasks(0, 1, 2, 5, 9), trainer_of), [b"a", b"b"])
    # a: its client 5, then the first unsent in order (0); b: its 1 and 2; client 9's worker is gone
    assert got == [(b"a", 5), (b"b", 1), (b"a", 0), (b"b", 2), (b"a", 9)]


def test_a_worker_whose_clients_are_gone_takes_another_workers_client_in_order():
    pending = PendingTasks(tasks(0, 1, 2), {0: b"a", 1: b"a", 2: b"a"})
    assert pending.frames[pending.next_for(b"b")][0] == 0  # b has none of its own: the round's order
    pending.mark_sent(0)
    assert pending.frames[pending.next_for(b"a")][0] == 1  # a's own, skipping the one b took
    assert len(pending) == 2


def test_an_empty_round_offers_nothing():
    pending = PendingTasks([], {0: b"a"})
    assert not pending
    with pytest.raises(IndexError):
        pending.next_for(b"a")


def task_messages(*clients: int) -> list[tuple[int, Message]]:
    model = {"w": np.zeros(3, np.float32)}
    return [(c, protocol.encode("task", round=0, client=c, params={"steps": 1}, model=model)) for c in clients]


def test_bundles_go_out_whole_in_client_id_order_and_are_answered_client_by_client():
    roster = Roster()
    for ident in (b"a", b"b"):
        roster.add(Worker(ident=ident, greeted=True, ready=True))
    dispatcher = Dispatcher(roster, bundle=2)
    replies = dispatcher.begin(0, task_messages(7, 1, 4, 2, 9))
    sent: list[tuple[bytes, dict]] = []
    dispatcher.hand_out(lambda w, m: sent.append((w.ident, protocol.decode(m.frames, 1 << 20))) or True)
    assert [(w, m["type"], m["clients"]) for w, m in sent] == [(b"a", "bundle", [1, 2]), (b"b", "bundle", [4, 7])]
    a, b = roster[b"a"], roster[b"b"]
    assert (a.task.client, a.task.rest) == (1, [2])
    dispatcher.settle(a, {"type": "error", "message": "x"}, 0)
    assert (a.task.client, a.task.rest) == (2, [])  # the bundle's next client is due
    dispatcher.settle(a, {"type": "error", "message": "y"}, 0)
    assert a.task is None
    dispatcher.fail_task(b, "gone")  # every client still owed fails
    assert sorted(replies) == [1, 2, 4, 7] and replies[7].failure == "gone"
    dispatcher.hand_out(lambda w, m: sent.append((w.ident, protocol.decode(m.frames, 1 << 20))) or True)
    assert (sent[-1][1]["type"], sent[-1][1]["client"]) == ("task", 9)  # a bundle of one is a plain task


def test_tasks_with_a_residual_are_not_bundled():
    model = {"w": np.zeros(3, np.float32)}
    frames = [
        (c, protocol.encode("task_residual", round=0, client=c, params={}, model=model, residual={})) for c in (0, 1)
    ]
    dispatcher = Dispatcher(Roster(), bundle=4)
    dispatcher.begin(0, frames)
    assert dispatcher.pending is not None and dispatcher.pending.units == [[0], [1]]


def test_a_bundle_is_offered_first_to_the_worker_that_trained_its_first_client():
    pending = PendingTasks(task_messages(0, 1, 2, 3), {2: b"b", 1: b"a"}, bundle=2)
    assert pending.clients(pending.next_for(b"b")) == [2, 3]
    assert pending.clients(pending.next_for(b"c")) == [0, 1]
    assert Task(0, 1, time.monotonic()).rest == []

"""A round's tasks as the pool hands them out (nodes.dispatch.PendingTasks): each worker first gets the
clients it trained last, whose data it holds, then the next in the round's order."""

import pytest

from nodes.dispatch import PendingTasks
from nodes.protocol import Message


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

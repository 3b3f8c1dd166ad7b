"""The bytes the clock charges are the frames that crossed the socket: an update's header and
every tensor frame, read uncopied from ZeroMQ, and a task's frames as sent."""

import os
import time

import numpy as np

from emulator.aggregate.compression import task_frame
from nodes.contracts import protocol
from nodes.contracts.tasks import ClientTask
from nodes.transport.roster import Task
from tests.e2e.test_hostile_wire import peer, raw, read_until

V = protocol.VERSION
METRICS = {"steps": 2, "train_loss": 0.5, "update_norm": 1.0}


def test_a_task_and_its_update_are_charged_every_frame_they_are_made_of(pool):
    weights = {"w": np.arange(3000, dtype=np.float32).reshape(30, 100), "b": np.ones(100, np.float32)}
    task = task_frame(0, ClientTask(client=0, steps=1, lr=0.1, sigma=0.0, clip=0.0, q=0.5), weights)
    assert len(task) == sum(len(bytes(f)) for f in task.frames) > 3100 * 4
    with peer(pool.address, b"w") as s:
        s.send(raw({"v": V, "type": "hello", "worker": "w", "pid": os.getpid()}))
        s.send(raw({"v": V, "type": "ready", "worker": "w", "model": []}))
        read_until(pool, lambda: b"w" in pool.workers and pool.workers[b"w"].ready)
        assert s.poll(10_000) and protocol.decode(s.recv_multipart(), 1 << 20)["type"] == "setup"
        pool.replies = {}  # as run_tasks: the worker holds round 0's task for client 0
        pool.workers[b"w"].task = Task(0, 0, time.monotonic())
        assert pool._send(pool.workers[b"w"], task)
        received = s.recv_multipart()
        update = protocol.encode("update", round=0, client=0, model=weights, metrics=METRICS)
        s.send_multipart(update.frames)
        read_until(pool, lambda: 0 in pool.replies)
    assert sum(map(len, received)) == len(task)  # what the worker got is what the clock charges down
    reply = pool.replies[0]
    assert not reply.failure and reply.nbytes == len(update) == sum(len(bytes(f)) for f in update.frames)
    assert reply.message is not None and np.array_equal(reply.message["model"]["w"], weights["w"])

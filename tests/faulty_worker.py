"""`python -m tests.faulty_worker ARGS`: nodes.worker that fails on cue, for the fault tests.

Each variable in FAULTS holds "ROUND:CLIENT" ("*" matches any) and acts when this process
receives that task: KILL SIGKILLs it (a crash), STOP SIGSTOPs it (a frozen machine:
heartbeats stop too), HANG blocks the training thread forever (a stuck trainer: heartbeats
go on). POISON answers with a finite but absurd update (`poisoned`). The `faulty_workers` fixture
makes the pool start this module instead of nodes.worker; tests.faulty_emulator does the same for a
server in its own process.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import numpy as np

from nodes import worker

COMMAND = (sys.executable, "-m", "tests.faulty_worker")
FAULTS = {
    "DPFL_FAULT_KILL_AT": lambda: os.kill(os.getpid(), signal.SIGKILL),
    "DPFL_FAULT_STOP_AT": lambda: os.kill(os.getpid(), signal.SIGSTOP),
    "DPFL_FAULT_HANG_AT": lambda: threading.Event().wait(),
}


def failing_on_cue(train):
    """`train` that first acts out every fault whose variable names this task."""

    def train_or_fail(trainer, msg: dict, *rest) -> bytes:
        for variable, act in FAULTS.items():
            spec = os.environ.get(variable, "").split(":")
            if len(spec) == 2 and spec[0] in ("*", str(msg["round"])) and spec[1] in ("*", str(msg["client"])):
                act()
        return train(trainer, msg, *rest)

    return train_or_fail


POISON = 3e38  # finite: it passes every check of the wire, near float32's largest
POISONED_PARTS = ("norm", "value", "scale")  # a tensor's QSGD norm, top-k values, sign scale (nodes.contracts.codecs)


def poisoned_parts(parts: dict) -> dict:
    """A compressed update's parts with POISON for every QSGD norm, top-k value and sign scale."""
    return {k: np.full_like(v, POISON) if k.rsplit(":", 1)[1] in POISONED_PARTS else v for k, v in parts.items()}


def poisoned(update):
    """nodes.worker._update that, for a task DPFL_FAULT_POISON_AT names ("ROUND:CLIENT", "*" any), replies
    with POISON: every weight of a plain model, or `poisoned_parts` of a compressed update."""

    def update_or_poison(codec, seed, task: dict, weights: dict, metrics: dict):
        spec = os.environ.get("DPFL_FAULT_POISON_AT", "").split(":")
        cued = len(spec) == 2 and spec[0] in ("*", str(task["round"])) and spec[1] in ("*", str(task["client"]))
        if not cued:
            return update(codec, seed, task, weights, metrics)
        if codec.kind == "none":
            return update(codec, seed, task, {k: np.full_like(v, POISON) for k, v in weights.items()}, metrics)
        honest = worker.round_trip

        def round_trip(*args):
            parts, decoded = honest(*args)
            return poisoned_parts(parts), decoded

        worker.round_trip = round_trip
        try:
            return update(codec, seed, task, weights, metrics)
        finally:
            worker.round_trip = honest

    return update_or_poison


if __name__ == "__main__":
    worker._train = failing_on_cue(worker._train)
    worker._update = poisoned(worker._update)
    code = worker.main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as nodes.worker: skip torch's slow interpreter teardown

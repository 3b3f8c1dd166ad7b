"""`python -m tests.faulty_worker ARGS`: nodes.worker that fails on cue, for the fault tests.

Each variable in FAULTS holds "ROUND:CLIENT" ("*" matches any) and acts when this process
receives that task: KILL SIGKILLs it (a crash), STOP SIGSTOPs it (a frozen machine:
heartbeats stop too), HANG blocks the training thread forever (a stuck trainer: heartbeats
go on). The `faulty_workers` fixture makes the pool start this module instead of
nodes.worker; tests.faulty_emulator does the same for a server in its own process.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

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


if __name__ == "__main__":
    worker._train = failing_on_cue(worker._train)
    code = worker.main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as nodes.worker: skip torch's slow interpreter teardown

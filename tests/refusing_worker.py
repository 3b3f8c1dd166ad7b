"""`python -m tests.refusing_worker ARGS`: nodes.worker on a node where the run's data cannot be set up
(DETAIL, as a missing dataset would say it): it answers the setup with `rejected` (setup_failed)."""

from __future__ import annotations

import os
import sys

from nodes import worker

COMMAND = (sys.executable, "-m", "tests.refusing_worker")
DETAIL = "dataset fashion_mnist: train-images-idx3-ubyte.gz not found in data.root"


def missing_data(scenario: dict, device: str = "") -> tuple:
    raise FileNotFoundError(f"{DETAIL}\nsearched: ./data")


if __name__ == "__main__":
    worker._configured = missing_data
    code = worker.main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as nodes.worker: skip torch's slow interpreter teardown

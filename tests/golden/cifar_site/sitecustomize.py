"""Imported at start-up by every Python process of a golden CIFAR-10 run (tests/golden/runs.py puts this
directory first on PYTHONPATH): the md5s of the generated batches named by DPFL_GOLDEN_CIFAR_BATCHES
become the official ones, as tests/unit/test_data.py's register_cifar does in one process; the
server, its zygote, workers and evaluator each verify the batches they read."""

import os
from pathlib import Path

from nodes.data.catalog import CIFAR10
from nodes.data.cifar import CIFAR_BATCHES
from nodes.data.fetch import md5_of

CIFAR10.md5 = {
    **CIFAR10.md5,
    **{name: md5_of(Path(os.environ["DPFL_GOLDEN_CIFAR_BATCHES"]) / name) for name in CIFAR_BATCHES},
}

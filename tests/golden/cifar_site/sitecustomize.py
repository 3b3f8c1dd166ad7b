"""Imported at start-up by every Python process of a golden CIFAR-10 run (tests/golden/runs.py puts this
directory first on PYTHONPATH): the md5s of the generated batches named by DPFL_GOLDEN_CIFAR_BATCHES
become the official ones, as tests/unit/test_data.py's register_cifar does in one process; the
server, its zygote, workers and evaluator each verify the batches they read."""

import os
from pathlib import Path

from nodes.data import cifar
from nodes.data.fetch import md5_of

cifar.CIFAR_BATCH_MD5 = {
    name: md5_of(Path(os.environ["DPFL_GOLDEN_CIFAR_BATCHES"]) / name) for name in cifar.CIFAR_BATCH_MD5
}

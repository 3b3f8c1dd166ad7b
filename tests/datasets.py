"""The installed datasets the tests may use, and the mark that skips a test without one.

A test that needs a real dataset skips where it is absent, saying how to get it: `make test` passes on
a fresh machine, and wherever the dataset is installed (CI installs FashionMNIST) the test runs. The
location honours DPFL_SYSTEM_DATASETS as the emulator does (nodes/data/locate.py, FileImages.installed).
"""

from __future__ import annotations

import pytest

from nodes.data.catalog import FashionMNIST
from nodes.data.locate import SYSTEM_DIR_VARIABLE

FASHION_MNIST = FashionMNIST.installed()
FASHION_MNIST_MISSING = (
    "FashionMNIST is not installed (apt-get install dataset-fashion-mnist; "
    f"{SYSTEM_DIR_VARIABLE} names where the system's datasets are)"
)
needs_fashion_mnist = pytest.mark.skipif(FASHION_MNIST is None, reason=FASHION_MNIST_MISSING)

"""`DatasetSpec`, the contract of a dataset: what a run knows of it, the checks of its keys, and its loader.

What a run knows of a dataset comes from the scenario's data section before any file is read: a sample's
shape, the classes, the samples of the clients and of the test set, the bytes a process holds of them.

Every process builds the spec of data.dataset from the data section (nodes.data.catalog.dataset_spec):
the server to validate the scenario and size the run (emulator.run.guards), then to load the clients'
sizes; each worker and the evaluator to load the data they train and test on.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from nodes.contracts.schema import Check, DataConfig
    from nodes.data.federated import FederatedData

FLOAT32, INT64 = 4, 8  # bytes of a built sample's features and of its label
# Built data's share past its float32 samples and int64 labels: a bound of each process's peak
# (python -m bench.rss_tree).
DATA_OVERHEAD = 1.25


class DatasetLoadError(ValueError):
    """data.dataset names no dataset that can be used; the message is one line naming the key."""


class DatasetMismatch(ValueError):
    """A dataset's arrays are not what its spec declares; the message is one line naming data.dataset."""


class DatasetSpec(ABC):
    """Declare a dataset: what a run needs to know of it before a file is read, and how it is loaded.

    The estimates are from above, in samples and bytes, for `n_clients` clients: the guards check the
    machine's memory against them before a run starts (emulator.run.guards). A dataset of uint8 images
    subclasses `nodes.data.ImageArrays` instead, which answers all of them from a few class attributes.

    Args:
        cfg: the scenario's data section.
    """

    pixels = False  # whether samples are images, whose pixels data.quality's salt_pepper may set

    def __init__(self, cfg: DataConfig) -> None:
        """Keep the data section as `self.cfg`."""
        self.cfg = cfg

    @property
    @abstractmethod
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample (as the model takes it)."""

    @property
    @abstractmethod
    def classes(self) -> int:
        """The number of classes: labels are 0 .. classes - 1."""

    @abstractmethod
    def validate(self, n_clients: int, check: Check) -> None:
        """Check the data keys this dataset reads, without reading a file.

        Args:
            n_clients: clients.n.
            check: `check(ok, key, value, expected)` raises the one-line error where `ok` is false.
        """

    @abstractmethod
    def largest_client(self, n_clients: int) -> int:
        """Return the training samples of the largest client.

        Args:
            n_clients: clients.n.

        Returns:
            The count, an estimate from above.
        """

    @abstractmethod
    def client_samples(self, n_clients: int) -> float:
        """Return the samples of all clients together (the expected count where it is drawn).

        Args:
            n_clients: clients.n.

        Returns:
            The count, an estimate from above.
        """

    @abstractmethod
    def test_samples(self, n_clients: int) -> int:
        """Return the samples of the server's test set.

        Args:
            n_clients: clients.n.

        Returns:
            The count, an estimate from above.
        """

    @abstractmethod
    def source_bytes(self, n_clients: int) -> int:
        """Return the bytes a process builds its data from (what it reads, or one client's draws).

        Args:
            n_clients: clients.n.

        Returns:
            The size, an estimate from above.
        """

    def sample_bytes(self) -> int:
        """Return the bytes of one built sample: float32 features and an int64 label."""
        return math.prod(self.sample_shape) * FLOAT32 + INT64

    def evaluator_bytes(self, n_clients: int) -> int:
        """Return the bytes the evaluator holds of the data: its test set, and what it is built from.

        Args:
            n_clients: clients.n.

        Returns:
            The size, an estimate from above.
        """
        return int(self.test_samples(n_clients) * self.sample_bytes() * DATA_OVERHEAD) + self.source_bytes(n_clients)

    def server_bytes(self, n_clients: int) -> int:
        """Return the bytes the server holds of the data while it loads the clients' sizes.

        Args:
            n_clients: clients.n.

        Returns:
            The size, an estimate from above.
        """
        return self.source_bytes(n_clients)

    def pixel_extremes(self) -> tuple[np.ndarray, np.ndarray]:
        """Return (black, white): what salt-and-pepper sets a sample's values to (0 and 1 without pixels)."""
        return np.array(0.0, np.float32), np.array(1.0, np.float32)

    @abstractmethod
    def load(self, n_clients: int, seed: int) -> FederatedData:
        """Load the dataset, shared out among the clients.

        Args:
            n_clients: clients.n, at least 1.
            seed: the run's seed.

        Returns:
            The same `FederatedData`, bit for bit, in every process given the same arguments.

        Raises:
            DatasetMismatch: the arrays are not what this spec declares; the message is one line naming
                data.dataset.
        """

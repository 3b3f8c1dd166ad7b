"""A federated dataset built lazily: per-client sizes up front, one client's (X, y) on request, the
server's test set on request. A worker builds only the clients it trains and the server only the
test set, each in any process from (cfg, n_clients, seed) alone (`ImageData`, nodes.data.images, is one
over an image dataset's uint8 arrays); `ServerData` is what the server keeps of one.

Samples are numpy arrays (new, C-contiguous, writable: `torch.from_numpy` takes them as they are,
without a copy): this package never imports torch, so the server can load its data and test set
before it does."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

Samples = tuple[np.ndarray, np.ndarray]  # (X float32, y int64), numpy arrays


class FederatedData(ABC):
    num_classes: int
    input_shape: tuple[int, ...]  # shape of one sample
    n_clients: int

    @property
    @abstractmethod
    def sizes(self) -> list[int]:
        """Training samples per client, in client-id order, without building any client's samples."""

    def client(self, k: int) -> Samples:
        """Client k's training samples, built now (the same arrays in every process)."""
        if not 0 <= k < self.n_clients:
            raise IndexError(f"client {k}: expected an id in [0, {self.n_clients})")
        return self._build(k)

    @abstractmethod
    def _build(self, k: int) -> Samples: ...

    @abstractmethod
    def test(self) -> Samples:
        """The server's test set, built now."""

    def drawn_test_nbytes(self) -> int | None:
        """None where test() reads the test set; where it draws it from the seed (every client's stream,
        which costs more), about its bytes, known without drawing it (ServerData.of)."""
        return None


# A drawn test set of at most about this many bytes (half a million rows of 60 features) is the server's
# to draw and its evaluator's to take; the evaluator draws a larger one itself, as it reads an image
# dataset's: the server keeps what it hands over for an evaluator's restart.
HANDOVER_BYTES = 128 * 2**20


def handed_over(drawn_test_nbytes: int | None) -> bool:
    """Whether the server draws the test set and hands it to its evaluator (FederatedData.drawn_test_nbytes)."""
    return drawn_test_nbytes is not None and drawn_test_nbytes <= HANDOVER_BYTES


@dataclass
class ServerData:
    """What the server holds of a federated dataset: each client's count (for the clock, the policies
    and clients.parquet), a sample's shape, and the test set only where it is drawn and at most about
    HANDOVER_BYTES: the server draws it while its workers and evaluator load torch, and the evaluator
    (nodes/transport/evaluator.py) takes it rather than draw it again beside the first rounds' training."""

    sizes: list[int]
    num_classes: int
    input_shape: tuple[int, ...]
    test: Samples | None = None

    @classmethod
    def of(cls, data: FederatedData) -> ServerData:
        test = data.test() if handed_over(data.drawn_test_nbytes()) else None
        return cls(data.sizes, data.num_classes, data.input_shape, test)

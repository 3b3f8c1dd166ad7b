"""The clients' data a worker keeps built: it builds a client's data when the client's first task
comes (`FederatedData.client`, then made tensors on the trainer's device) and keeps the latest ones
up to a memory bound."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for the annotations: importing this module imports no torch, and nodes.training.trainer's
    import torch  # own alias (Tensors) may not be imported from here (nodes.training.trainer imports this module)

    Built = tuple[torch.Tensor, torch.Tensor]  # (X, y) as the trainer keeps them

# All of FashionMNIST's 10 clients fit, or thousands of synthetic ones; a client dropped is rebuilt
# when next drawn, an image client's costing more than a synthetic one's (python -m bench --only scale).
CACHE_BYTES = 256 * 2**20


class ClientCache:
    """Built client data by (client, quality rule), the least recently used dropped first once they
    hold more than max_bytes (the latest is always kept)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.nbytes = max_bytes, 0
        self.entries: OrderedDict[tuple[int, int], Built] = OrderedDict()

    def get(self, key: tuple[int, int], build: Callable[[], Built]) -> Built:
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        samples = self.entries[key] = build()
        self.nbytes += _nbytes(samples)
        while self.nbytes > self.max_bytes and len(self.entries) > 1:
            self.nbytes -= _nbytes(self.entries.popitem(last=False)[1])
        return samples


def _nbytes(samples: Built) -> int:
    return sum(t.element_size() * t.nelement() for t in samples)

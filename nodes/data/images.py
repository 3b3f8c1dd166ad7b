"""Image datasets: `ImageData`, a federated dataset over an image dataset's uint8 arrays."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from nodes.contracts.schema import Split
from nodes.data.federated import FederatedData, Samples
from nodes.data.normalize import to_float
from nodes.data.partition import partition, partition_rng, split_share

if TYPE_CHECKING:
    from nodes.contracts.schema import DataConfig


class ImageData(FederatedData):
    """uint8 (N, C, H, W) images partitioned across clients by their labels (see data.split); a
    client's pixels are converted to float only when it is built."""

    def __init__(
        self,
        cfg: DataConfig,
        n_clients: int,
        seed: int,
        xtr: np.ndarray,
        ytr: np.ndarray,
        xte: np.ndarray,
        yte: np.ndarray,
    ) -> None:
        self.cfg, self.n_clients = cfg, n_clients
        self.num_classes = int(max(ytr.max(), yte.max())) + 1
        self.input_shape = tuple(xtr.shape[1:])
        if cfg.split == Split.PER_CLIENT:
            xtr, ytr = np.concatenate([xtr, xte]), np.concatenate([ytr, yte])
        rng = partition_rng(cfg, seed)
        parts = partition(cfg, ytr, n_clients, rng)
        short = [i for i, p in enumerate(parts) if len(p) < cfg.min_samples]
        if short:
            raise ValueError(
                f"data.min_samples = {cfg.min_samples}: client {short[0]} gets only "
                f"{len(parts[short[0]])} of {len(ytr)} samples"
            )
        test_idx: np.ndarray | slice = slice(None)
        self.test_parts: list[np.ndarray] = []
        if cfg.split == Split.PER_CLIENT:
            shares = [split_share(p, cfg.client_train_fraction, rng) for p in parts]
            parts = [train for train, _ in shares]
            self.test_parts = [test for _, test in shares]
            test_idx = np.concatenate(self.test_parts)
            xte, yte = xtr, ytr
        self.parts, self.xtr, self.ytr = parts, xtr, ytr
        self.test_idx, self.xte, self.yte = test_idx, xte, yte

    @property
    def sizes(self) -> list[int]:
        return [len(p) for p in self.parts]

    def _build(self, k: int) -> Samples:
        return self._samples(self.xtr, self.ytr, self.parts[k])

    def test(self) -> Samples:
        return self._samples(self.xte, self.yte, self.test_idx)

    def client_test(self, k: int) -> Samples:
        """Client k's test share (data.split = per_client); `test()` is their union, in client order."""
        if not self.test_parts:
            raise ValueError(f"data.split = {self.cfg.split!r}: clients hold test shares only with per_client")
        if not 0 <= k < self.n_clients:
            raise IndexError(f"client {k}: expected an id in [0, {self.n_clients})")
        return self._samples(self.xte, self.yte, self.test_parts[k])

    def _samples(self, x: np.ndarray, y: np.ndarray, idx: np.ndarray | slice) -> Samples:
        # copies both (a slice would hand out a view of the dataset's own labels)
        return to_float(x[idx], self.cfg.dataset, self.cfg.normalize), y[idx].astype(np.int64, order="C")

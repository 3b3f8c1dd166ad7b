"""One `FederatedData`: a (X, y) pair per client and the server's test set; `federate` makes it
from an image dataset's uint8 arrays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from nodes.data.normalize import to_tensor
from nodes.data.partition import partition, partition_rng, split_share
from nodes.schema import Split

if TYPE_CHECKING:
    from nodes.schema import DataConfig


@dataclass
class FederatedData:
    train: list[tuple[torch.Tensor, torch.Tensor]]  # per client i: (X float32, y int64)
    test: tuple[torch.Tensor, torch.Tensor]  # server-side test set
    num_classes: int
    input_shape: tuple[int, ...]  # shape of one sample

    @property
    def sizes(self) -> list[int]:
        return [len(y) for _, y in self.train]


def federate(
    cfg: DataConfig, n_clients: int, seed: int, xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray, yte: np.ndarray
) -> FederatedData:
    """Partition uint8 (N, C, H, W) images across clients, and make the server's test set (see data.split)."""
    num_classes = int(max(ytr.max(), yte.max())) + 1
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
    if cfg.split == Split.PER_CLIENT:
        shares = [split_share(p, cfg.client_train_fraction, rng) for p in parts]
        parts = [train for train, _ in shares]
        test_idx = np.concatenate([test for _, test in shares])
        xte, yte = xtr[test_idx], ytr[test_idx]

    def tensors(idx_or_all: np.ndarray | slice, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return to_tensor(x[idx_or_all], cfg.dataset, cfg.normalize), torch.from_numpy(y[idx_or_all])

    train = [tensors(p, xtr, ytr) for p in parts]
    test = tensors(slice(None), xte, yte)
    return FederatedData(train, test, num_classes, tuple(xtr.shape[1:]))

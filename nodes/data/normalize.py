"""Pixels to float32 arrays: pixel / 255, then data.normalize (standard | half | none)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from nodes.contracts.schema import Dataset, Normalization
from nodes.data.catalog import sample_shape

if TYPE_CHECKING:
    from nodes.contracts.schema import DataConfig

# Per-channel mean and std of each training set's pixel / 255 (the values torchvision's
# examples use; tests recompute them from the files).
CHANNEL_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}


def to_float(images_u8: np.ndarray, dataset: str, normalize: str) -> np.ndarray:
    """uint8 (N, C, H, W) pixels as a new C-contiguous float32 array, normalised in float32."""
    x = images_u8.astype(np.float32, order="C")
    x /= np.float32(255.0)  # exactly pixel / 255, as torchvision's ToTensor
    if normalize == Normalization.HALF:
        x -= np.float32(0.5)
        x /= np.float32(0.5)
    elif normalize == Normalization.STANDARD:
        mean, std = (np.asarray(v, np.float32).reshape(-1, 1, 1) for v in CHANNEL_STATS[dataset])
        x -= mean
        x /= std
    return x


def pixel_extremes(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    """(black, white): pixels 0 and 255 after data.normalize, per channel, float32 of shape (C, 1, 1);
    0 and 1 (0-d float32) for synthetic data, which has no pixels (salt-and-pepper is refused there)."""
    if cfg.dataset == Dataset.SYNTHETIC:
        return np.array(0.0, np.float32), np.array(1.0, np.float32)
    channels = sample_shape(cfg)[0]
    both = to_float(
        np.array([0, 255], dtype=np.uint8).repeat(channels).reshape(2, channels, 1, 1), cfg.dataset, cfg.normalize
    )
    return both[0], both[1]

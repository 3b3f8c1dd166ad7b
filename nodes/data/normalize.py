"""Pixels to float32 arrays: pixel / 255, then data.normalize (standard | half | none)."""

from __future__ import annotations

import numpy as np

from nodes.contracts.schema import Normalization

ChannelStats = tuple[tuple[float, ...], tuple[float, ...]]  # per channel: the means, the standard deviations


def to_float(images_u8: np.ndarray, channel_stats: ChannelStats | None, normalize: str) -> np.ndarray:
    """uint8 (N, C, H, W) pixels as a new C-contiguous float32 array, normalised in float32 (standard:
    by `channel_stats`, the training set's pixel / 255 per channel)."""
    x = images_u8.astype(np.float32, order="C")
    x /= np.float32(255.0)  # exactly pixel / 255, as torchvision's ToTensor
    if normalize == Normalization.HALF:
        x -= np.float32(0.5)
        x /= np.float32(0.5)
    elif normalize == Normalization.STANDARD:
        if channel_stats is None:
            raise ValueError("data.normalize = 'standard': expected a dataset that declares its channel_stats")
        mean, std = (np.asarray(v, np.float32).reshape(-1, 1, 1) for v in channel_stats)
        x -= mean
        x /= std
    return x

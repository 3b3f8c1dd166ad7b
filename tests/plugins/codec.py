"""A user's codec (compression.kind=tests.plugins.codec:Float16): each coordinate as a float16, two
bytes where the plain update takes four."""

from __future__ import annotations

import numpy as np

from nodes.contracts.codecs import Codec, Parts, PartSpec

HALF_MAX = float(np.finfo(np.float16).max)


class Float16(Codec):
    """Each coordinate rounded to the nearest float16, clipped to float16's range (never inf)."""

    def parts(self, n: int) -> PartSpec:
        return {"half": (np.float16, n)}

    def encode(self, x: np.ndarray, rng: np.random.Generator) -> Parts:
        return {"half": np.clip(x, -HALF_MAX, HALF_MAX).astype(np.float16)}

    def decode(self, n: int, parts: Parts) -> np.ndarray:
        return parts["half"].astype(np.float32)

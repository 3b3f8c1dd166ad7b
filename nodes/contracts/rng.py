"""Named RNG streams: one seed drives everything.

Each consumer asks for its own stream keyed by what it is for and by (round, client),
so a draw never depends on how many workers ran or in which order replies arrived.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import numpy as np


def _key(parts: Iterable[int | str]) -> tuple[int, ...]:
    return tuple(zlib.crc32(p.encode()) if isinstance(p, str) else int(p) for p in parts)


def seed_sequence(seed: int, *key: int | str) -> np.random.SeedSequence:
    return np.random.SeedSequence(entropy=int(seed), spawn_key=_key(key))


def stream(seed: int, *key: int | str) -> np.random.Generator:
    """`stream(seed, "dropout", round, client)` — an independent generator per purpose and key."""
    return np.random.default_rng(seed_sequence(seed, *key))


def seed_int(seed: int, *key: int | str) -> int:
    """A 63-bit integer seed for libraries that take one (torch.Generator.manual_seed)."""
    return int(seed_sequence(seed, *key).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))

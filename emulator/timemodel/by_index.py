"""Read-only sequences whose items are made from their index when asked for: the clients' resources,
availabilities and views, and the eligible ids, of a run of any size without a list of n."""

from __future__ import annotations

import bisect
from abc import abstractmethod
from collections.abc import Sequence
from typing import TypeVar, overload

import numpy as np

T = TypeVar("T")


class ByIndex(Sequence[T]):
    """A sequence given by `__len__` and `_at(i)` for 0 <= i < len; negative indices and slices as a list's."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def _at(self, i: int) -> T:
        """Item i, 0 <= i < len(self)."""

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...

    def __getitem__(self, i: int | slice) -> T | list[T]:
        n = len(self)
        if isinstance(i, slice):
            return [self._at(k) for k in range(*i.indices(n))]
        if not -n <= i < n:
            raise IndexError(f"index {i}: expected an id in [0, {n})")
        return self._at(int(i) % n)


class Without(ByIndex[int]):
    """The ids of an ordered sequence but those at some positions (sorted, distinct), without a list of the rest:
    item k is the base's item k + (the positions left out up to it), found by bisection."""

    def __init__(self, base: Sequence[int], positions: Sequence[int]):
        self.base = base
        self._removed = np.asarray(positions, dtype=np.int64)
        self._shifted = [p - j for j, p in enumerate(positions)]  # non-decreasing: items kept before each
        self._len = len(base) - len(positions)

    def __len__(self) -> int:
        return self._len

    def _at(self, k: int) -> int:
        return self.base[k + bisect.bisect_right(self._shifted, k)]

    def positions(self, ids: Sequence[int]) -> np.ndarray:
        """The positions of `ids` (each one of this sequence's) in it: their base positions, less the
        positions left out before each."""
        at = positions(self.base, ids)
        return at - np.searchsorted(self._removed, at)


def positions(ids_in_order: Sequence[int], ids: Sequence[int]) -> np.ndarray:
    """The positions in `ids_in_order` (ids in id order) of `ids`: at once where the sequence says (a range,
    `Without`, the available now), else by bisection, one id at a time. An id it lacks gets where it would go
    (or a position outside it)."""
    if isinstance(ids_in_order, range) and ids_in_order.step == 1:
        return np.asarray(ids, dtype=np.int64) - ids_in_order.start
    at = getattr(ids_in_order, "positions", None)
    if at is not None:
        found: np.ndarray = at(ids)
        return found
    return np.array([bisect.bisect_left(ids_in_order, i) for i in ids], dtype=np.int64)


def members(ids_in_order: Sequence[int], ids: Sequence[int]) -> list[int]:
    """Those of `ids` that `ids_in_order` (ids in id order) holds, in their order: each one's `positions` read."""
    n, at = len(ids_in_order), positions(ids_in_order, ids).tolist()
    return [i for i, k in zip(ids, at, strict=True) if 0 <= k < n and ids_in_order[k] == i]

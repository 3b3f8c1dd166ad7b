"""Who of all the clients is available at the clock's time, kept as time moves on, for a round's work to
follow its clients and not `clients.n`.

`AvailableNow` holds one bit per client and a count per block of ids. Time moving on within a period
re-asks only the clients with a window boundary passed (their windows' starts and ends, sorted once);
a new period, or time going back, asks every client again, on arrays. The candidates available are then
offered as a sequence in id order (`Offered`), indexed through the block counts, without a list of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np

from emulator.timemodel.by_index import ByIndex, Without

BLOCK = 1 << 10  # ids per counted block: a lookup scans one block's bits


class Windows(Protocol):
    """Every client's availability windows, as `DiurnalWindows` and `ObjectWindows` give them."""

    period: float

    def __len__(self) -> int: ...

    def member(self, ids: np.ndarray, t: float) -> np.ndarray:
        """Whether each of `ids` is available at t."""
        ...

    def changes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the times within a period at which a client's availability may change, the client, whether it starts)."""
        ...

    def first_starts(self) -> tuple[np.ndarray, np.ndarray]:
        """(the first window start within a period of each client that has windows, the client)."""
        ...


def candidate_ids(candidates: Sequence[int], n: int) -> tuple[np.ndarray | None, np.ndarray]:
    """(the ids of `candidates` as an array, or None when they are every id but some, the ids they leave out):
    range(n) and the accountants' `Excluding` leave out few, any other sequence is listed."""
    excluded = getattr(candidates, "excluded", None)
    if isinstance(candidates, range) and candidates == range(n):
        return None, np.zeros(0, np.int64)
    if excluded is not None and getattr(candidates, "n", None) == n:
        return None, np.asarray(excluded, np.int64)
    return np.fromiter(candidates, np.int64, len(candidates)), np.zeros(0, np.int64)


class AvailableNow:
    """The clients available at the last time `at` was given, as bits, counted by blocks of ids."""

    def __init__(self, windows: Windows):
        self.windows, self.n = windows, len(windows)
        values, owners, starting = windows.changes()
        order = np.argsort(values, kind="stable")
        self.values, self.owners, self.starting = values[order], owners[order], starting[order]
        first, first_owner = windows.first_starts()
        order = np.argsort(first, kind="stable")
        self.first, self.first_owner = first[order], first_owner[order]
        self.on = np.zeros(self.n, bool)
        self.counts = np.zeros(-(-self.n // BLOCK), np.int64)
        self.base = math.nan  # the period that `at` last located (nan: none yet), and the time within it
        self.within = -math.inf
        self.version = 0  # moves on whenever a bit changes: an `Offered` of an older version refuses to answer
        self._cumulative: np.ndarray | None = None

    def _locate(self, t: float) -> tuple[float, float]:
        period = self.windows.period
        base = math.floor(t / period) * period if math.isfinite(period) else 0.0
        return base, t - base

    def at(self, t: float) -> None:
        """Bring the bits to time t."""
        base, within = self._locate(t)
        if base == self.base and within == self.within:
            return
        if base != self.base or within < self.within:
            self.on = self.windows.member(np.arange(self.n), t)
            if self.n:
                self.counts = np.add.reduceat(self.on, np.arange(0, self.n, BLOCK), dtype=np.int64)
            self.version += 1
        else:  # on within the period: only a client with a boundary passed can have changed
            lo, hi = np.searchsorted(self.values, [self.within, within], side="right")
            ids = np.unique(self.owners[lo:hi])
            now = self.windows.member(ids, t)
            changed = now != self.on[ids]
            if changed.any():
                ids, now = ids[changed], now[changed]
                self.on[ids] = now
                np.add.at(self.counts, ids // BLOCK, np.where(now, 1, -1))
                self.version += 1
        self.base, self.within = base, within
        self._cumulative = None

    def cumulative(self) -> np.ndarray:
        if self._cumulative is None:
            self._cumulative = np.cumsum(self.counts)
        return self._cumulative

    def count(self) -> int:
        return int(self.cumulative()[-1]) if self.n else 0

    def select(self, k: int) -> int:
        """The id of the k-th available client (from 0), in id order."""
        cumulative = self.cumulative()
        block = int(np.searchsorted(cumulative, k, side="right"))
        before = int(cumulative[block - 1]) if block else 0
        start = block * BLOCK
        return start + int(np.flatnonzero(self.on[start : start + BLOCK])[k - before])

    def ranks(self, ids: np.ndarray) -> np.ndarray:
        """How many available clients have a smaller id, for each of `ids`."""
        cumulative = np.concatenate([[0], self.cumulative()])
        blocks = ids // BLOCK
        return np.array(
            [cumulative[b] + np.count_nonzero(self.on[b * BLOCK : i]) for b, i in zip(blocks.tolist(), ids.tolist())],
            np.int64,
        )

    def among(self, candidates: Sequence[int]) -> Sequence[int]:
        """The candidates available, in id order."""
        listed, excluded = candidate_ids(candidates, self.n)
        if listed is not None:
            offered: list[int] = listed[self.on[listed]].tolist()
            return offered
        return Offered(self, excluded[self.on[excluded]])

    def next_available(self, t: float, candidates: Sequence[int]) -> float:
        """The first time >= t at which one of the candidates is available (inf if never), as the earliest of
        their `Availability.next_available(t)`: t when one is now, else the first window start to come of one."""
        self.at(t)
        listed, excluded = candidate_ids(candidates, self.n)
        wanted = np.zeros(self.n, bool)
        if listed is None:
            wanted[:] = True
            wanted[excluded] = False
        else:
            wanted[listed] = True
        if (self.on & wanted).any():
            return t
        after = int(np.searchsorted(self.values, self.within, side="right"))
        starts = np.flatnonzero(self.starting[after:] & wanted[self.owners[after:]])
        if starts.size:
            return float(self.base + self.values[after + starts[0]])
        first = np.flatnonzero(wanted[self.first_owner])
        period = self.windows.period
        if first.size and math.isfinite(period):
            return float(self.base + period + self.first[first[0]])
        return math.inf


class Available(ByIndex[int]):
    """The clients available at one moment, in id order (refusing to answer once that moment's bits changed)."""

    def __init__(self, now: AvailableNow):
        self.now, self.version = now, now.version
        self._len = now.count()

    def current(self) -> AvailableNow:
        if self.now.version != self.version:
            raise RuntimeError("the clients offered were read after their availability changed")
        return self.now

    def __len__(self) -> int:
        return self._len

    def _at(self, k: int) -> int:
        return self.current().select(k)

    def positions(self, ids: Sequence[int]) -> np.ndarray:
        """The positions of `ids` (each available) among the available: their ranks."""
        return self.current().ranks(np.asarray(ids, dtype=np.int64))


class Offered(Without):
    """The available clients but a sorted few, in id order: what the clock offers a policy when nearly every
    client is a candidate (indexing through the block counts)."""

    def __init__(self, now: AvailableNow, excluded: np.ndarray):
        self.available = Available(now)
        super().__init__(self.available, np.sort(now.ranks(excluded)).tolist())
        self.left_out = set(excluded.tolist())

    def __iter__(self) -> Iterator[int]:
        return (c for c in np.flatnonzero(self.available.current().on).tolist() if c not in self.left_out)

    def __contains__(self, c: object) -> bool:
        now = self.available.current()
        return isinstance(c, int) and 0 <= c < now.n and bool(now.on[c]) and c not in self.left_out

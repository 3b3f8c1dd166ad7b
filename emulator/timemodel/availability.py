"""When a client can be reached at all: availability windows over virtual time.

Two sources (`availability.model`):

* `csv`: rows `client,t_start,t_end`, each an interval [t_start, t_end) in which the client is
  available; a client with rows is unavailable outside them, a client without rows is always
  available. With `repeat_s` > 0 the file describes one period (a day, a week) that repeats.
* `diurnal`: client i is available while p(t) = mean + amplitude * sin(2 pi (t + phase_i) / period)
  exceeds its own threshold u_i ~ U(0, 1), so that P(available at t) = p(t) (clipped to [0, 1]):
  one contiguous window a day, like a phone that takes part while it charges (Bonawitz et al.,
  "Towards Federated Learning at Scale", SysML 2019, report such diurnal participation). phase_i
  ~ U(0, phase_spread_s) and u_i come from the client's own stream(seed, "availability", i), so
  a client's windows depend on nothing else (not the number of clients, not the workers).

A client's `Availability` answers `available(t)`, `next_unavailable(t)` and `next_available(t)`, each a binary
search over its windows. Who of all the clients is available is answered from their windows as arrays
(`DiurnalWindows`, `ObjectWindows`), which `available_now.AvailableNow` keeps up to date as time moves on.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from emulator.timemodel.by_index import ByIndex
from emulator.timemodel.traces import TraceError, csv_rows
from nodes.contracts.rng import stream_uniforms
from nodes.contracts.schema import AvailabilityConfig, AvailabilityModel


class Availability:
    """Half-open windows [starts[k], ends[k]) in which the client is available; with a finite
    `period` they repeat (windows then lie within [0, period))."""

    def __init__(self, windows: Iterable[tuple[float, float]], period: float = math.inf):
        merged: list[list[float]] = []
        for start, end in sorted((float(s), float(e)) for s, e in windows if e > s):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        if math.isfinite(period) and merged == [[0.0, period]]:
            merged, period = [[0.0, math.inf]], math.inf  # a window the whole period long: always
        # tuples and bisect, not arrays and np.searchsorted: the clock asks twice per client per round,
        # and a numpy call's overhead on a window or two dwarfs a bisect (python -m bench --only scale)
        self.starts = tuple(s for s, _ in merged)
        self.ends = tuple(e for _, e in merged)
        self.period = float(period)

    def _locate(self, t: float) -> tuple[float, float, int, bool]:
        """(start of t's period, t within it, index of the last window starting at or before, inside it)."""
        base = math.floor(t / self.period) * self.period if math.isfinite(self.period) else 0.0
        r = t - base
        k = bisect.bisect_right(self.starts, r) - 1
        return base, r, k, k >= 0 and r < self.ends[k]

    def available(self, t: float) -> bool:
        return self._locate(t)[3]

    def next_unavailable(self, t: float) -> float:
        """The first time >= t at which the client is unavailable (t itself when it is now; inf if never)."""
        base, _, k, inside = self._locate(t)
        if not inside:
            return t
        end = base + self.ends[k]
        wraps = math.isfinite(self.period) and self.ends[k] == self.period and self.starts[0] == 0
        return float(end + self.ends[0] if wraps else end)

    def next_available(self, t: float) -> float:
        """The first time >= t at which the client is available (t itself when it is now; inf if never)."""
        base, _, k, inside = self._locate(t)
        if inside:
            return t
        if k + 1 < len(self.starts):
            return float(base + self.starts[k + 1])
        if math.isfinite(self.period) and len(self.starts):
            return float(base + self.period + self.starts[0])
        return math.inf


ALWAYS = Availability([(0.0, math.inf)])


class DiurnalWindows:
    """Every client's diurnal window within one period, as arrays: client i is available on [start_i, end_i) of
    each period (an end past the period wraps into the next), always (`always`) or never (`never`): the
    threshold u_i above mean + amplitude * sin(2 pi (t + phase_i) / period) where the sinusoid crosses it.

    Computed for all clients at once, with the float operations of the scalar formula in the same order and
    math.asin (libm's, as a scalar call gives), so that each window is the one a per-client computation makes."""

    def __init__(self, cfg: AvailabilityConfig, phase_s: np.ndarray, threshold: np.ndarray):
        period = self.period = float(cfg.period_s)
        flat = (cfg.amplitude == 0) | (np.abs(threshold - cfg.mean) >= cfg.amplitude)
        a = np.zeros(len(threshold))
        crossed = np.flatnonzero(~flat)
        a[crossed] = np.frompyfunc(math.asin, 1, 1)((threshold[crossed] - cfg.mean) / cfg.amplitude)
        # sin(x) > s for x in (a, pi - a)
        start = (a / (2 * math.pi) * period - phase_s) % period
        end = start + (math.pi - 2 * a) / (2 * math.pi) * period
        wraps = end > period
        # what Availability makes of [start, end) or of [start, period) and [0, end - period): a window the
        # whole period long is always; an empty one never
        whole = np.where(wraps, start <= end - period, (start == 0) & (end == period))
        self.start, self.end, self.wraps = start, end, wraps
        self.always = np.where(flat, cfg.mean > threshold, whole & ~flat)
        self.never = np.where(flat, cfg.mean <= threshold, ~wraps & (end <= start))

    def __len__(self) -> int:
        return len(self.start)

    def window(self, i: int) -> Availability:
        """Client i's Availability."""
        if self.always[i]:
            return ALWAYS
        if self.never[i]:
            return Availability([])
        start, end, period = float(self.start[i]), float(self.end[i]), self.period
        if end <= period:
            return Availability([(start, end)], period)
        return Availability([(start, period), (0.0, end - period)], period)

    def member(self, ids: np.ndarray, t: float) -> np.ndarray:
        """Whether each of `ids` is available at t: Availability.available's comparisons, on arrays."""
        period = self.period
        r = t - math.floor(t / period) * period
        start, end = self.start[ids], self.end[ids]
        inside = np.where(
            self.wraps[ids], ((r >= 0) & (r < end - period)) | ((r >= start) & (r < period)), (r >= start) & (r < end)
        )
        return np.asarray((inside | self.always[ids]) & ~self.never[ids], bool)

    def changes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the times within a period at which a client's availability may change, the client of each, whether
        it becomes available there): its window's start and end (for a window that wraps, its end within the
        period), the period's own start aside."""
        windowed = np.flatnonzero(~self.always & ~self.never)
        start, end = self.start[windowed], self.end[windowed]
        end = np.where(self.wraps[windowed], end - self.period, end)
        return (
            np.concatenate([start, end]),
            np.concatenate([windowed, windowed]),
            np.concatenate([np.ones(len(windowed), bool), np.zeros(len(windowed), bool)]),
        )

    def first_starts(self) -> tuple[np.ndarray, np.ndarray]:
        """(each windowed client's first window start within a period, the client): 0 for a window that wraps."""
        windowed = np.flatnonzero(~self.always & ~self.never)
        return np.where(self.wraps[windowed], 0.0, self.start[windowed]), windowed


class ObjectWindows:
    """The windows of some clients' Availability objects (the others always available), all of one period."""

    def __init__(self, n: int, objects: dict[int, Availability]):
        self.objects = {i: a for i, a in objects.items() if a is not ALWAYS}
        periods = {a.period for a in self.objects.values() if a.starts}
        if len(periods) > 1:
            raise ValueError(f"availability periods {sorted(periods)}: expected windows of one period")
        self.period = periods.pop() if periods else math.inf
        self.windowed = np.zeros(n, bool)
        self.windowed[list(self.objects)] = True

    def __len__(self) -> int:
        return len(self.windowed)

    def member(self, ids: np.ndarray, t: float) -> np.ndarray:
        inside: np.ndarray = ~self.windowed[ids]
        for j in np.flatnonzero(self.windowed[ids]):
            inside[j] = self.objects[int(ids[j])].available(t)
        return inside

    def changes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        values: list[float] = []
        owners: list[int] = []
        on: list[bool] = []
        for i, a in self.objects.items():
            for bounds, starting in ((a.starts, True), (a.ends, False)):
                finite = [b for b in bounds if math.isfinite(b)]
                values += finite
                owners += [i] * len(finite)
                on += [starting] * len(finite)
        return np.array(values, float), np.array(owners, np.int64), np.array(on, bool)

    def first_starts(self) -> tuple[np.ndarray, np.ndarray]:
        windowed = [i for i, a in self.objects.items() if a.starts]
        return np.array([self.objects[i].starts[0] for i in windowed], float), np.array(windowed, np.int64)


def read_windows(path: str, n_clients: int, repeat_s: float = 0.0) -> dict[int, list[tuple[float, float]]]:
    """A `client,t_start,t_end` file: each client's available intervals (within [0, repeat_s) when
    they repeat)."""
    windows: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for i, (client, start, end) in enumerate(csv_rows(path, 3), 1):
        if not (client.is_integer() and 0 <= client < n_clients):
            raise TraceError(f"row {i}: client = {client:g}: expected a client id in [0, {n_clients})")
        if not 0 <= start < end:
            raise TraceError(f"row {i}: [{start:g}, {end:g}): expected 0 <= t_start < t_end")
        if repeat_s and end > repeat_s:
            raise TraceError(f"row {i}: t_end = {end:g}: expected <= availability.repeat_s = {repeat_s:g}")
        windows[int(client)].append((start, end))
    return windows


class Availabilities(ByIndex[Availability]):
    """Every client's Availability, each made when asked for from its windows (`windows`: the diurnal draws of
    every client's own stream as arrays, or the file's rows; None when always available). A run keeps the ones
    of the clients it selects, in their `ClientResources`."""

    def __init__(self, cfg: AvailabilityConfig, n_clients: int, seed: int):
        self.cfg, self.n = cfg, n_clients
        self.windows: DiurnalWindows | ObjectWindows | None = None
        if cfg.model == AvailabilityModel.CSV:
            period = cfg.repeat_s or math.inf
            rows = read_windows(cfg.file, n_clients, cfg.repeat_s)
            self.windows = ObjectWindows(n_clients, {i: Availability(w, period) for i, w in rows.items()})
        elif cfg.model == AvailabilityModel.DIURNAL:
            u = stream_uniforms(seed, ("availability",), np.arange(n_clients), 2)  # each client's own stream
            self.windows = DiurnalWindows(cfg, u[:, 0] * cfg.phase_spread_s, u[:, 1])

    @property
    def always(self) -> bool:
        """Whether every client is always available."""
        return self.cfg.model == AvailabilityModel.ALWAYS

    def __len__(self) -> int:
        return self.n

    def _at(self, i: int) -> Availability:
        if isinstance(self.windows, DiurnalWindows):
            return self.windows.window(i)
        if isinstance(self.windows, ObjectWindows):
            return self.windows.objects.get(i, ALWAYS)
        return ALWAYS


def build_availability(cfg: AvailabilityConfig, n_clients: int, seed: int) -> Availabilities:
    """One Availability per client, each made when asked for."""
    return Availabilities(cfg, n_clients, seed)

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

The clock reads `available(t)`, `next_unavailable(t)` and `next_available(t)`; each is a binary
search over the client's windows.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable

from emulator.timemodel.by_index import ByIndex
from emulator.timemodel.traces import TraceError, csv_rows
from nodes.contracts.rng import stream
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


def diurnal(cfg: AvailabilityConfig, phase_s: float, threshold: float) -> Availability:
    """Where mean + amplitude * sin(2 pi (t + phase_s) / period) > threshold, as windows within one period."""
    period = cfg.period_s
    if cfg.amplitude == 0 or abs(threshold - cfg.mean) >= cfg.amplitude:
        return ALWAYS if cfg.mean > threshold else Availability([])
    a = math.asin((threshold - cfg.mean) / cfg.amplitude)  # sin(x) > s for x in (a, pi - a)
    start = (a / (2 * math.pi) * period - phase_s) % period
    end = start + (math.pi - 2 * a) / (2 * math.pi) * period
    if end <= period:
        return Availability([(start, end)], period)
    return Availability([(start, period), (0.0, end - period)], period)


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
    """Every client's Availability, each made when asked for from the client's own stream or rows (a
    run keeps the ones of the clients it selects, in their `ClientResources`)."""

    def __init__(self, cfg: AvailabilityConfig, n_clients: int, seed: int):
        self.cfg, self.n, self.seed = cfg, n_clients, seed
        self.windows = read_windows(cfg.file, n_clients, cfg.repeat_s) if cfg.model == AvailabilityModel.CSV else {}

    @property
    def always(self) -> bool:
        """Whether every client is always available."""
        return self.cfg.model == AvailabilityModel.ALWAYS

    def __len__(self) -> int:
        return self.n

    def _at(self, i: int) -> Availability:
        cfg = self.cfg
        if cfg.model == AvailabilityModel.CSV:
            return Availability(self.windows[i], cfg.repeat_s or math.inf) if i in self.windows else ALWAYS
        if cfg.model == AvailabilityModel.DIURNAL:
            u_phase, u_threshold = stream(self.seed, "availability", i).random(2)
            return diurnal(cfg, u_phase * cfg.phase_spread_s, u_threshold)
        return ALWAYS


def build_availability(cfg: AvailabilityConfig, n_clients: int, seed: int) -> Availabilities:
    """One Availability per client, each made when asked for."""
    return Availabilities(cfg, n_clients, seed)

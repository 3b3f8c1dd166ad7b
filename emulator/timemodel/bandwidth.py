"""One direction of a client's link: its rate over virtual time, piecewise constant, and the
seconds a message takes on it alone. A direction may follow a trace file instead
(`traces.TracedBandwidth`, same interface).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable

from nodes.contracts.schema import SchedulePoint

DIRECTIONS = ("down", "up")


def check_direction(direction: str) -> None:
    """Raise ValueError unless `direction` is "down" or "up"."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction = {direction!r}: expected 'down' | 'up'")


class Bandwidth:
    """One direction of one client's link: `bps` times a piecewise-constant factor.

    The factor is 1 before the first schedule point and `factor` from each point's `t` on
    (several points at the same t: the last one wins).
    """

    def __init__(self, bps: float, schedule: Iterable[SchedulePoint] = ()):
        if not bps > 0:
            raise ValueError(f"bps = {bps!r}: expected a bandwidth > 0 bits/s")
        by_time: dict[float, float] = {}
        for point in sorted(schedule, key=lambda p: p.t):
            if not point.factor > 0:
                raise ValueError(f"schedule factor = {point.factor!r} at t={point.t}: expected a factor > 0")
            by_time[float(point.t)] = float(point.factor)
        self.bps = float(bps)
        self._change_times: list[float] = []  # times at which the rate really changes
        self._rates: list[float] = [self.bps]  # _rates[k] holds on [_change_times[k-1], _change_times[k])
        factor = 1.0
        for t, f in by_time.items():
            if f != factor:
                self._change_times.append(t)
                self._rates.append(self.bps * f)
                factor = f

    def rate(self, t: float) -> float:
        """Bits/s at virtual time t."""
        return self._rates[bisect_right(self._change_times, t)]

    def next_change(self, t: float) -> float:
        """The first time > t at which the rate changes (inf if it never does)."""
        k = bisect_right(self._change_times, t)
        return self._change_times[k] if k < len(self._change_times) else math.inf

    def transfer_seconds(self, nbytes: int, t0: float) -> float:
        """Seconds to send 8*nbytes bits starting at t0 on this link alone (exact integral)."""
        if nbytes < 0:
            raise ValueError(f"nbytes = {nbytes!r}: expected a byte count >= 0")
        bits = 8.0 * nbytes
        if bits == 0:
            return 0.0
        t = t0
        k = bisect_right(self._change_times, t0)
        while k < len(self._change_times):
            rate, end = self._rates[k], self._change_times[k]
            if rate * (end - t) >= bits:
                break
            bits -= rate * (end - t)
            t = end
            k += 1
        return (t - t0) + bits / self._rates[k]

    def mean_rate(self, t0: float, t1: float) -> float:
        """Bits/s delivered on average over [t0, t1] (t0 < t1): what a client measures of its link."""
        bits, t = 0.0, t0
        while t < t1:
            end = min(self.next_change(t), t1)
            bits += self.rate(t) * (end - t)
            t = end
        return bits / (t1 - t0)

    def __repr__(self) -> str:
        changes = list(zip(self._change_times, self._rates[1:]))
        return f"Bandwidth({self.bps:g} bps, changes={changes})"

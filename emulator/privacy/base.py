"""What every accountant shares: the check of delta, and the search for the most steps within a target."""

from __future__ import annotations

from collections.abc import Callable


def check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return delta


def _last_within(eps_at: Callable[[int], float], eps_target: float, limit: int, lo: int, step: int) -> int:
    """An n in [lo, limit] with eps_at(n) <= eps_target < eps_at(n + 1) (or limit), given
    eps_at(lo) <= eps_target: exponential search for a failing upper bound (probes lo + step,
    then doubling steps; from 0 with step 1: 1, 2, 4, ...), then integer bisection."""
    hi = lo + step  # invariant: eps_at(lo) <= target; hi is the next probe / first failure
    while hi <= limit and eps_at(hi) <= eps_target:
        lo, hi, step = hi, hi + step, step * 2
    if hi > limit:
        if eps_at(limit) <= eps_target:
            return limit
        hi = limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if eps_at(mid) <= eps_target:
            lo = mid
        else:
            hi = mid
    return lo

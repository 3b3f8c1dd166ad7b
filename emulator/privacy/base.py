"""What every accountant shares.

`EpsilonTheorem` is the contract of the theorem dp.accountant names, the built-in ones' and a user's own;
`check_delta` and `last_within` are the check of delta and the search for the most steps within a target.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

Run = tuple[float, float, int]  # (q, sigma, steps): DP-SGD steps at sampling rate q and noise multiplier sigma
Runs = tuple[Run, ...]


def check_delta(delta: float) -> float:
    """Return `delta` as a float, or raise ValueError unless it is in (0, 1)."""
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return delta


class EpsilonTheorem(ABC):
    """Turn a client's DP-SGD history into the epsilon it has spent: the theorem dp.accountant names.

    Subclass it, write `epsilon` (and `max_steps`, if the theorem has a faster way than the default's
    search over `epsilon`), and name the class as `dp.accountant=package.module:ClassName`. Only the
    server imports it (as the scenario is validated: a bad name is refused before a run); it builds
    one instance, with no arguments, and asks it every round for the epsilon of each client charged,
    so it may keep its answers (the built-in ones cache theirs per distinct history).

    A history is a client's runs (q, sigma, steps) in the order it took them: `steps` steps of the
    sampled Gaussian mechanism, Poisson sampling at rate q and Gaussian noise sigma times the clip,
    between neighbouring datasets that differ by adding or removing one sample (Opacus's).
    """

    at_most_rdp: ClassVar[bool] = False
    """Whether `epsilon` is never above dp.accountant=rdp's (dp.conversion=improved) for the same runs, as
    prv's and pld's are: then whether a client affords another step is asked of rdp's first, which is
    cheaper, and of this theorem only when rdp's does not afford it."""

    @abstractmethod
    def epsilon(self, runs: Runs, delta: float) -> float:
        """Return the epsilon that `runs` spend at `delta`.

        Args:
            runs: one or more runs (q, sigma, steps) with 0 <= q <= 1, sigma > 0 and steps >= 1 (an
                empty history, which spends 0, a run of no steps and one without noise, which spends
                inf, are answered before a theorem is asked).
            delta: in (0, 1); the scenario's dp.delta lies in [1e-12, 0.1].

        Returns:
            An upper bound on epsilon, >= 0 and non-decreasing in each run's steps; `math.inf` for a
            history the theorem cannot bound (its client's budget is then spent). It must not raise
            for such a history: an exception, or a nan or negative answer, fails the run with one
            AccountantError naming dp.accountant (its traceback in the run's error.log).
        """

    def max_steps(self, q: float, sigma: float, delta: float, eps_target: float, prior: Runs, limit: int) -> int:
        """Return the most steps at (q, sigma) that may follow `prior` within `eps_target`.

        This is ALI-DPFL's R_c (Algorithm 3), which policy=ali_dpfl asks for at start. The default
        searches `epsilon` exactly: doubling steps until one is over the target, then bisecting.

        Args:
            q: the next run's sampling rate, in [0, 1].
            sigma: its noise multiplier, > 0.
            delta: as `epsilon`'s.
            eps_target: finite, and no less than the epsilon of `prior`.
            prior: the runs before it, as `epsilon`'s, or none.
            limit: the most steps to answer, >= 0.

        Returns:
            The n in [0, limit] whose epsilon (of `prior` then n steps at (q, sigma)) is within
            `eps_target` while n + 1's is not, or `limit` if that is within it.
        """
        return last_within(lambda n: self._epsilon_after(prior, (q, sigma, n), delta), eps_target, limit, 0, 1)

    def _epsilon_after(self, prior: Runs, run: Run, delta: float) -> float:
        """Return the epsilon of `prior` then `run`, where either may be of no steps."""
        runs = prior + (run,) if run[2] else prior
        return self.epsilon(runs, delta) if runs else 0.0

    @classmethod
    def missing(cls) -> str:
        """Return what this machine lacks to run the theorem (an optional package), or "" if nothing.

        Returns:
            The reason, as the scenario's refusal states it after the accountant's name.
        """
        return ""

    @classmethod  # noqa: B027  # not abstract: a theorem that keeps nothing has nothing to forget
    def clear_caches(cls) -> None:
        """Forget every kept answer (as a server starts: the tests, python -m bench.accountants)."""


def last_within(eps_at: Callable[[int], float], eps_target: float, limit: int, lo: int, step: int) -> int:
    """Return an n in [lo, limit] with eps_at(n) <= eps_target < eps_at(n + 1), or limit.

    Given eps_at(lo) <= eps_target: exponential search for a failing upper bound (probes lo + step,
    then doubling steps; from 0 with step 1: 1, 2, 4, ...), then integer bisection.
    """
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

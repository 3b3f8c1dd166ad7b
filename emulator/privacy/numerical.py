"""What the prv and pld accountants share: `NumericalTheorem`.

Both are numerical upper bounds, tighter than RDP's conversion; `dp.conversion` is RDP's and does not
apply to them. Each answers for a history's runs merged by (q, sigma) (composition commutes), cached
by (runs, delta). They are total: past RDP's eps = 100, PRV's grid limit or a theorem's `max_runs`
distinct runs, where the library raises its own error (PRV near delta = 1 or at a tiny delta) or PLD
has no finite answer, RDP's epsilon, an upper bound too, with a RuntimeWarning (`NUMERICAL_MAX_EPS`,
`PRV_MAX_POINTS`); and never above RDP's (both bound it). dp.delta's range, [1e-12, 0.1]
(nodes.contracts.schema), is where all three answer.
"""

from __future__ import annotations

import math
import warnings
from abc import abstractmethod
from collections.abc import Iterable
from functools import lru_cache
from typing import ClassVar

from emulator.privacy.base import EpsilonTheorem, Runs, last_within
from emulator.privacy.rdp import RdpTheorem

# Past RDP's epsilon = 100 (no privacy to speak of), PRV and PLD report RDP's epsilon, also an upper
# bound (theirs are a little below it there): their grids grow with the loss's range, so theirs would
# take GBs and seconds, more as eps grows (an unlimited budget with little noise gets there). RDP's is
# above theirs in practice, so eps keeps growing with steps across the switch.
NUMERICAL_MAX_EPS = 100.0
FALLBACK_WARNING = "dp.accountant={}: a history past {} (see emulator.privacy.numerical); RDP's epsilon is reported"
RDP = RdpTheorem()  # the bound both are held to, and where their searches start
# The theorems that reported RDP's epsilon since the run began (reset_fallbacks), and why: run.json's
# privacy_fallback, so that no table's epsilon is labelled with a theorem that did not compute it.
FALLBACKS: dict[str, str] = {}


def reset_fallbacks() -> None:
    """Forget the fallbacks of an earlier run in this process (a run starts with none)."""
    FALLBACKS.clear()


def _merged(entries: Iterable[tuple[float, float, int]]) -> tuple[tuple[float, float, int], ...]:
    """One run per (q, sigma), in order of (q, sigma); q = 0 runs dropped (no loss).

    Composition commutes, and n steps at (q, sigma) are the n-fold self-composition of one, so a
    history's epsilon under PRV or PLD is that of its merged runs; merged, equal histories are one
    question (the cache's key), and the libraries compose each mechanism once (their FFT
    self-composition), not once per run of it."""
    steps: dict[tuple[float, float], int] = {}
    for q, sigma, n in entries:
        if q > 0.0:
            steps[(q, sigma)] = steps.get((q, sigma), 0) + n
    return tuple((q, sigma, n) for (q, sigma), n in sorted(steps.items()))


@lru_cache(maxsize=65536)
def _numerical_epsilon(entries: Runs, delta: float, theorem: type[NumericalTheorem]) -> tuple[float, str]:
    """PRV's or PLD's epsilon of merged runs (sigma > 0, steps > 0), and what its grid could not hold
    where RDP's epsilon is reported instead ("" where not); cached by (runs, delta), as each answer
    costs orders of magnitude more CPU than RDP's (python -m bench.accountants)."""
    if not entries:
        return 0.0, ""
    rdp_eps = RDP.epsilon(entries, delta)
    eps: float | None = None
    past = "its grid"
    if rdp_eps > NUMERICAL_MAX_EPS:
        pass
    elif len(entries) > theorem.max_runs:
        past = f"{theorem.max_runs} distinct (q, sigma) runs"
    else:
        try:
            eps = theorem.grid_epsilon(entries, delta)
        except (ArithmeticError, ValueError, RuntimeError, MemoryError) as e:
            # the library's own refusal (PRV: "Cannot compute epsilon" near delta = 1, "Floating point errors
            # will dominate" at a tiny delta, a discretised mean off its continuous one): RDP's bound holds
            eps, past = None, f"what its library computes ({type(e).__name__}: {e})"
        if eps is not None and not eps < math.inf:  # PLD past its truncated mass (a delta below its tails): no answer
            eps, past = None, "its truncated tails (an infinite epsilon)"
    if eps is None:  # RDP's upper bound
        return rdp_eps, past
    # Both are upper bounds, so the smaller holds: PLD's pessimistic grid rounds each step's loss up to a
    # multiple of 1e-4, which past 10^6 steps of a loss far below it (sigma = 10^6) is above RDP's
    return min(max(float(eps), 0.0), rdp_eps), ""


class NumericalTheorem(EpsilonTheorem):
    """A theorem computed on a grid by its library (prv, pld): asked of the history's merged runs,
    cached, and RDP's epsilon past what its grid holds (see the module's docstring)."""

    at_most_rdp = True
    name: ClassVar[str]  # its dp.accountant, registered under it (emulator.privacy.registry), as the warning says it
    # Past this many distinct (q, sigma) runs in one history, RDP's epsilon: each distinct run is a PLD or PRV of its
    # own to build and compose (the server asks of every client every round; python -m bench.accountants
    # --histories), and only a policy that changes sigma or q every round gets there (Policy.changes_sigma: refused
    # at start where budget.rounds is past it).
    max_runs: ClassVar[int]

    @staticmethod
    @abstractmethod
    def question_seconds(runs: int) -> float:
        """Estimate the seconds of one epsilon question of a client whose history has grown run by run.

        Args:
            runs: The distinct (q, sigma) runs in the history, at most max_runs.

        Returns:
            About what python -m bench.accountants --histories measured on a 2-core machine (seconds).
        """

    @staticmethod
    @abstractmethod
    def grid_epsilon(runs: Runs, delta: float) -> float | None:
        """The library's epsilon of merged runs; None past the grid this module allows."""

    def epsilon(self, runs: Runs, delta: float) -> float:
        eps, past = _numerical_epsilon(_merged(runs), delta, type(self))
        if past:  # said and recorded at every answer, cached or not
            FALLBACKS[self.name] = past
            warnings.warn(FALLBACK_WARNING.format(self.name, past), RuntimeWarning, stacklevel=2)
        return eps

    def max_steps(self, q: float, sigma: float, delta: float, eps_target: float, prior: Runs, limit: int) -> int:
        # An answer costs far more than RDP's (python -m bench.accountants): start from RDP's R_c (tighter,
        # these reach at least as far in practice) when it is within the target under this theorem too,
        # with steps of 1/16 of it (their R_c is typically a fraction past RDP's), doubling.
        def eps_num(n: int) -> float:
            return self._epsilon_after(prior, (q, sigma, n), delta)

        within = RDP._epsilon_after(prior, (q, sigma, 0), delta) <= eps_target
        start = RDP.max_steps(q, sigma, delta, eps_target, prior, limit) if within else 0
        if start > 0 and eps_num(start) <= eps_target:
            return last_within(eps_num, eps_target, limit, start, max(1, start // 16))
        return last_within(eps_num, eps_target, limit, 0, 1)

    @classmethod
    def clear_caches(cls) -> None:
        _numerical_epsilon.cache_clear()

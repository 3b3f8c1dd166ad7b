"""What the prv and pld accountants share.

Both are numerical upper bounds, tighter than RDP's conversion; `dp.conversion` is RDP's and does not
apply to them. Each answers for a history's runs merged by (q, sigma) (composition commutes), cached
by (runs, delta). They are total: past RDP's eps = 100, PRV's grid limit or NUMERICAL_MAX_RUNS
distinct runs, where the library raises its own error (PRV near delta = 1 or at a tiny delta) or PLD
has no finite answer, RDP's epsilon, an upper bound too, with a RuntimeWarning (`NUMERICAL_MAX_EPS`,
`PRV_MAX_POINTS`); and never above RDP's (both bound it). dp.delta's range, [1e-12, 0.1]
(nodes.contracts.schema), is where all three answer.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from functools import lru_cache

from emulator.privacy.pld import _pld_epsilon
from emulator.privacy.prv import _prv_epsilon
from emulator.privacy.rdp import DEFAULT_ORDERS, _epsilon_of
from nodes.contracts.schema import AccountantKind, Conversion

# Past RDP's epsilon = 100 (no privacy to speak of), PRV and PLD report RDP's epsilon, also an upper
# bound (theirs are a little below it there): their grids grow with the loss's range, so theirs would
# take GBs and seconds, more as eps grows (an unlimited budget with little noise gets there). RDP's is
# above theirs in practice, so eps keeps growing with steps across the switch.
NUMERICAL_MAX_EPS = 100.0


FALLBACK_WARNING = "dp.accountant={}: a history past {} (see emulator.privacy.numerical); RDP's epsilon is reported"
# Past this many distinct (q, sigma) runs in one history, RDP's epsilon too: each distinct run is a PLD or PRV of its
# own to build (python -m bench --only accountants) and compose (the server asks of every client every round), and
# only a policy that changes sigma or q every round gets there (adap_dpfl's decays, at most once a round).
NUMERICAL_MAX_RUNS = 1000


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
def _numerical_epsilon(entries: tuple[tuple[float, float, int], ...], delta: float, accountant: str) -> float:
    """PRV's or PLD's epsilon of merged runs (sigma > 0, steps > 0); cached by (runs, delta), as
    each answer costs orders of magnitude more CPU than RDP's (python -m bench.accountants)."""
    if not entries:
        return 0.0
    rdp_eps = _epsilon_of(entries, tuple(DEFAULT_ORDERS), delta, Conversion.IMPROVED.value)
    eps: float | None = None
    past = "its grid"
    if rdp_eps > NUMERICAL_MAX_EPS:
        pass
    elif len(entries) > NUMERICAL_MAX_RUNS:
        past = f"{NUMERICAL_MAX_RUNS} distinct (q, sigma) runs"
    else:
        try:
            eps = _prv_epsilon(entries, delta) if accountant == AccountantKind.PRV else _pld_epsilon(entries, delta)
        except (ArithmeticError, ValueError, RuntimeError, MemoryError) as e:
            # the library's own refusal (PRV: "Cannot compute epsilon" near delta = 1, "Floating point errors
            # will dominate" at a tiny delta, a discretised mean off its continuous one): RDP's bound holds
            eps, past = None, f"what its library computes ({type(e).__name__}: {e})"
        if eps is not None and not eps < math.inf:  # PLD past its truncated mass (a delta below its tails): no answer
            eps, past = None, "its truncated tails (an infinite epsilon)"
    if eps is None:  # RDP's upper bound
        warnings.warn(FALLBACK_WARNING.format(accountant, past), RuntimeWarning, stacklevel=2)
        return rdp_eps
    # Both are upper bounds, so the smaller holds: PLD's pessimistic grid rounds each step's loss up to a
    # multiple of 1e-4, which past 10^6 steps of a loss far below it (sigma = 10^6) is above RDP's
    return min(max(float(eps), 0.0), rdp_eps)

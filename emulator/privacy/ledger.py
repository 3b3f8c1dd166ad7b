"""A client's privacy history and what it has spent.

Sample-level DP-SGD (ALI-DPFL §IV-D): a per-client `PrivacyLedger` of homogeneous runs (q, sigma,
steps); runs with different sigma or q compose (ALI-DPFL Definition 3). `epsilon` turns a history into
(eps, delta)-DP; `accountant` (the scenario's dp.accountant) picks the theorem for the same history
(emulator.privacy.registry): "rdp" (default; emulator.privacy.rdp), "prv" (emulator.privacy.prv),
"pld" (emulator.privacy.pld) or a user's EpsilonTheorem subclass. `max_steps` is R_c (ALI-DPFL
Algorithm 3), as an exact integer search. A history of (q, sigma, steps) runs is accountant-independent
data: any accountant may read a ledger another wrote.

Everything here is a pure function of its arguments; ledgers are plain data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from emulator.privacy.base import check_delta
from emulator.privacy.rdp import DEFAULT_ORDERS, _rdp_sum
from emulator.privacy.registry import ACCOUNTANTS, AccountantError, theorem
from nodes.contracts.plugins import is_user_class

T = TypeVar("T")


def _check_entry(q: float, sigma: float, steps: float) -> tuple[float, float, int]:
    q = float(q)
    sigma = float(sigma)
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"sampling rate q must be in [0, 1], got {q}")
    if not sigma >= 0.0:  # also rejects nan
        raise ValueError(f"noise multiplier sigma must be >= 0, got {sigma}")
    if isinstance(steps, float) and not steps.is_integer():
        raise ValueError(f"steps must be an integer, got {steps}")
    steps_i = int(steps)
    if steps_i < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    return q, sigma, steps_i


@dataclass
class LedgerEntry:
    """One homogeneous run of DP-SGD steps: `steps` steps at sampling rate q, noise sigma."""

    q: float
    sigma: float
    steps: int

    def as_tuple(self) -> tuple[float, float, int]:
        return (self.q, self.sigma, self.steps)


@dataclass
class PrivacyLedger:
    """A client's privacy history; persists across rounds (never reset on re-wrap)."""

    entries: list[LedgerEntry] = field(default_factory=list)

    def record(self, q: float, sigma: float, steps: int) -> None:
        """Append `steps` DP-SGD steps; merges into the last entry when (q, sigma) are equal.
        Recording 0 steps is a no-op."""
        q, sigma, steps = _check_entry(q, sigma, steps)
        if steps == 0:
            return
        if self.entries and self.entries[-1].q == q and self.entries[-1].sigma == sigma:
            self.entries[-1].steps += steps
        else:
            self.entries.append(LedgerEntry(q, sigma, steps))

    def steps(self) -> int:
        return sum(e.steps for e in self.entries)

    def history(self) -> list[tuple[float, float, int]]:
        return [e.as_tuple() for e in self.entries]

    def epsilon(self, delta: float, conversion: str = "improved") -> float:
        return epsilon(self.history(), delta, conversion=conversion)

    def max_steps(
        self, q: float, sigma: float, delta: float, eps_target: float, conversion: str = "improved", limit: int = 10**7
    ) -> int:
        """How many more steps at (q, sigma) this client can take within eps_target."""
        return max_steps(q, sigma, delta, eps_target, history=self.history(), conversion=conversion, limit=limit)

    def to_dict(self) -> dict[str, list[dict[str, float]]]:
        return {"entries": [{"q": e.q, "sigma": e.sigma, "steps": e.steps} for e in self.entries]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PrivacyLedger:
        entries = []
        for e in d.get("entries", []):
            q, sigma, steps = _check_entry(e["q"], e["sigma"], e["steps"])
            entries.append(LedgerEntry(q, sigma, steps))
        return cls(entries=entries)


# A privacy history: a ledger, or its entries, or (q, sigma, steps) runs (steps integral).
PrivacyHistory = PrivacyLedger | Iterable[LedgerEntry | tuple[float, float, float]]


def _entries(history: PrivacyHistory) -> list[tuple[float, float, int]]:
    if isinstance(history, PrivacyLedger):
        history = history.entries
    out = []
    for h in history:
        if isinstance(h, LedgerEntry):
            h = h.as_tuple()
        q, sigma, steps = h
        out.append(_check_entry(q, sigma, steps))
    return out


def rdp(history: PrivacyHistory, orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
    """RDP of a sequence of (q, sigma, steps) runs of the sampled Gaussian mechanism at each
    order: sum over runs of Opacus `compute_rdp` (ALI-DPFL eq. 15-16, Definition 3).
    sigma == 0 with steps > 0 -> inf; steps == 0 contributes 0."""
    return _rdp_sum(_entries(history), list(orders))


def epsilon(
    history: PrivacyHistory,
    delta: float,
    conversion: str = "improved",
    orders: Sequence[float] | None = None,
    *,
    accountant: str = "rdp",
) -> float:
    """(eps, delta)-DP spent by a (q, sigma, steps) history; 0.0 for an empty history, inf for one
    with a step without noise; otherwise the answer of the theorem `accountant` names (registry):

    accountant="rdp":
      conversion="improved": equals Opacus RDPAccountant.get_epsilon(delta) (default orders).
      conversion="classic": ALI-DPFL Theorem 2 over CLASSIC_ORDERS (integer alpha >= 2).
    accountant="prv": Opacus PRVAccountant.get_epsilon(delta, eps_error=PRV_EPS_ERROR).
    accountant="pld": dp_accounting PLDAccountant(value_discretization_interval=1e-4).get_epsilon(delta)
      of the runs' PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), each self-composed `steps` times.
    accountant="package.module:ClassName": that EpsilonTheorem subclass's.
    """
    delta = check_delta(delta)
    spent_by = theorem(accountant, conversion, None if orders is None else tuple(orders))
    entries = tuple(e for e in _entries(history) if e[2] > 0)
    if not entries:
        return 0.0
    if any(sigma == 0.0 for _, sigma, _ in entries):
        return math.inf
    eps = _asked(accountant, "epsilon", lambda: float(spent_by.epsilon(entries, delta)))
    if not eps >= 0.0:
        raise AccountantError(
            f"dp.accountant = {accountant!r}: epsilon returned {eps} for {len(entries)} runs at delta = {delta:g}; "
            "expected a number >= 0 (inf where the theorem has no bound)"
        )
    return eps


def _asked(accountant: str, method: str, ask: Callable[[], T]) -> T:
    """ask(); an exception of a user's theorem is one AccountantError naming dp.accountant and the method
    (a built-in's propagates as it is: the emulator's own error)."""
    try:
        return ask()
    except Exception as e:
        if not is_user_class(accountant):
            raise
        said = str(e).splitlines()[0] if str(e) else ""
        raise AccountantError(f"dp.accountant = {accountant!r}: {method} raised {type(e).__name__}: {said}") from e


def clear_caches() -> None:
    """Forget every kept answer and PLD (as a server starts: python -m bench.accountants, the tests)."""
    for name in ACCOUNTANTS.names():
        ACCOUNTANTS.get(name).clear_caches()


def max_steps(
    q: float,
    sigma: float,
    delta: float,
    eps_target: float,
    history: PrivacyHistory = (),
    conversion: str = "improved",
    limit: int = 10**7,
    *,
    accountant: str = "rdp",
) -> int:
    """R_c (ALI-DPFL Algorithm 3): the largest integer n in [0, limit] such that
    epsilon(history + [(q, sigma, n)]) <= eps_target.

    Algorithm 3 bisects a real-valued T to a 0.01 tolerance on eps; here the search is over
    integers and exact, using that eps is non-decreasing in n (RDP grows linearly in n and
    both conversions are minima of increasing functions of RDP; PRV and PLD are distributions
    of n-fold compositions, whose exact eps grows with n). The search keeps eps(lo) <= target <
    eps(hi) and ends at hi = lo + 1, so eps(R_c) <= target < eps(R_c + 1) holds for the values
    epsilon() returns whatever the accountant; PRV's and PLD's are numerical estimates, monotone in
    n up to their discretisation. Returns 0 when even n = 0 exceeds the target (the prior history
    alone is over budget), and `limit` when the target is infinite or never reached within `limit`
    steps.
    """
    delta = check_delta(delta)
    q, sigma, _ = _check_entry(q, sigma, 0)
    spent_by = theorem(accountant, conversion)
    limit = int(limit)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    eps_target = float(eps_target)
    if math.isnan(eps_target):
        raise ValueError("eps_target is nan")
    if eps_target == math.inf:
        return limit

    prior = tuple(e for e in _entries(history) if e[2] > 0)
    eps_prior = epsilon(prior, delta, conversion, accountant=accountant)
    if eps_prior > eps_target:
        return 0
    if sigma == 0.0:
        return 0  # one unnoised step is already infinite loss
    return _asked(accountant, "max_steps", lambda: spent_by.max_steps(q, sigma, delta, eps_target, prior, limit))

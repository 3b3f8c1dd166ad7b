"""Privacy accounting: RDP ledgers for sample-level DP-SGD, and what the papers' output
perturbation schemes share.

* Sample-level DP-SGD (ALI-DPFL §IV-D): a per-client `PrivacyLedger` of homogeneous
  runs (q, sigma, steps). RDP comes from Opacus's analysis (`compute_rdp`, loaded from its
  file without importing the opacus package: `_opacus_rdp`); runs with
  different sigma or q compose by adding RDP (ALI-DPFL Definition 3). Two conversions
  to (eps, delta)-DP:
    - "improved": Opacus `get_privacy_spent` (Balle et al. 2020, Thm 21); identical to
      `opacus.accountants.RDPAccountant.get_epsilon` on the same history;
    - "classic": eps = min over integer alpha >= 2 of RDP(alpha) + log(1/delta)/(alpha-1)
      (ALI-DPFL Theorem 2, eq. 12, via Definition 4).
  `max_steps` is R_c (ALI-DPFL Algorithm 3), as an exact integer search.
* Output perturbation: the classic Gaussian mechanism's constant; each paper's calibration
  lives with its policy (Fu et al. Thm 1-2 in fu_tuning, Wei et al. eq. 10 and 25 in udp_crd,
  Talaei & Izadi eq. 8 and 13 in padpfl).

Everything here is a pure function of its arguments; ledgers are plain data.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from nodes.schema import Conversion


@cache
def _opacus_rdp() -> ModuleType:
    """opacus/accountants/analysis/rdp.py, executed from its file. Importing it by name would run
    opacus/__init__, which imports all of Opacus (torch, scipy.stats: ~1.6 s of CPU) for two
    functions that need only numpy and scipy.special; the server has no other use for Opacus.
    Loaded at first use: scipy.special's ~0.2 s then overlap the workers' start."""
    package = importlib.util.find_spec("opacus")  # finds the package without executing it
    if package is None or package.origin is None:
        raise ImportError("opacus is not installed (pip install opacus)")
    path = Path(package.origin).parent / "accountants" / "analysis" / "rdp.py"
    spec = importlib.util.spec_from_file_location("dpfl_opacus_rdp", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load Opacus's RDP analysis from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Opacus's RDP orders: 1.1, 1.2, ..., 10.9, 12, ..., 63 (RDPAccountant.DEFAULT_ALPHAS; a test checks them).
DEFAULT_ORDERS: list[float] = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))

# ALI-DPFL Theorem 2 holds for "any integer alpha >= 2"; we minimise over 2..64 plus a few
# large orders so that very small per-step losses are not cut off at alpha = 64.
CLASSIC_ORDERS: list[int] = list(range(2, 65)) + [128, 256, 512]

CONVERSIONS = tuple(c.value for c in Conversion)


# --- ledger ------------------------------------------------------------------------------


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


# --- RDP and conversion ------------------------------------------------------------------

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


def check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return delta


def _orders_for(conversion: str, orders: Iterable[float] | None) -> Sequence[float]:
    if conversion not in CONVERSIONS:
        raise ValueError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")
    if orders is not None:
        return list(orders)
    return DEFAULT_ORDERS if conversion == Conversion.IMPROVED else CLASSIC_ORDERS


@lru_cache(maxsize=4096)
def _rdp_one_step(q: float, sigma: float, orders: tuple[float, ...]) -> np.ndarray:
    # Opacus's compute_rdp is (one-step RDP) * steps, so caching one step per (q, sigma) gives
    # the same bits at a fraction of the cost (the server asks every round for every client).
    out: np.ndarray = _opacus_rdp().compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=list(orders))
    out.setflags(write=False)
    return out


def _rdp_sum(entries: Iterable[tuple[float, float, int]], orders: Sequence[float]) -> np.ndarray:
    # Same summation as RDPAccountant.get_privacy_spent, so results match it bit for bit.
    total = np.zeros(len(orders))
    for q, sigma, steps in entries:
        if steps == 0:
            continue
        if sigma == 0.0:
            total = total + np.inf  # no noise: no privacy (even at q = 0, conservatively)
            continue
        total = total + _rdp_one_step(q, sigma, tuple(orders)) * steps
    return total


def rdp(history: PrivacyHistory, orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
    """RDP of a sequence of (q, sigma, steps) runs of the sampled Gaussian mechanism at each
    order: sum over runs of Opacus `compute_rdp` (ALI-DPFL eq. 15-16, Definition 3).
    sigma == 0 with steps > 0 -> inf; steps == 0 contributes 0."""
    return _rdp_sum(_entries(history), list(orders))


def _eps_from_rdp(rdp_vec: np.ndarray, orders: Sequence[float], delta: float, conversion: str) -> float:
    if conversion == Conversion.IMPROVED:
        # Balle et al. 2020 via Opacus; silence its "optimal order is extreme" warning,
        # which would fire on every probe of max_steps' search.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eps, _ = _opacus_rdp().get_privacy_spent(orders=orders, rdp=rdp_vec, delta=delta)
        eps = float(eps)
    else:
        # ALI-DPFL Theorem 2 (eq. 12) = Lemma 3 (eq. 16) + Definition 4:
        #   eps = min_alpha [ RDP(alpha) + log(1/delta) / (alpha - 1) ],  integer alpha >= 2.
        a = np.asarray(orders, dtype=float)
        eps = float(np.min(rdp_vec + math.log(1.0 / delta) / (a - 1.0)))
    if math.isnan(eps):
        return math.inf
    # The improved bound can dip below 0 for delta close to 1; (0, delta)-DP holds then.
    return max(eps, 0.0)


def epsilon(
    history: PrivacyHistory, delta: float, conversion: str = "improved", orders: Sequence[float] | None = None
) -> float:
    """(eps, delta)-DP spent by a (q, sigma, steps) history; 0.0 for an empty history.

    conversion="improved": equals Opacus RDPAccountant.get_epsilon(delta) (default orders).
    conversion="classic": ALI-DPFL Theorem 2 over CLASSIC_ORDERS (integer alpha >= 2).
    """
    delta = check_delta(delta)
    orders = _orders_for(conversion, orders)
    entries = tuple(e for e in _entries(history) if e[2] > 0)
    if not entries:
        return 0.0
    if any(sigma == 0.0 for _, sigma, _ in entries):
        return math.inf
    return _epsilon_of(entries, tuple(orders), delta, conversion)


@lru_cache(maxsize=65536)
def _epsilon_of(
    entries: tuple[tuple[float, float, int], ...], orders: tuple[float, ...], delta: float, conversion: str
) -> float:
    # The server asks every round for every client's epsilon, and most clients' histories are
    # equal (same-(q, sigma) runs merge): 1,000 clients hold a handful of distinct histories.
    return _eps_from_rdp(_rdp_sum(entries, orders), orders, delta, conversion)


def max_steps(
    q: float,
    sigma: float,
    delta: float,
    eps_target: float,
    history: PrivacyHistory = (),
    conversion: str = "improved",
    limit: int = 10**7,
) -> int:
    """R_c (ALI-DPFL Algorithm 3): the largest integer n in [0, limit] such that
    epsilon(history + [(q, sigma, n)]) <= eps_target.

    Algorithm 3 bisects a real-valued T to a 0.01 tolerance on eps; here the search is over
    integers and exact, using that eps is non-decreasing in n (RDP grows linearly in n and
    both conversions are minima of increasing functions of RDP). Returns 0 when even n = 0
    exceeds the target (the prior history alone is over budget), and `limit` when the
    target is infinite or never reached within `limit` steps.
    """
    delta = check_delta(delta)
    q, sigma, _ = _check_entry(q, sigma, 0)
    orders = _orders_for(conversion, None)
    limit = int(limit)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    eps_target = float(eps_target)
    if math.isnan(eps_target):
        raise ValueError("eps_target is nan")
    if eps_target == math.inf:
        return limit

    prior = [e for e in _entries(history) if e[2] > 0]
    eps_prior = epsilon(prior, delta, conversion)
    if eps_prior > eps_target:
        return 0
    if sigma == 0.0:
        return 0  # one unnoised step is already infinite loss
    base = _rdp_sum(prior, orders)
    # compute_rdp(steps=n) is exactly compute_rdp(steps=1) * n, and _rdp_sum adds entries
    # in order, so eps_at(n) is bitwise epsilon(history + [(q, sigma, n)]).
    one = _opacus_rdp().compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders)

    def eps_at(n: int) -> float:
        if n == 0:
            return eps_prior  # (one * 0 would turn an inf order into nan)
        return _eps_from_rdp(base + one * n, orders, delta, conversion)

    # Exponential search for a failing upper bound, then integer bisection.
    lo, hi = 0, 1  # invariant: eps_at(lo) <= target; hi is the next probe / first failure
    while hi <= limit and eps_at(hi) <= eps_target:
        lo, hi = hi, hi * 2
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


# --- output perturbation: the classic Gaussian mechanism ------------------------------------


def check_epsilon(eps: float) -> float:
    eps = float(eps)
    if not eps > 0.0:
        raise ValueError(f"epsilon must be > 0, got {eps}")
    return eps


def gaussian_c(delta: float) -> float:
    """c = sqrt(2 ln(1.25/delta)), the classic Gaussian-mechanism constant (Dwork & Roth
    Thm A.1; quoted in Talaei & Izadi §II and used in their eq. 8 and 13)."""
    return math.sqrt(2.0 * math.log(1.25 / check_delta(delta)))

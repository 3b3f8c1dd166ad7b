"""The rdp accountant: Renyi DP of the sampled Gaussian mechanism, converted to (eps, delta)-DP.

RDP comes from Opacus's analysis (`compute_rdp`, loaded from its file without importing the opacus
package: `_opacus_rdp`); runs with different sigma or q compose by adding RDP (ALI-DPFL Definition 3).
Two conversions to (eps, delta)-DP (dp.conversion):
  - "improved": Opacus `get_privacy_spent` (Balle et al. 2020, Thm 21); identical to
    `opacus.accountants.RDPAccountant.get_epsilon` on the same history;
  - "classic": eps = min over integer alpha >= 2 of RDP(alpha) + log(1/delta)/(alpha-1)
    (ALI-DPFL Theorem 2, eq. 12, via Definition 4).
`RdpTheorem.max_steps` is R_c (ALI-DPFL Algorithm 3) as an exact integer search over RDP's sums.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections.abc import Iterable, Sequence
from functools import cache, lru_cache
from pathlib import Path
from types import ModuleType

import numpy as np

from emulator.privacy.base import EpsilonTheorem, Runs, last_within
from nodes.contracts.schema import Conversion


@cache
def _opacus_rdp() -> ModuleType:
    """opacus/accountants/analysis/rdp.py, executed from its file. Importing it by name would run
    opacus/__init__, which imports all of Opacus (torch, scipy.stats) for two functions that need
    only numpy and scipy.special; the server has no other use for Opacus. Loaded at first use:
    scipy.special's import then overlaps the workers' start (python -m bench --only startup)."""
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
    try:
        out: np.ndarray = _opacus_rdp().compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=list(orders))
    except OverflowError:  # sigma ** 2 past float's range (sigma > 1e154): alpha / (2 sigma^2), above it, is 0.0
        out = np.asarray(orders, dtype=float) / 2 / sigma / sigma
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


@lru_cache(maxsize=65536)
def _epsilon_of(
    entries: tuple[tuple[float, float, int], ...], orders: tuple[float, ...], delta: float, conversion: str
) -> float:
    # The server asks every round for every client's epsilon, and most clients' histories are
    # equal (same-(q, sigma) runs merge): 1,000 clients hold a handful of distinct histories.
    return _eps_from_rdp(_rdp_sum(entries, orders), orders, delta, conversion)


class RdpTheorem(EpsilonTheorem):
    """dp.accountant=rdp: the runs' RDP, added over runs, converted to (eps, delta) by dp.conversion.

    Built with dp.conversion, as any subclass of it is (dp.conversion is this theorem's); a subclass
    that changes `epsilon` writes `max_steps` too, as this one's sums RDP itself.

    Args:
        conversion: "improved" (Opacus's `get_privacy_spent`) or "classic" (ALI-DPFL Theorem 2).
        orders: the RDP orders to convert over; by default the conversion's (DEFAULT_ORDERS, CLASSIC_ORDERS).
    """

    def __init__(self, conversion: str = "improved", orders: Iterable[float] | None = None) -> None:
        self.conversion = conversion
        self.orders = tuple(_orders_for(conversion, orders))

    def epsilon(self, runs: Runs, delta: float) -> float:
        return _epsilon_of(runs, self.orders, delta, self.conversion)

    def max_steps(self, q: float, sigma: float, delta: float, eps_target: float, prior: Runs, limit: int) -> int:
        orders = list(self.orders)
        base = _rdp_sum(prior, orders)
        # compute_rdp(steps=n) is exactly compute_rdp(steps=1) * n, and _rdp_sum adds entries
        # in order, so eps_at(n) is bitwise epsilon(history + [(q, sigma, n)]).
        one = _opacus_rdp().compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders)
        eps_prior = self._epsilon_after(prior, (q, sigma, 0), delta)

        def eps_at(n: int) -> float:
            if n == 0:
                return eps_prior  # (one * 0 would turn an inf order into nan)
            return _eps_from_rdp(base + one * n, orders, delta, self.conversion)

        return last_within(eps_at, eps_target, limit, 0, 1)

    @classmethod
    def clear_caches(cls) -> None:
        _epsilon_of.cache_clear()
        _rdp_one_step.cache_clear()

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
  `accountant` (the scenario's dp.accountant) picks the theorem for the same history:
    - "rdp" (default): the above;
    - "prv": Opacus's `PRVAccountant.get_epsilon` (Gopi et al. 2021, "Numerical composition of
      differential privacy"): the privacy random variables discretised and composed by FFT; its
      upper bound eps_upper at Opacus's default eps_error 0.01, delta_error delta/1000 (from the
      analysis' files, as for RDP: `_opacus_prv`);
    - "pld": Google's dp_accounting `PLDAccountant` (Koskela et al. 2020; Meiser & Mohammadi
      2018; Doroshenko et al. 2022's connect-the-dots), a pessimistic privacy loss distribution
      at the library's default discretisation 1e-4, add-or-remove-one neighbours (as Opacus's).
  Both are numerical upper bounds, tighter than RDP's conversion; `dp.conversion` is RDP's and
  does not apply to them. Each answers for a history's runs merged by (q, sigma) (composition
  commutes), cached by (runs, delta); PLD keeps each history's composed PLD, so that one a run longer
  (a client's next round) composes only that run. They are total: past RDP's eps = 100, PRV's grid
  limit or NUMERICAL_MAX_RUNS distinct runs, where the library raises its own error (PRV near delta =
  1 or at a tiny delta) or PLD has no finite answer, RDP's epsilon, an upper bound too, with a
  RuntimeWarning (`NUMERICAL_MAX_EPS`, `PRV_MAX_POINTS`); and never above RDP's (both bound it).
  dp.delta's range, [1e-12, 0.1] (nodes.contracts.schema), is where all three answer. A history of
  (q, sigma, steps) runs is accountant-independent data: any accountant may read a ledger another wrote.
* Output perturbation: the classic Gaussian mechanism's constant; each paper's calibration
  lives with its policy (Fu et al. Thm 1-2 in fu_tuning, Wei et al. eq. 10 and 25 in udp_crd,
  Talaei & Izadi eq. 8 and 13 in padpfl).

Everything here is a pure function of its arguments; ledgers are plain data.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from nodes.contracts.schema import AccountantKind, Conversion


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


@cache
def _opacus_prv() -> ModuleType:
    """opacus/accountants/analysis/prv, executed from its files as `_opacus_rdp` is, so that
    dp.accountant=prv keeps the server free of torch too: a package of its own, whose `..rdp` is
    `_opacus_rdp`'s module and whose `...rdp` (Opacus's RDPAccountant, which only its
    compute_safe_domain_size uses; `_prv_epsilon` sizes the domain itself) is a stand-in. Another
    layout of Opacus's files: the ordinary import (which imports torch)."""
    try:
        return _prv_from_files()
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == _PRV_ROOT]:
            del sys.modules[name]
        import opacus.accountants.analysis.prv as prv

        imported: ModuleType = prv
        return imported


_PRV_ROOT = "dpfl_opacus"


def _prv_from_files() -> ModuleType:
    package = importlib.util.find_spec("opacus")
    if package is None or package.origin is None:
        raise ImportError("opacus is not installed (pip install opacus)")
    here = Path(package.origin).parent / "accountants" / "analysis" / "prv"
    for name in (_PRV_ROOT, f"{_PRV_ROOT}.accountants", f"{_PRV_ROOT}.accountants.analysis"):
        parent = ModuleType(name)
        parent.__path__ = []  # a package with no files: only what is set here
        sys.modules[name] = parent
    sys.modules[f"{_PRV_ROOT}.accountants.analysis.rdp"] = _opacus_rdp()
    stand_in = ModuleType(f"{_PRV_ROOT}.accountants.rdp")
    setattr(stand_in, "RDPAccountant", None)  # noqa: B010  # domain.py's import; never called here
    sys.modules[stand_in.__name__] = stand_in
    name = f"{_PRV_ROOT}.accountants.analysis.prv"
    spec = importlib.util.spec_from_file_location(name, here / "__init__.py", submodule_search_locations=[str(here)])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load Opacus's PRV analysis from {here}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def pld_installed() -> bool:
    """Is Google's dp_accounting importable (dp.accountant=pld)? Validation asks before a run."""
    return importlib.util.find_spec("dp_accounting") is not None


@cache
def _dp_accounting() -> ModuleType:
    if not pld_installed():
        raise ImportError(f"dp.accountant=pld needs Google's dp-accounting package ({PLD_INSTALL})")
    import dp_accounting  # optional: the [pld] extra

    mod: ModuleType = dp_accounting
    return mod


# Opacus's RDP orders: 1.1, 1.2, ..., 10.9, 12, ..., 63 (RDPAccountant.DEFAULT_ALPHAS; a test checks them).
DEFAULT_ORDERS: list[float] = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))

# ALI-DPFL Theorem 2 holds for "any integer alpha >= 2"; we minimise over 2..64 plus a few
# large orders so that very small per-step losses are not cut off at alpha = 64.
CLASSIC_ORDERS: list[int] = list(range(2, 65)) + [128, 256, 512]

CONVERSIONS = tuple(c.value for c in Conversion)
ACCOUNTANTS = tuple(a.value for a in AccountantKind)

# PRV (Opacus PRVAccountant.get_epsilon's defaults, passed explicitly so that the tests' call of the
# library is the same question): |eps_upper - eps| <= eps_error; delta_error = delta / 1000.
PRV_EPS_ERROR = 0.01
PRV_DELTA_ERROR_FRACTION = 1e-3
# Past RDP's epsilon = 100 (no privacy to speak of), PRV and PLD report RDP's epsilon, also an upper
# bound (theirs are a little below it there): their grids grow with the loss's range, so theirs would
# take GBs and seconds, more as eps grows (an unlimited budget with little noise gets there). RDP's is
# above theirs in practice, so eps keeps growing with steps across the switch.
NUMERICAL_MAX_EPS = 100.0
# Opacus discretises each PRV on 2 L / mesh points (L: RDP's epsilon at delta_error / 4, + 3; mesh:
# eps_error / sqrt(steps ln(12 / delta_error) / 2)), which also grows with the steps; past this many
# (a grid that takes memory and seconds) RDP's epsilon, as above. 14,063 steps at eps 2.4: 5 * 10^5;
# 10^6 steps at q = 0.001, sigma = 1 (eps 6) are past it: pld's grid does not grow with the steps.
PRV_MAX_POINTS = 2**22
FALLBACK_WARNING = "dp.accountant={}: a history past {} (see emulator.privacy.accountants); RDP's epsilon is reported"
# Past this many distinct (q, sigma) runs in one history, RDP's epsilon too: each distinct run is a PLD or PRV of its
# own to build (python -m bench --only accountants) and compose (the server asks of every client every round), and
# only a policy that changes sigma or q every round gets there (adap_dpfl's decays, at most once a round).
NUMERICAL_MAX_RUNS = 1000
# PLD (dp_accounting PLDAccountant's default): the privacy loss's discretisation interval.
PLD_VALUE_DISCRETIZATION = 1e-4
PLD_INSTALL = "pip install 'dpfl-emulator[pld]'"


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


def _check_accountant(accountant: str, conversion: str, orders: Iterable[float] | None) -> None:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    if accountant != AccountantKind.RDP and (conversion != Conversion.IMPROVED or orders is not None):
        raise ValueError(f"conversion and orders are the rdp accountant's; accountant={accountant!r} has neither")


def epsilon(
    history: PrivacyHistory,
    delta: float,
    conversion: str = "improved",
    orders: Sequence[float] | None = None,
    *,
    accountant: str = "rdp",
) -> float:
    """(eps, delta)-DP spent by a (q, sigma, steps) history; 0.0 for an empty history.

    accountant="rdp":
      conversion="improved": equals Opacus RDPAccountant.get_epsilon(delta) (default orders).
      conversion="classic": ALI-DPFL Theorem 2 over CLASSIC_ORDERS (integer alpha >= 2).
    accountant="prv": Opacus PRVAccountant.get_epsilon(delta, eps_error=PRV_EPS_ERROR).
    accountant="pld": dp_accounting PLDAccountant(value_discretization_interval=1e-4).get_epsilon(delta)
      of the runs' PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), each self-composed `steps` times.
    """
    delta = check_delta(delta)
    _check_accountant(accountant, conversion, orders)
    entries = tuple(e for e in _entries(history) if e[2] > 0)
    if not entries:
        return 0.0
    if any(sigma == 0.0 for _, sigma, _ in entries):
        return math.inf
    if accountant == AccountantKind.RDP:
        return _epsilon_of(entries, tuple(_orders_for(conversion, orders)), delta, conversion)
    return _numerical_epsilon(_merged(entries), delta, accountant)


@lru_cache(maxsize=65536)
def _epsilon_of(
    entries: tuple[tuple[float, float, int], ...], orders: tuple[float, ...], delta: float, conversion: str
) -> float:
    # The server asks every round for every client's epsilon, and most clients' histories are
    # equal (same-(q, sigma) runs merge): 1,000 clients hold a handful of distinct histories.
    return _eps_from_rdp(_rdp_sum(entries, orders), orders, delta, conversion)


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


def _prv_epsilon(entries: tuple[tuple[float, float, int], ...], delta: float) -> float | None:
    """Opacus PRVAccountant.get_epsilon(delta, eps_error=PRV_EPS_ERROR) of the runs (Gopi et al. 2021,
    PRV), step for step from the library's public parts, with two differences that change no bit:
    the RDP epsilons that size its domain (Remark 5.6, as Opacus's compute_safe_domain_size computes
    them) come from this module's cache, which equals RDPAccountant.get_epsilon bit for bit (most of
    Opacus's time: the fractional orders), and the domain is sized before anything is allocated: None
    past PRV_MAX_POINTS. A test holds the result to PRVAccountant's own."""
    prv = _opacus_prv()
    delta_error = delta * PRV_DELTA_ERROR_FRACTION
    counts = [n for _, _, n in entries]
    total = sum(counts)
    # compute_safe_domain_size: RDP's epsilon of the whole history at delta_error / 4, and of one step
    # of each run at delta_error / (8 * total), the largest, then max(., eps_error) + 3
    half_width = _epsilon_of(entries, tuple(DEFAULT_ORDERS), delta_error / 4, Conversion.IMPROVED.value)
    for q, sigma, _ in entries:
        one = _epsilon_of(((q, sigma, 1),), tuple(DEFAULT_ORDERS), delta_error / (8 * total), Conversion.IMPROVED.value)
        half_width = max(half_width, one)
    half_width = max(half_width, PRV_EPS_ERROR) + 3
    # PRVAccountant._get_domain
    mesh_size = PRV_EPS_ERROR / np.sqrt(total * np.log(12 / delta_error) / 2)
    domain = prv.Domain.create_aligned(-half_width, half_width, mesh_size)
    if domain.size > PRV_MAX_POINTS:
        return None
    # PRVAccountant._get_dprv and get_epsilon
    with np.errstate(divide="ignore"):  # q = 1: log(1 - q) in PoissonSubsampledGaussianPRV, harmless
        rvs = [prv.PoissonSubsampledGaussianPRV(q, sigma) for q, sigma, _ in entries]
        truncated = [prv.TruncatedPrivacyRandomVariable(rv, domain.t_min, domain.t_max) for rv in rvs]
        dprvs = [prv.discretize(t, domain) for t in truncated]
        dprv = prv.compose_heterogeneous(dprvs=dprvs, num_self_compositions=counts)
        _, _, eps_upper = dprv.compute_epsilon(delta, delta_error, PRV_EPS_ERROR)
    return float(eps_upper)


@lru_cache(maxsize=64)
def _pld_one_step(q: float, sigma: float) -> Any:
    # One step's discretised loss: dp_accounting's from_gaussian_mechanism, with the connect-the-dots
    # deltas computed over the grid at once (`_vector_gaussian_loss`: the same operations, so the same
    # bits; a test holds them equal) instead of one Python call per grid point. Kept per (q, sigma).
    dpa = _dp_accounting()
    pld = dpa.pld.privacy_loss_distribution
    loss = _vector_gaussian_loss()
    build = getattr(pld, "_create_pld_pmf_from_monotone_privacy_loss", None)
    subsampled = getattr(pld, "_pld_for_subsampled_mechanism", None)
    if loss is None or build is None or subsampled is None:  # another layout of dp_accounting: its own call
        return pld.from_gaussian_mechanism(
            standard_deviation=sigma,
            value_discretization_interval=PLD_VALUE_DISCRETIZATION,
            sampling_prob=q,
            neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
        )

    def single(adjacency: Any) -> Any:
        mechanism = loss(sigma, sampling_prob=q, adjacency_type=adjacency)
        return build(mechanism, value_discretization_interval=PLD_VALUE_DISCRETIZATION, use_connect_dots=True)

    return subsampled(single, q)


@cache
def _vector_gaussian_loss() -> Any:
    """dp_accounting's GaussianPrivacyLoss whose get_delta_for_epsilon inverts the privacy loss of a
    whole array of epsilons at once: the library's scalar inverse_privacy_loss (and log_a_times_exp_b_plus_c)
    element for element, the same float operations. None if the library's layout is not the one known."""
    mech = _dp_accounting().pld.privacy_loss_mechanism
    base: Any = getattr(mech, "GaussianPrivacyLoss", None)
    adjacency: Any = getattr(mech, "AdjacencyType", None)
    if base is None or adjacency is None or not hasattr(base, "mu_lower_log_cdf"):
        return None

    class VectorGaussianLoss(base):  # type: ignore[misc]
        def _inverse(self, losses: np.ndarray) -> np.ndarray:
            q, remove = self.sampling_prob, self.adjacency_type == adjacency.REMOVE
            wo = losses  # the loss without subsampling
            if q != 1.0:
                bound = math.log(1 - q) if remove else -math.log(1 - q)
                close = np.abs(losses - bound) <= 1e-9 * np.maximum(np.abs(losses), abs(bound))  # math.isclose
                a, c = 1 / q, 1 - 1 / q
                b = losses if remove else -losses
                with np.errstate(all="ignore"):  # the masked-out branches
                    d = b + np.log(a)
                    wo = np.where(b == 0, np.log(a + c), d + np.log1p(-np.exp(np.log(-c) - d)))
                wo = np.where(close, -math.inf if remove else math.inf, wo if remove else -wo)
            x = -0.5 * self.sensitivity - wo * (self._standard_deviation**2) / self.sensitivity
            out: np.ndarray = x if remove else self.sensitivity + x
            return out

        def get_delta_for_epsilon(self, epsilon: Any) -> Any:
            scalar = np.ndim(epsilon) == 0
            epsilons = np.atleast_1d(np.asarray(epsilon, dtype=float))
            deltas = np.zeros_like(epsilons)
            if self.sampling_prob == 1.0:
                inverted = np.full(epsilons.shape, True)
            elif self.adjacency_type == adjacency.ADD:
                inverted = epsilons < -math.log1p(-self.sampling_prob)
            else:
                inverted = epsilons > math.log1p(-self.sampling_prob)
                deltas[~inverted] = -np.expm1(epsilons[~inverted])
            x = self._inverse(epsilons[inverted])
            deltas[inverted] = self.mu_upper_cdf(x) - np.exp(epsilons[inverted] + self.mu_lower_log_cdf(x))
            deltas = np.clip(deltas, 0, 1)
            return float(deltas[0]) if scalar else deltas

    return VectorGaussianLoss


class _Kept:
    """An LRU map bounded by the probabilities its PLDs hold (PLD_KEPT_POINTS), not by their count: a
    long history's PLD holds 10^5-10^6 of them."""

    def __init__(self, points: int):
        self.points, self.held = points, 0
        self.items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: Any) -> Any:
        got = self.items.get(key)
        if got is None:
            self.misses += 1
            return None
        self.hits += 1
        self.items.move_to_end(key)
        return got[0]

    def put(self, key: Any, value: Any) -> None:
        size = _pld_points(value)
        if key in self.items or size > self.points:
            return
        self.items[key] = (value, size)
        self.held += size
        while self.held > self.points:
            _, (_, gone) = self.items.popitem(last=False)
            self.held -= gone

    def clear(self) -> None:
        self.items.clear()
        self.held = self.hits = self.misses = 0


def _pld_points(pld: Any) -> int:
    pmfs = [getattr(pld, "_pmf_remove", None), getattr(pld, "_pmf_add", None)]
    return sum(len(getattr(p, "_probs", ())) or 1 for p in pmfs if p is not None) or 1


# Composed PLDs kept (8 bytes a probability, PLD_KEPT_POINTS of them at most): each (q, sigma, steps) self-
# composition, and each history's composition, so that the history one run longer (a client's next round) composes
# that run onto its own, and the clients that share a (q, sigma, steps) run build it once.
PLD_KEPT_POINTS = 2**24
_PLD_SELF_COMPOSED = _Kept(PLD_KEPT_POINTS // 4)
_PLD_COMPOSED = _Kept(PLD_KEPT_POINTS)
PLD_COUNTS = {"compositions": 0}  # the PLD compositions made (a test bounds them for a history grown run by run)


def _pld_self_composed(q: float, sigma: float, n: int) -> Any:
    got = _PLD_SELF_COMPOSED.get((q, sigma, n))
    if got is None:
        one = _pld_one_step(q, sigma)
        if n > 64 and not hasattr(one._pmf_remove, "_probs"):
            # A sparse PMF (sigma so large that one step's loss spans a few grid points): the library sizes its
            # result as size ** n, an integer of n digits (10^9 steps: hours), and then goes dense; straight to
            # its dense self-composition instead, the same PMFs.
            pmfs = [pmf.to_dense_pmf().self_compose(n) for pmf in (one._pmf_remove, one._pmf_add)]
            build = _dp_accounting().pld.privacy_loss_distribution.PrivacyLossDistribution
            got = build(pmfs[0]) if one._symmetric else build(*pmfs)
            PLD_COUNTS["compositions"] += 1
        else:
            got = one.self_compose(n)
            PLD_COUNTS["compositions"] += 1
        _PLD_SELF_COMPOSED.put((q, sigma, n), got)
    return got


def _pld_base(entries: tuple[tuple[float, float, int], ...]) -> tuple[Any, tuple[tuple[float, float, int], ...]]:
    """The kept composition of the most steps whose runs are each within `entries`' (a run of as many
    steps or fewer, at the same (q, sigma)), and what remains to compose onto it; (None, entries) if none."""
    want = {(q, sigma): n for q, sigma, n in entries}
    best, best_steps = None, 0
    for key in reversed(_PLD_COMPOSED.items):  # the most recent first: a client's last history
        steps = sum(n for _, _, n in key)
        if steps > best_steps and all(want.get((q, sigma), 0) >= n for q, sigma, n in key):
            best, best_steps = key, steps
    if best is None:
        return None, entries
    have = {(q, sigma): n for q, sigma, n in best}
    rest = tuple((q, sigma, n - have.get((q, sigma), 0)) for q, sigma, n in entries if n > have.get((q, sigma), 0))
    return _PLD_COMPOSED.get(best), rest


def clear_caches() -> None:
    """Forget every kept answer and PLD (as a server starts: python -m bench.accountants, the tests)."""
    for f in (_epsilon_of, _numerical_epsilon, _rdp_one_step, _pld_one_step):
        f.cache_clear()
    _PLD_SELF_COMPOSED.clear()
    _PLD_COMPOSED.clear()


def _pld_epsilon(entries: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """dp_accounting PLDAccountant(value_discretization_interval=1e-4) composed with each run's
    SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), steps), then
    get_epsilon(delta) (Koskela et al. 2020; the library's connect-the-dots PLD, Doroshenko et al.
    2022): the library's own calls in its accountant's order, with each (q, sigma)'s one-step PLD
    kept. A test holds the result to PLDAccountant's own.

    A history asked before, or one that extends a kept one (the same runs, some with more steps, and
    others), is composed from it: only what it adds is composed, in the order it adds it. Composition
    commutes, and each of the library's compositions is a pessimistic (upper-bound) PLD, so the order
    changes only what the tails truncated (below 1e-15 of mass): within 1e-9 of epsilon (a test holds it)."""
    pld = _dp_accounting().pld.privacy_loss_distribution
    composed, rest = _pld_base(entries)
    if composed is None:
        composed = pld.identity(value_discretization_interval=PLD_VALUE_DISCRETIZATION)
    for q, sigma, n in rest:
        composed = _pld_compose(composed, _pld_self_composed(q, sigma, n))
        PLD_COUNTS["compositions"] += 1
    _PLD_COMPOSED.put(entries, composed)
    pmfs = [composed._pmf_remove] if composed._symmetric else [composed._pmf_remove, composed._pmf_add]
    if all(_dense(p) for p in pmfs):
        return max(_pmf_epsilon(p, delta) for p in pmfs)
    eps: float = composed.get_epsilon_for_delta(delta)
    return eps


# dp_accounting's DensePLDPmf.compose and get_epsilon_for_delta walk their arrays in Python loops (the tails'
# truncation, the hockey-stick sums), most of a long history's time; here the same sums as cumulative sums
# (sequential, as the loops add), so the same floats. Tests hold both to the library's.
PLD_TAIL_MASS_TRUNCATION = 1e-15  # PrivacyLossDistribution.compose's default


def _dense(pmf: Any) -> bool:
    return hasattr(pmf, "_probs") and hasattr(pmf, "_lower_loss") and hasattr(pmf, "_infinity_mass")


def _pld_compose(a: Any, b: Any) -> Any:
    """a.compose(b) (PrivacyLossDistribution.compose at its default truncation) for dense PMFs."""
    pairs = [(a._pmf_remove, b._pmf_remove)]
    if not (a._symmetric and b._symmetric):
        pairs.append((a._pmf_add, b._pmf_add))
    if not all(_dense(x) and _dense(y) for x, y in pairs):
        return a.compose(b)
    mod = _dp_accounting().pld
    pmfs = [_pmf_compose(mod.pld_pmf, x, y) for x, y in pairs]
    return mod.privacy_loss_distribution.PrivacyLossDistribution(*pmfs)


def _pmf_compose(pld_pmf: Any, x: Any, y: Any) -> Any:
    """DensePLDPmf.compose(y, PLD_TAIL_MASS_TRUNCATION), pessimistic: _truncate_tails's prefixes by cumsum."""
    x.validate_composable(y)
    probs = pld_pmf.signal.fftconvolve(x._probs, y._probs)  # scipy.signal, as the library calls it
    infinity_mass = x._infinity_mass + y._infinity_mass - x._infinity_mass * y._infinity_mass
    half = PLD_TAIL_MASS_TRUNCATION / 2

    def prefix(arr: np.ndarray) -> int:  # the longest prefix whose sum is at most `half`
        over = np.flatnonzero(np.cumsum(arr) > half)
        return int(over[0]) if len(over) else len(arr)

    left = prefix(probs)
    right = max(len(probs) - prefix(np.flip(probs)), left + 1)
    left_mass, right_mass = np.sum(probs[:left]), np.sum(probs[right:])
    kept = probs[left:right]
    kept[0] += left_mass  # pessimistic: the left tail onto the lowest loss, the right one to infinity
    lower_loss = x._lower_loss + y._lower_loss + left
    return pld_pmf.DensePLDPmf(x._discretization, lower_loss, kept, infinity_mass + right_mass, True)


def _pmf_epsilon(pmf: Any, delta: float) -> float:
    """DensePLDPmf.get_epsilon_for_delta(delta): the library's walk from the largest loss down, its running
    masses as cumulative sums and its stopping tests over all of them at once."""
    infinity_mass, probs, d = pmf._infinity_mass, np.flip(pmf._probs), pmf._discretization
    if infinity_mass > delta:
        return math.inf
    upper_loss = (pmf._lower_loss + len(probs) - 1) * d
    losses = np.cumsum(np.concatenate(([upper_loss], np.full(len(probs) - 1, -d))))  # itertools.count's adds
    upper = np.cumsum(np.concatenate(([infinity_mass], probs)))  # before each loss, and after the last
    lower = np.cumsum(np.concatenate(([0.0], np.exp(-losses) * probs)))
    with np.errstate(divide="ignore", invalid="ignore"):
        stop = (upper[:-1] > delta) & (lower[:-1] > 0) & (np.log((upper[:-1] - delta) / lower[:-1]) >= losses)
    done = (upper[1:] >= delta) & (lower[1:] == 0)  # after adding a loss so large that exp(-loss) is 0
    k_stop = int(np.argmax(stop)) if stop.any() else len(probs)
    k_done = int(np.argmax(done)) if done.any() else len(probs)
    if k_done < k_stop:
        return max(0.0, float(losses[k_done]))
    mass_upper, mass_lower = float(upper[k_stop]), float(lower[k_stop])
    if mass_upper <= mass_lower + delta:
        return 0.0
    return math.log((mass_upper - delta) / mass_lower)


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
    _check_accountant(accountant, conversion, None)
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
    eps_prior = epsilon(prior, delta, conversion, accountant=accountant)
    if eps_prior > eps_target:
        return 0
    if sigma == 0.0:
        return 0  # one unnoised step is already infinite loss
    if accountant == AccountantKind.RDP:
        base = _rdp_sum(prior, orders)
        # compute_rdp(steps=n) is exactly compute_rdp(steps=1) * n, and _rdp_sum adds entries
        # in order, so eps_at(n) is bitwise epsilon(history + [(q, sigma, n)]).
        one = _opacus_rdp().compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders)

        def eps_at(n: int) -> float:
            if n == 0:
                return eps_prior  # (one * 0 would turn an inf order into nan)
            return _eps_from_rdp(base + one * n, orders, delta, conversion)

        return _last_within(eps_at, eps_target, limit, 0, 1)

    def eps_num(n: int) -> float:
        return epsilon(prior + [(q, sigma, n)], delta, accountant=accountant)

    # PRV and PLD cost far more an answer (python -m bench.accountants): start from RDP's R_c (tighter,
    # they reach at least as far in practice) when it is within the target under this accountant too,
    # with steps of 1/16 of it (PRV's and PLD's R_c are typically a fraction past RDP's), doubling.
    start = max_steps(q, sigma, delta, eps_target, prior, limit=limit)
    if start > 0 and eps_num(start) <= eps_target:
        return _last_within(eps_num, eps_target, limit, start, max(1, start // 16))
    return _last_within(eps_num, eps_target, limit, 0, 1)


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

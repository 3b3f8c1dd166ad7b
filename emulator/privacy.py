"""Privacy accounting: RDP ledgers for sample-level DP-SGD and the noise calibrations of
the client-/server-level output-perturbation schemes in the papers.

* Sample-level DP-SGD (ALI-DPFL §IV-D): a per-client `PrivacyLedger` of homogeneous
  runs (q, sigma, steps). RDP comes from Opacus's analysis (`compute_rdp`); runs with
  different sigma or q compose by adding RDP (ALI-DPFL Definition 3). Two conversions
  to (eps, delta)-DP:
    - "improved": Opacus `get_privacy_spent` (Balle et al. 2020, Thm 21); identical to
      `opacus.accountants.RDPAccountant.get_epsilon` on the same history;
    - "classic": eps = min over integer alpha >= 2 of RDP(alpha) + log(1/delta)/(alpha-1)
      (ALI-DPFL Theorem 2, eq. 12, via Definition 4).
  `max_steps` is R_c (ALI-DPFL Algorithm 3), as an exact integer search.
* Output perturbation: Gaussian / Laplace calibration (Fu et al. Thm 1-2), Wei et al.
  eq. 10 and eq. 25 (UDP with communication-round discounting), Talaei & Izadi eq. 8
  (client noise) and eq. 13 (server noise).

Everything here is a pure function of its arguments; ledgers are plain data.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

# Opacus's RDP orders: 1.1, 1.2, ..., 10.9, 12, ..., 63 (RDPAccountant.DEFAULT_ALPHAS).
DEFAULT_ORDERS: list[float] = list(RDPAccountant.DEFAULT_ALPHAS)

# ALI-DPFL Theorem 2 holds for "any integer alpha >= 2"; we minimise over 2..64 plus a few
# large orders so that very small per-step losses are not cut off at alpha = 64.
CLASSIC_ORDERS: list[int] = list(range(2, 65)) + [128, 256, 512]

CONVERSIONS = ("improved", "classic")


# --- ledger ------------------------------------------------------------------------------

def _check_entry(q, sigma, steps) -> tuple[float, float, int]:
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

    def max_steps(self, q: float, sigma: float, delta: float, eps_target: float,
                  conversion: str = "improved", limit: int = 10**7) -> int:
        """How many more steps at (q, sigma) this client can take within eps_target."""
        return max_steps(q, sigma, delta, eps_target, history=self.history(),
                         conversion=conversion, limit=limit)

    def to_dict(self) -> dict:
        return {"entries": [{"q": e.q, "sigma": e.sigma, "steps": e.steps}
                            for e in self.entries]}

    @classmethod
    def from_dict(cls, d: dict) -> "PrivacyLedger":
        entries = []
        for e in d.get("entries", []):
            q, sigma, steps = _check_entry(e["q"], e["sigma"], e["steps"])
            entries.append(LedgerEntry(q, sigma, steps))
        return cls(entries=entries)


# --- RDP and conversion ------------------------------------------------------------------

def _entries(history) -> list[tuple[float, float, int]]:
    if isinstance(history, PrivacyLedger):
        history = history.entries
    out = []
    for h in history:
        if isinstance(h, LedgerEntry):
            h = h.as_tuple()
        q, sigma, steps = h
        out.append(_check_entry(q, sigma, steps))
    return out


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return delta


def _orders_for(conversion: str, orders) -> list[float]:
    if conversion not in CONVERSIONS:
        raise ValueError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")
    if orders is not None:
        return list(orders)
    return DEFAULT_ORDERS if conversion == "improved" else CLASSIC_ORDERS


@lru_cache(maxsize=4096)
def _rdp_one_step(q: float, sigma: float, orders: tuple[float, ...]) -> np.ndarray:
    # Opacus's compute_rdp is (one-step RDP) * steps, so caching one step per (q, sigma) gives
    # the same bits at a fraction of the cost (the server asks every round for every client).
    out = compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=list(orders))
    out.setflags(write=False)
    return out


def _rdp_sum(entries, orders) -> np.ndarray:
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


def rdp(history: Iterable, orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
    """RDP of a sequence of (q, sigma, steps) runs of the sampled Gaussian mechanism at each
    order: sum over runs of Opacus `compute_rdp` (ALI-DPFL eq. 15-16, Definition 3).
    sigma == 0 with steps > 0 -> inf; steps == 0 contributes 0."""
    return _rdp_sum(_entries(history), list(orders))


def _eps_from_rdp(rdp_vec: np.ndarray, orders: Sequence[float], delta: float,
                  conversion: str) -> float:
    if conversion == "improved":
        # Balle et al. 2020 via Opacus; silence its "optimal order is extreme" warning,
        # which would fire on every probe of max_steps' search.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eps, _ = get_privacy_spent(orders=orders, rdp=rdp_vec, delta=delta)
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


def epsilon(history: Iterable, delta: float, conversion: str = "improved",
            orders: Sequence[float] | None = None) -> float:
    """(eps, delta)-DP spent by a (q, sigma, steps) history; 0.0 for an empty history.

    conversion="improved": equals Opacus RDPAccountant.get_epsilon(delta) (default orders).
    conversion="classic": ALI-DPFL Theorem 2 over CLASSIC_ORDERS (integer alpha >= 2).
    """
    delta = _check_delta(delta)
    orders = _orders_for(conversion, orders)
    entries = [e for e in _entries(history) if e[2] > 0]
    if not entries:
        return 0.0
    if any(sigma == 0.0 for _, sigma, _ in entries):
        return math.inf
    return _eps_from_rdp(_rdp_sum(entries, orders), orders, delta, conversion)


def max_steps(q: float, sigma: float, delta: float, eps_target: float,
              history: Iterable = (), conversion: str = "improved",
              limit: int = 10**7) -> int:
    """R_c (ALI-DPFL Algorithm 3): the largest integer n in [0, limit] such that
    epsilon(history + [(q, sigma, n)]) <= eps_target.

    Algorithm 3 bisects a real-valued T to a 0.01 tolerance on eps; here the search is over
    integers and exact, using that eps is non-decreasing in n (RDP grows linearly in n and
    both conversions are minima of increasing functions of RDP). Returns 0 when even n = 0
    exceeds the target (the prior history alone is over budget), and `limit` when the
    target is infinite or never reached within `limit` steps.
    """
    delta = _check_delta(delta)
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
    one = compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders)

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


# --- output perturbation: generic Gaussian / Laplace (Fu et al.) --------------------------

def _check_eps(eps: float) -> float:
    eps = float(eps)
    if not eps > 0.0:
        raise ValueError(f"epsilon must be > 0, got {eps}")
    return eps


def gaussian_c(delta: float) -> float:
    """c = sqrt(2 ln(1.25/delta)), the classic Gaussian-mechanism constant (Dwork & Roth
    Thm A.1; quoted in Talaei & Izadi §II and used in their eq. 8 and 13)."""
    return math.sqrt(2.0 * math.log(1.25 / _check_delta(delta)))


def gaussian_sigma(eps: float, delta: float, sensitivity: float, releases: int = 1) -> float:
    """Noise std for `releases` Gaussian releases of an L2-`sensitivity` query, totalling
    (eps, delta): sensitivity * sqrt(2 ln(1.25/delta)) * sqrt(releases) / eps.

    The per-release calibration is the classic Gaussian mechanism; composition over the
    releases follows Fu et al. Theorem 2 (moments accountant), where sigma grows as
    sqrt(T_l). This is `fu_gaussian_sigma` with q = 1 (Fu's Algorithm 1 is full-batch) and
    its unspecified constant c_2 fixed so that one release is the classic mechanism.
    """
    eps = _check_eps(eps)
    if releases < 1:
        raise ValueError(f"releases must be >= 1, got {releases}")
    if eps == math.inf:
        return 0.0
    return float(sensitivity) * gaussian_c(delta) * math.sqrt(releases) / eps


def fu_gaussian_sigma(epsilon: float, delta: float, T_l: int, Xi_2: float = 1.0,
                      q: float = 1.0, c_2: float | None = None) -> float:
    """Fu et al. Theorem 2: noise N(0, sigma^2 Xi_2^2) with
    sigma = c_2 * q * sqrt(T_l log(1/delta)) / epsilon; returns the std sigma * Xi_2.

    Xi_2 = eta~ * E * xi_2 is the L2 sensitivity of one upload (`fu_sensitivity`). The paper
    leaves c_2 unspecified; by default c_2 = sqrt(2 ln(1.25/delta) / ln(1/delta)), so that
    q = 1, T_l = 1 gives the classic Gaussian mechanism (and equals `gaussian_sigma`).
    """
    epsilon = _check_eps(epsilon)
    delta = _check_delta(delta)
    if c_2 is None:
        c_2 = math.sqrt(2.0 * math.log(1.25 / delta) / math.log(1.0 / delta))
    if epsilon == math.inf:
        return 0.0
    return c_2 * q * math.sqrt(T_l * math.log(1.0 / delta)) / epsilon * Xi_2


def fu_sensitivity(eta_max: float, E: int, xi: float) -> float:
    """Fu et al. Thm 1-2: sensitivity of the model change after E local iterations,
    Xi = eta~_t * E * xi (xi bounds the gradient's L1 norm for Laplace, L2 for Gaussian)."""
    return float(eta_max) * int(E) * float(xi)


def laplace_scale(eps: float, l1_sensitivity: float, releases: int = 1) -> float:
    """Laplace scale b = releases * l1_sensitivity / eps (Fu et al. Theorem 1,
    Lap(0, T_l Xi_1 / eps): eps/T_l per release, basic composition over T_l releases)."""
    eps = _check_eps(eps)
    if releases < 1:
        raise ValueError(f"releases must be >= 1, got {releases}")
    if eps == math.inf:
        return 0.0
    return releases * float(l1_sensitivity) / eps


# --- Wei et al. (UDP with communication-round discounting) --------------------------------

def wei_sensitivity(eta: float, C: float, D_size: int) -> float:
    """Wei et al. eq. 13: Delta_l <= 2 eta C / |D_i| (full-batch local step, clip C)."""
    return 2.0 * float(eta) * float(C) / int(D_size)


def wei_sigma(eps: float, delta: float, T: int, sensitivity: float, q: float = 1.0) -> float:
    """Wei et al. eq. 10 (Theorem 1): sigma_i = Delta_l * sqrt(2 q T ln(1/delta_i)) / eps_i,
    the per-round noise std over T communication rounds with client sampling ratio q = K/U.
    Note ln(1/delta), not ln(1.25/delta): it comes from the moments accountant (eq. 17-21)."""
    eps = _check_eps(eps)
    delta = _check_delta(delta)
    if eps == math.inf:
        return 0.0
    return float(sensitivity) * math.sqrt(2.0 * q * T * math.log(1.0 / delta)) / eps


def wei_crd_sigma(eps: float, delta: float, T: int, sigma_history: Sequence[float],
                  sensitivity: float, q: float = 1.0) -> float:
    """Wei et al. eq. 25 (Theorem 4): noise std for round t = len(sigma_history) after the
    horizon changed to T, given the stds sigma^0..sigma^{t-1} already used:

        sigma^t = sqrt( (T - t) / ( eps^2 / (2 q Delta_l^2 ln(1/delta)) - sum_tau 1/(sigma^tau)^2 ) )

    With t = 0 this is eq. 10; with T unchanged it returns the previous sigma (eq. 30-31).
    Spreads the remaining budget of eq. 29's condition evenly over the T - t rounds left.
    Returns inf when the past rounds already used the whole budget; raises if t >= T
    (the training has stopped).
    """
    eps = _check_eps(eps)
    delta = _check_delta(delta)
    t = len(sigma_history)
    if t >= T:
        raise ValueError(f"round t={t} is not before the horizon T={T}; training has stopped")
    if eps == math.inf:
        return 0.0
    budget = eps**2 / (2.0 * q * float(sensitivity) ** 2 * math.log(1.0 / delta))
    used = sum(1.0 / float(s) ** 2 for s in sigma_history)
    left = budget - used
    if not left > 0.0:
        return math.inf
    return math.sqrt((T - t) / left)


def wei_epsilon(sigmas: Sequence[float], delta: float, sensitivity: float,
                q: float = 1.0) -> float:
    """The eps that Wei et al.'s condition (eq. 29; eq. 21 for constant sigma) certifies for
    rounds released with stds `sigmas`: eps = Delta_l * sqrt(2 q ln(1/delta) * sum 1/sigma^2).
    Inverse of eq. 10 / eq. 25: eps spent so far, for per-round recording."""
    delta = _check_delta(delta)
    s = 0.0
    for sig in sigmas:
        sig = float(sig)
        if sig == 0.0:
            return math.inf
        s += 1.0 / sig**2
    return float(sensitivity) * math.sqrt(2.0 * q * math.log(1.0 / delta) * s)


# --- Talaei & Izadi (PADPFL: personalised impact factors) ---------------------------------

def _talaei_c(c: float | None, delta: float | None) -> float:
    if c is not None:
        return float(c)
    if delta is None:
        raise ValueError("give c, or delta to use c = sqrt(2 ln(1.25/delta))")
    return gaussian_c(delta)


def _min_m(m) -> float:
    if np.ndim(m) == 0:
        return float(m)
    return float(min(m))


def talaei_client_sigma(B: float, R: int, m, epsilon: float,
                        c: float | None = None, delta: float | None = None) -> float:
    """Talaei & Izadi eq. 8: sigma_C = 2 B R c / (min_i m_i * epsilon), same for all clients.

    B: clipping bound on the local weights (||x_i|| <= B; sensitivity 2B/m_i by eq. 7);
    R: maximum number of revelations of local parameters on upload (R <= T);
    m: the local dataset sizes m_i (or already their minimum);
    c: >= sqrt(2 ln(1.25/delta)); pass c, or delta to use that value.
    """
    epsilon = _check_eps(epsilon)
    return 2.0 * B * R * _talaei_c(c, delta) / (_min_m(m) * epsilon)


def talaei_server_sigma(B: float, T: int, R: int, p: Sequence[float], m, epsilon: float,
                        c: float | None = None, delta: float | None = None) -> float:
    """Talaei & Izadi eq. 13 (Theorem 1): server-side noise std on the broadcast,

        sigma_S = 2 B c sqrt(T^2 max p_i^2 - R^2 sum p_i^2) / (min m_i * epsilon)
                  if T > R sqrt(sum p_i^2) / max p_i, else 0,

    i.e. sigma_S^2 = sigma_A^2 - sigma_AC^2 (eq. 14) with sigma_A = 2 B T c max p / (min m eps)
    and sigma_AC^2 = sum sigma_C^2 p_i^2 (eq. 12, sigma_C from eq. 8).
    p: the impact factors p_i; T: aggregation times; other symbols as in eq. 8.
    """
    epsilon = _check_eps(epsilon)
    p = [float(x) for x in p]
    if not p or any(x < 0 for x in p):
        raise ValueError(f"impact factors must be a non-empty list of non-negative values, got {p}")
    pmax = max(p)
    sum_p2 = sum(x * x for x in p)
    if pmax == 0.0 or not T > R * math.sqrt(sum_p2) / pmax:
        return 0.0  # eq. 13, second branch: client noise already covers the server's need
    radicand = T**2 * pmax**2 - R**2 * sum_p2
    return 2.0 * B * _talaei_c(c, delta) * math.sqrt(radicand) / (_min_m(m) * epsilon)

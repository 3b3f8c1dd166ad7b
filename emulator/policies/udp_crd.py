"""`udp_crd` — Wei et al. Algorithm 2 (UDP with communication-rounds discounting): K of N
clients, drawn at random each round, take one clipped full-batch gradient step and upload the
model plus Gaussian noise sigma_i^t, calibrated per client so that (eps_i, delta_i) holds over
the horizon T (eq. 10). With CRD on, when the server's test loss improves by less than zeta the
horizon shrinks to T = floor(beta (T - t)) + t and sigma_i^t follows eq. 25, which spreads what
is left of each client's budget over the rounds that remain.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from emulator.policies.accounting import REL_TOL, Accountant, privacy_row
from emulator.policies.base import Policy, RoundPlan, RunContext, RunSettings, fedavg, select_clients
from emulator.privacy import check_delta, check_epsilon
from nodes.contracts.schema import FINITE, OPEN_UNIT, ROUND, Check, Range, Selection, setting
from nodes.contracts.tasks import ClientResult, ClientTask

# --- noise calibration (Wei et al. eq. 10, 13, 25, 29) --------------------------------


def wei_sensitivity(eta: float, C: float, D_size: int) -> float:
    """Wei et al. eq. 13: Delta_l <= 2 eta C / |D_i| (full-batch local step, clip C)."""
    if int(D_size) < 1:
        raise ValueError(f"a client of {D_size} samples: expected at least 1 for a full-batch step (Wei et al. eq. 13)")
    return 2.0 * float(eta) * float(C) / int(D_size)


def wei_sigma(eps: float, delta: float, T: int, sensitivity: float, q: float = 1.0) -> float:
    """Wei et al. eq. 10 (Theorem 1): sigma_i = Delta_l * sqrt(2 q T ln(1/delta_i)) / eps_i,
    the per-round noise std over T communication rounds with client sampling ratio q = K/U.
    Note ln(1/delta), not ln(1.25/delta): it comes from the moments accountant (eq. 17-21)."""
    eps = check_epsilon(eps)
    delta = check_delta(delta)
    if eps == math.inf:
        return 0.0
    return float(sensitivity) * math.sqrt(2.0 * q * T * math.log(1.0 / delta)) / eps


def wei_crd_sigma(
    eps: float, delta: float, T: int, sigma_history: Sequence[float], sensitivity: float, q: float = 1.0
) -> float:
    """Wei et al. eq. 25 (Theorem 4): noise std for round t = len(sigma_history) after the
    horizon changed to T, given the stds sigma^0..sigma^{t-1} already used:

        sigma^t = sqrt( (T - t) / ( eps^2 / (2 q Delta_l^2 ln(1/delta)) - sum_tau 1/(sigma^tau)^2 ) )

    With t = 0 this is eq. 10; with T unchanged it returns the previous sigma (eq. 30-31).
    Spreads the remaining budget of eq. 29's condition evenly over the T - t rounds left.
    Returns inf when the past rounds already used the whole budget; raises if t >= T
    (the training has stopped).
    """
    eps = check_epsilon(eps)
    delta = check_delta(delta)
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


def wei_epsilon(sigmas: Sequence[float], delta: float, sensitivity: float, q: float = 1.0) -> float:
    """The eps that Wei et al.'s condition (eq. 29; eq. 21 for constant sigma) certifies for
    rounds released with stds `sigmas`: eps = Delta_l * sqrt(2 q ln(1/delta) * sum 1/sigma^2).
    Inverse of eq. 10 / eq. 25: eps spent so far, for per-round recording."""
    delta = check_delta(delta)
    s = 0.0
    for sig in sigmas:
        sig = float(sig)
        if sig == 0.0:
            return math.inf
        s += 1.0 / sig**2
    return float(sensitivity) * math.sqrt(2.0 * q * math.log(1.0 / delta) * s)


@dataclass
class UdpCrdConfig:
    crd: bool = setting(True, "communication-rounds discounting (Alg. 2); false = UDP with a fixed horizon (Alg. 1)")
    horizon: int = setting(0, "initial T, communication rounds (0 = R_s)")
    zeta: float = setting(0.001, "discount when the test loss improves by less than zeta: V(w_t) - V(w_t+1) < zeta")
    beta: float = setting(0.9, "discount factor in (0, 1): T = floor(beta (T - t)) + t")
    RANGES: ClassVar[dict[str, Range]] = dict(
        horizon=ROUND, zeta=FINITE, beta=OPEN_UNIT
    )  # zeta is only compared: 1e9 = always


def discounted_horizon(T: int, t: int, beta: float) -> int:
    """Alg. 2 line 18: T = floor(beta (T - t)) + t."""
    return math.floor(beta * (T - t)) + t


class _EveryRoundAccountant(Accountant):
    """Wei's bound amplifies by sampling (q = K/N), so every round counts for every client, selected or not,
    at the std it would have used (eq. 29). Eq. 10 and eq. 25 scale with Delta_l, so that std is
    Delta_i s^t, s^t the std of a unit sensitivity, and every client has spent the same eps: the ledger is
    the one list of s^t, whatever clients.n."""

    def __init__(self, policy: UdpCrd):
        super().__init__(policy.ctx.settings.dp.epsilon, "wei_gaussian")
        self.policy, self.n = policy, policy.ctx.n_clients
        self.unit_scales: list[float] = []  # s^t of each round charged

    def _eps(self, unit_scales: Sequence[float]) -> float:
        return self.policy.epsilon_of(unit_scales) if unit_scales else 0.0

    def epsilon(self, client: int) -> float:
        return self._eps(self.unit_scales)

    def epsilon_after(self, task: ClientTask) -> float:
        return self._eps([*self.unit_scales, task.output_noise_scale / self.policy.sensitivity(task.client)])

    def eligible(self, client: int) -> bool:
        return not math.isfinite(self.target) or self._eps(self.unit_scales) < self.target * (1 - REL_TOL)

    def allows(self, task: ClientTask) -> bool:
        return not math.isfinite(self.target) or self.epsilon_after(task) <= self.target * (1 + REL_TOL)

    def eligible_clients(self, n: int) -> Sequence[int]:
        return range(n) if self.eligible(0) else []

    def max_epsilon(self, n: int) -> float:
        return self._eps(self.unit_scales)

    def charge(self, trained: Sequence[ClientTask]) -> None:
        self.unit_scales.append(self.policy.unit_sigma)

    def client_rows(self) -> Iterator[dict[str, Any]]:
        """Every client, once a round was charged: the stds of its releases (Delta_i s^t)."""
        if not self.unit_scales:
            return
        eps = self._eps(self.unit_scales)
        for i in range(self.n):
            scales = [self.policy.sensitivity(i) * s for s in self.unit_scales]
            yield privacy_row(i, eps, {"released_noise_scales": scales})

    def history(self) -> dict[str, Any]:
        return {"unit_scales": list(self.unit_scales)}

    def load_history(self, history: dict[str, Any]) -> None:
        scales = history.get("unit_scales")
        if not (isinstance(scales, list) and all(isinstance(s, int | float) and s >= 0 for s in scales)):
            raise ValueError("accountant.unit_scales: expected a list of each round's std s^t >= 0 (Delta_l = 1)")
        self.unit_scales = [float(s) for s in scales]


class UdpCrd(Policy):
    name = "udp_crd"
    Options = UdpCrdConfig
    options_help = "policy=udp_crd (Wei et al. Alg. 2)"
    state_keys = ("T", "q", "unit_sigma", "t", "last_loss")
    accountant: _EveryRoundAccountant  # make_accountant's
    options: UdpCrdConfig

    @classmethod
    def check(cls, options: UdpCrdConfig, settings: RunSettings, check: Check) -> None:
        clip = settings.dp.clip
        check(clip > 0, "dp.clip", clip, f"a gradient clipping bound > 0 (policy={cls.name})")

    def __init__(self, options: UdpCrdConfig, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        dp = ctx.settings.dp
        self.T = options.horizon or ctx.rounds_budget
        self.q = (ctx.settings.per_round or ctx.n_clients) / ctx.n_clients  # q = K/U
        self.unit_sigma = wei_sigma(dp.epsilon, dp.delta, self.T, 1.0, self.q)  # eq. 10 at Delta_l = 1
        self.largest_sensitivity = wei_sensitivity(dp.lr, dp.clip, min(ctx.data_sizes))  # every size checked once
        self.t = 0  # rounds done
        self.last_loss = math.nan

    def make_accountant(self) -> _EveryRoundAccountant:
        return _EveryRoundAccountant(self)

    def sensitivity(self, client: int) -> float:
        """Eq. 13's Delta_l of the client."""
        dp = self.ctx.settings.dp
        return wei_sensitivity(dp.lr, dp.clip, self.ctx.data_sizes[client])

    def epsilon_of(self, unit_sigmas: Sequence[float]) -> float:
        """Eq. 29: the eps that rounds released with stds Delta_i s^t certify, for any Delta_i."""
        return wei_epsilon(unit_sigmas, self.ctx.settings.dp.delta, 1.0, self.q)

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        dp = self.ctx.settings.dp
        if self.t:  # eq. 25; with T unchanged it gives the previous sigma
            self.unit_sigma = wei_crd_sigma(dp.epsilon, dp.delta, self.T, self.accountant.unit_scales, 1.0, self.q)
        selected = select_clients(self.ctx.settings, rnd, eligible, how=Selection.UNIFORM)
        sigmas = {i: self.sensitivity(i) * self.unit_sigma for i in selected}
        tasks = tuple(
            ClientTask.dp_sgd(i, dp, steps=1, sigma=0.0, q=1.0, output_noise="gaussian", output_noise_scale=sigma)
            for i, sigma in sigmas.items()
        )
        state = {
            "T": float(self.T),
            "t": self.t,
            "tau": 1.0,
            "sigma": self.largest_sensitivity * self.unit_sigma,  # the std of the smallest client
            "sigma_unit": self.unit_sigma,
            "q": self.q,
        }
        return RoundPlan(tasks=tasks, state=state)

    def aggregate(
        self, rnd: int, global_weights: dict[str, np.ndarray], results: list[ClientResult], factors: dict[int, float]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        self.t += 1
        return fedavg(global_weights, results, factors), {}

    def observe(self, rnd: int, test_loss: float, test_accuracy: float) -> dict[str, Any]:
        crd = self.options
        triggered = crd.crd and self.last_loss - test_loss < crd.zeta  # V(w_t) - V(w_{t+1}) < zeta (nan: False)
        if triggered:
            self.T = discounted_horizon(self.T, self.t - 1, crd.beta)
        self.last_loss = test_loss
        return {"discounted": bool(triggered), "T_next": float(self.T)}

    def should_stop(self) -> str:
        return f"UDP: horizon T = {self.T} rounds reached" if self.t >= self.T else ""

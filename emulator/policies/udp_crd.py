"""`udp_crd` — Wei et al. Algorithm 2 (UDP with communication-rounds discounting): K of N
clients, drawn at random each round, take one clipped full-batch gradient step and upload the
model plus Gaussian noise sigma_i^t, calibrated per client so that (eps_i, delta_i) holds over
the horizon T (eq. 10). With CRD on, when the server's test loss improves by less than zeta the
horizon shrinks to T = floor(beta (T - t)) + t and sigma_i^t follows eq. 25, which spreads what
is left of each client's budget over the rounds that remain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from emulator.policies.accounting import ReleaseAccountant
from emulator.policies.base import Policy, RoundPlan, RunContext, RunSettings, fedavg, select_clients
from emulator.privacy import check_delta, check_epsilon
from nodes.contracts.schema import FINITE, OPEN_UNIT, ROUND, Check, Range, Selection, setting
from nodes.contracts.tasks import ClientResult, ClientTask

# --- noise calibration (Wei et al. eq. 10, 13, 25, 29) --------------------------------


def wei_sensitivity(eta: float, C: float, D_size: int) -> float:
    """Wei et al. eq. 13: Delta_l <= 2 eta C / |D_i| (full-batch local step, clip C)."""
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


class _EveryRoundAccountant(ReleaseAccountant):
    """Wei's bound amplifies by sampling (q = K/N), so every round counts for every client, selected
    or not, at the std it would have used (eq. 29)."""

    def __init__(self, policy: UdpCrd):
        super().__init__(policy.ctx.settings.dp.epsilon, policy.ctx.n_clients, policy.epsilon_of, "wei_gaussian")
        self.policy = policy

    def charge(self, trained: Sequence[ClientTask]) -> None:
        for client, sigma in enumerate(self.policy.sigmas):
            self.released.setdefault(client, []).append(sigma)


class UdpCrd(Policy):
    name = "udp_crd"
    Options = UdpCrdConfig
    options_help = "policy=udp_crd (Wei et al. Alg. 2)"
    state_keys = ("T", "q", "sensitivity", "sigmas", "t", "last_loss")
    accountant: ReleaseAccountant  # make_accountant's
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
        self.sensitivity = [wei_sensitivity(dp.lr, dp.clip, n) for n in ctx.data_sizes]  # eq. 13
        self.sigmas = [wei_sigma(dp.epsilon, dp.delta, self.T, s, self.q) for s in self.sensitivity]  # eq. 10
        self.t = 0  # rounds done
        self.last_loss = math.nan

    def make_accountant(self) -> ReleaseAccountant:
        return _EveryRoundAccountant(self)

    def epsilon_of(self, client: int, sigmas: Sequence[float]) -> float:
        """Eq. 29: the eps that rounds released with these stds certify."""
        return wei_epsilon(sigmas, self.ctx.settings.dp.delta, self.sensitivity[client], self.q) if sigmas else 0.0

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        dp = self.ctx.settings.dp
        if self.t:  # eq. 25; with T unchanged it gives the previous sigma
            self.sigmas = [
                wei_crd_sigma(dp.epsilon, dp.delta, self.T, self.accountant.scales(i), s, self.q)
                for i, s in enumerate(self.sensitivity)
            ]
        tasks = tuple(
            ClientTask.dp_sgd(
                i,
                dp,
                steps=1,
                sigma=0.0,
                q=1.0,
                output_noise="gaussian",
                output_noise_scale=self.sigmas[i],
            )
            for i in select_clients(self.ctx.settings, rnd, eligible, how=Selection.UNIFORM)
        )
        state = {
            "T": float(self.T),
            "t": self.t,
            "tau": 1.0,
            "sigma": max(self.sigmas),
            "q": self.q,
            "sigma_clients": {i: s for i, s in enumerate(self.sigmas)},
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

"""`udp_crd` — Wei et al. Algorithm 2 (UDP with communication-rounds discounting): K of N
clients, drawn at random each round, take one clipped full-batch gradient step and upload the
model plus Gaussian noise sigma_i^t, calibrated per client so that (eps_i, delta_i) holds over
the horizon T (eq. 10). With CRD on, when the server's test loss improves by less than zeta the
horizon shrinks to T = floor(beta (T - t)) + t and sigma_i^t follows eq. 25, which spreads what
is left of each client's budget over the rounds that remain.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from emulator.policies.accounting import ReleaseAccountant
from emulator.policies.base import ClientTask, Policy, RoundPlan, select_clients
from emulator.privacy import wei_crd_sigma, wei_epsilon, wei_sensitivity, wei_sigma
from nodes.schema import FINITE, OPEN_UNIT, ROUND, setting


@dataclass
class UdpCrdConfig:
    crd: bool = setting(True, "communication-rounds discounting (Alg. 2); false = UDP with a fixed horizon (Alg. 1)")
    horizon: int = setting(0, "initial T, communication rounds (0 = R_s)")
    zeta: float = setting(0.001, "discount when the test loss improves by less than zeta: V(w_t) - V(w_t+1) < zeta")
    beta: float = setting(0.9, "discount factor in (0, 1): T = floor(beta (T - t)) + t")
    RANGES = dict(horizon=ROUND, zeta=FINITE, beta=OPEN_UNIT)   # zeta is only compared: 1e9 = always


def discounted_horizon(T: int, t: int, beta: float) -> int:
    """Alg. 2 line 18: T = floor(beta (T - t)) + t."""
    return math.floor(beta * (T - t)) + t


class _EveryRoundAccountant(ReleaseAccountant):
    """Wei's bound amplifies by sampling (q = K/N), so every round counts for every client, selected
    or not, at the std it would have used (eq. 29)."""

    def __init__(self, policy: "UdpCrd"):
        super().__init__(policy.cfg.dp.epsilon, policy.ctx.n_clients, policy.epsilon_of)
        self.policy = policy

    def charge(self, trained: Sequence[ClientTask]) -> None:
        for history, sigma in zip(self.released, self.policy.sigmas):
            history.append(sigma)


class UdpCrd(Policy):
    name = "udp_crd"
    Options = UdpCrdConfig
    options_help = "policy=udp_crd (Wei et al. Alg. 2)"

    @classmethod
    def check(cls, cfg, check) -> None:
        if cfg.policy == cls.name:
            check(cfg.dp.clip > 0, "dp.clip", cfg.dp.clip, f"a gradient clipping bound > 0 (policy={cls.name})")

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        dp = cfg.dp
        self.T = cfg.udp_crd.horizon or ctx.rounds_budget
        self.q = (cfg.clients.per_round or ctx.n_clients) / ctx.n_clients     # q = K/U
        self.sensitivity = [wei_sensitivity(dp.lr, dp.clip, n) for n in ctx.data_sizes]   # eq. 13
        self.sigmas = [wei_sigma(dp.epsilon, dp.delta, self.T, s, self.q) for s in self.sensitivity]  # eq. 10
        self.accountant = _EveryRoundAccountant(self)
        self.t = 0             # rounds done
        self.last_loss = math.nan
        self.plan: RoundPlan | None = None

    def epsilon_of(self, client: int, sigmas: Sequence[float]) -> float:
        """Eq. 29: the eps that rounds released with these stds certify."""
        return wei_epsilon(sigmas, self.cfg.dp.delta, self.sensitivity[client], self.q) if sigmas else 0.0

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        dp = self.cfg.dp
        if self.t:   # eq. 25; with T unchanged it gives the previous sigma
            self.sigmas = [wei_crd_sigma(dp.epsilon, dp.delta, self.T, self.accountant.released[i], s, self.q)
                           for i, s in enumerate(self.sensitivity)]
        tasks = [ClientTask(client=i, steps=1, lr=dp.lr, sigma=0.0, clip=dp.clip, q=1.0,
                            output_noise="gaussian", output_noise_scale=self.sigmas[i])
                 for i in select_clients(self.cfg, rnd, eligible, how="uniform")]
        state = {"T": float(self.T), "t": self.t, "tau": 1.0, "sigma": max(self.sigmas), "q": self.q,
                 "sigma_clients": {i: s for i, s in enumerate(self.sigmas)}}
        self.plan = RoundPlan(tasks=tasks, state=state)
        return self.plan

    def aggregate(self, rnd, global_weights, results, factors) -> dict[str, np.ndarray]:
        self.t += 1
        return super().aggregate(rnd, global_weights, results, factors)

    def observe(self, rnd: int, test_loss: float, test_accuracy: float) -> None:
        crd = self.cfg.udp_crd
        triggered = crd.crd and self.last_loss - test_loss < crd.zeta   # V(w_t) - V(w_{t+1}) < zeta (nan: False)
        if triggered:
            self.T = discounted_horizon(self.T, self.t - 1, crd.beta)
        self.plan.state.update(discounted=bool(triggered), T_next=float(self.T))
        self.last_loss = test_loss

    def should_stop(self) -> str:
        return f"UDP: horizon T = {self.T} rounds reached" if self.t >= self.T else ""

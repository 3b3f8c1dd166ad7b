"""`padpfl` — Talaei & Izadi (PADPFL): clients solve the FedProx objective (eq. 4), clip their
weights to ||x_i|| <= B (eq. 7) and upload them with Gaussian noise sigma_C (eq. 8); the
server aggregates with the round's personalised impact factors p_i (the runtime's
impact.* schedule, renormalised over the updates that arrived) and adds sigma_S (eq. 13)
to the broadcast.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from emulator.policies.accounting import ReleaseAccountant
from emulator.policies.base import ClientTask, Policy, RoundPlan, select_clients
from emulator.privacy import gaussian_c, talaei_client_sigma, talaei_server_sigma
from nodes.rng import stream
from nodes.schema import NON_NEGATIVE, POSITIVE, ROUND, setting


@dataclass
class PadpflConfig:
    bound: float = setting(10.0, "B: clients clip their weights to ||x_i|| <= B before upload (eq. 7)")
    prox_mu: float = setting(0.01, "FedProx proximal coefficient mu of eq. 4")
    revelations: int = setting(0, "R: most uploads per client, R <= T = R_s (0 = ceil(R_s * per_round / n))")
    RANGES = dict(bound=POSITIVE, prox_mu=NON_NEGATIVE, revelations=ROUND)


class Padpfl(Policy):
    name = "padpfl"
    Options = PadpflConfig
    options_help = "policy=padpfl (Talaei & Izadi)"

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        pa, dp = cfg.padpfl, cfg.dp
        self.T = ctx.rounds_budget                              # aggregation times
        k = cfg.clients.per_round or ctx.n_clients
        self.R = pa.revelations or math.ceil(self.T * k / ctx.n_clients)   # most uploads per client, R <= T
        self.m_min = min(ctx.data_sizes)
        self.sigma_C = talaei_client_sigma(pa.bound, self.R, ctx.data_sizes, dp.epsilon, delta=dp.delta)  # eq. 8
        self.accountant = ReleaseAccountant(dp.epsilon, ctx.n_clients, self._epsilon_of)
        self.plan: RoundPlan | None = None

    def _epsilon_of(self, client: int, scales: Sequence[float]) -> float:
        """Eq. 8 solved for epsilon: each upload with std s spends 2 B c / (min m_i s); R of them spend eps."""
        if not scales:
            return 0.0
        if min(scales) == 0:
            return math.inf
        c = gaussian_c(self.cfg.dp.delta)
        return sum(2 * self.cfg.padpfl.bound * c / (self.m_min * s) for s in scales)

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        dp, pa = self.cfg.dp, self.cfg.padpfl
        tasks = [ClientTask(client=i, steps=dp.tau, lr=dp.lr, sigma=0.0, clip=0.0, q=1.0, prox_mu=pa.prox_mu,
                            weight_clip=pa.bound, output_noise="gaussian", output_noise_scale=self.sigma_C)
                 for i in select_clients(self.cfg, rnd, eligible)]
        self.plan = RoundPlan(tasks=tasks, state={"tau": float(dp.tau), "sigma": self.sigma_C, "sigma_C": self.sigma_C,
                                                  "T": float(self.T), "R": self.R})
        return self.plan

    def aggregate(self, rnd, global_weights, results, factors) -> dict[str, np.ndarray]:
        x = super().aggregate(rnd, global_weights, results, factors)   # eq. 3 with the round's p_i
        dp = self.cfg.dp
        sigma_S = (talaei_server_sigma(self.cfg.padpfl.bound, self.T, self.R, list(factors.values()),
                                       self.ctx.data_sizes, dp.epsilon, delta=dp.delta)   # eq. 13
                   if results else 0.0)
        self.plan.state["sigma_S"] = sigma_S
        if sigma_S == 0:
            return x
        rng = stream(self.cfg.seed, "server_noise", rnd)
        return {k: (v + rng.normal(0.0, sigma_S, v.shape)).astype(v.dtype) for k, v in x.items()}   # x~ = x + n_s

"""`padpfl` — Talaei & Izadi (PADPFL): clients solve the FedProx objective (eq. 4), clip their
weights to ||x_i|| <= B (eq. 7) and upload them with Gaussian noise sigma_C (eq. 8); the
server aggregates with the round's personalised impact factors p_i (the runtime's
impact.* schedule, renormalised over the updates that arrived) and adds sigma_S (eq. 13)
to the broadcast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np

from emulator.policies.accounting import ReleaseAccountant
from emulator.policies.base import Policy, RoundPlan, RunContext, fedavg, select_clients
from emulator.privacy import check_epsilon, gaussian_c
from nodes.contracts.rng import stream
from nodes.contracts.schema import NON_NEGATIVE, POSITIVE, ROUND, Range, setting
from nodes.contracts.tasks import ClientResult, ClientTask

# --- noise calibration (Talaei & Izadi eq. 8 and 13) ----------------------------------


def _talaei_c(c: float | None, delta: float | None) -> float:
    if c is not None:
        return float(c)
    if delta is None:
        raise ValueError("give c, or delta to use c = sqrt(2 ln(1.25/delta))")
    return gaussian_c(delta)


def _min_m(m: float | Sequence[float]) -> float:
    if np.ndim(m) == 0:
        return float(cast(float, m))
    return float(min(cast(Sequence[float], m)))


def talaei_client_sigma(
    B: float, R: int, m: float | Sequence[float], epsilon: float, c: float | None = None, delta: float | None = None
) -> float:
    """Talaei & Izadi eq. 8: sigma_C = 2 B R c / (min_i m_i * epsilon), same for all clients.

    B: clipping bound on the local weights (||x_i|| <= B; sensitivity 2B/m_i by eq. 7);
    R: maximum number of revelations of local parameters on upload (R <= T);
    m: the local dataset sizes m_i (or already their minimum);
    c: >= sqrt(2 ln(1.25/delta)); pass c, or delta to use that value.
    """
    epsilon = check_epsilon(epsilon)
    return 2.0 * B * R * _talaei_c(c, delta) / (_min_m(m) * epsilon)


def talaei_server_sigma(
    B: float,
    T: int,
    R: int,
    p: Sequence[float],
    m: float | Sequence[float],
    epsilon: float,
    c: float | None = None,
    delta: float | None = None,
) -> float:
    """Talaei & Izadi eq. 13 (Theorem 1): server-side noise std on the broadcast,

        sigma_S = 2 B c sqrt(T^2 max p_i^2 - R^2 sum p_i^2) / (min m_i * epsilon)
                  if T > R sqrt(sum p_i^2) / max p_i, else 0,

    i.e. sigma_S^2 = sigma_A^2 - sigma_AC^2 (eq. 14) with sigma_A = 2 B T c max p / (min m eps)
    and sigma_AC^2 = sum sigma_C^2 p_i^2 (eq. 12, sigma_C from eq. 8).
    p: the impact factors p_i; T: aggregation times; other symbols as in eq. 8.
    """
    epsilon = check_epsilon(epsilon)
    p = [float(x) for x in p]
    if not p or any(x < 0 for x in p):
        raise ValueError(f"impact factors must be a non-empty list of non-negative values, got {p}")
    pmax = max(p)
    sum_p2 = sum(x * x for x in p)
    if pmax == 0.0 or not T > R * math.sqrt(sum_p2) / pmax:
        return 0.0  # eq. 13, second branch: client noise already covers the server's need
    radicand = T**2 * pmax**2 - R**2 * sum_p2
    return 2.0 * B * _talaei_c(c, delta) * math.sqrt(radicand) / (_min_m(m) * epsilon)


@dataclass
class PadpflConfig:
    bound: float = setting(10.0, "B: clients clip their weights to ||x_i|| <= B before upload (eq. 7)")
    prox_mu: float = setting(0.01, "FedProx proximal coefficient mu of eq. 4")
    revelations: int = setting(0, "R: most uploads per client, R <= T = R_s (0 = ceil(R_s * per_round / n))")
    RANGES: ClassVar[dict[str, Range]] = dict(bound=POSITIVE, prox_mu=NON_NEGATIVE, revelations=ROUND)


class Padpfl(Policy):
    name = "padpfl"
    Options = PadpflConfig
    options_help = "policy=padpfl (Talaei & Izadi)"
    state_keys = ("T", "R", "m_min", "sigma_C")
    options: PadpflConfig

    def __init__(self, options: PadpflConfig, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        pa, dp = options, ctx.settings.dp
        self.T = ctx.rounds_budget  # aggregation times
        k = ctx.settings.per_round or ctx.n_clients
        self.R = pa.revelations or math.ceil(self.T * k / ctx.n_clients)  # most uploads per client, R <= T
        self.m_min = min(ctx.data_sizes)
        self.sigma_C = talaei_client_sigma(pa.bound, self.R, ctx.data_sizes, dp.epsilon, delta=dp.delta)  # eq. 8

    def make_accountant(self) -> ReleaseAccountant:
        return ReleaseAccountant(self.ctx.settings.dp.epsilon, self.ctx.n_clients, self._epsilon_of, "talaei_gaussian")

    def _epsilon_of(self, client: int, scales: Sequence[float]) -> float:
        """Eq. 8 solved for epsilon: each upload with std s spends 2 B c / (min m_i s); R of them spend eps."""
        if not scales:
            return 0.0
        if min(scales) == 0:
            return math.inf
        c = gaussian_c(self.ctx.settings.dp.delta)
        return sum(2 * self.options.bound * c / (self.m_min * s) for s in scales)

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        dp, pa = self.ctx.settings.dp, self.options
        tasks = tuple(
            ClientTask.dp_sgd(
                i,
                dp,
                sigma=0.0,
                clip=0.0,
                q=1.0,
                prox_mu=pa.prox_mu,
                weight_clip=pa.bound,
                output_noise="gaussian",
                output_noise_scale=self.sigma_C,
            )
            for i in select_clients(self.ctx.settings, rnd, eligible)
        )
        return RoundPlan(
            tasks=tasks,
            state={
                "tau": float(dp.tau),
                "sigma": self.sigma_C,
                "sigma_C": self.sigma_C,
                "T": float(self.T),
                "R": self.R,
            },
        )

    def aggregate(
        self, rnd: int, global_weights: dict[str, np.ndarray], results: list[ClientResult], factors: dict[int, float]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        x = fedavg(global_weights, results, factors)  # eq. 3 with the round's p_i
        dp, pa = self.ctx.settings.dp, self.options
        sigma_S = (
            talaei_server_sigma(
                pa.bound, self.T, self.R, list(factors.values()), self.ctx.data_sizes, dp.epsilon, delta=dp.delta
            )  # eq. 13
            if results
            else 0.0
        )
        if sigma_S == 0:
            return x, {"sigma_S": sigma_S}
        rng = stream(self.ctx.settings.seed, "server_noise", rnd)
        noisy = {k: (v + rng.normal(0.0, sigma_S, v.shape)).astype(v.dtype) for k, v in x.items()}  # x~ = x + n_s
        return noisy, {"sigma_S": sigma_S}

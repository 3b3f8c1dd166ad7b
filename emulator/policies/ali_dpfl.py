"""`ali_dpfl` — ALI-DPFL Algorithm 2: the number of local DP-SGD steps tau* is re-chosen every
round from eq. 9, so the rounds the budgets allow (R_s) and the steps the privacy budget allows
(R_c) are both used up.

mu and Gamma come from the paper (§IV-B: mu from full local gradients, Gamma a scenario
constant) or, as the authors' code computes them, from each client's last local step:
mu = sum_i p_i ||w_i after - w_i before its last step|| / ||w_i - w_new||, and
Gamma = |sum_i p_i (loss after - loss before the last step, on its batch)|.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from emulator.policies.base import Policy, RoundPlan, RunContext, RunSettings, fedavg, select_clients
from emulator.privacy import max_steps
from nodes.contracts.schema import NON_NEGATIVE, Check, Choice, Range, setting
from nodes.contracts.tasks import ClientResult, ClientTask


class MuEstimate(Choice):
    GRADIENT = "gradient"
    LAST_STEP = "last_step"


class GammaEstimate(Choice):
    FIXED = "fixed"
    LOSS_CHANGE = "loss_change"


@dataclass
class AliDpflConfig:
    gamma: float = setting(
        0.0, "Gamma of eq. 9, the data heterogeneity (paper: 10 Dir(0.05), 5 Dir(0.5), 1 Dir(1), 0 IID)"
    )
    mu_estimate: str = setting(
        "gradient",
        "mu of eq. 9: gradient (§IV-B, full local gradients) | last_step (the authors' "
        "code: last step's change of w_i over ||w_i - w_new||)",
    )
    gamma_estimate: str = setting(
        "fixed",
        "Gamma of eq. 9: fixed (ali_dpfl.gamma, as the paper) | loss_change (the "
        "authors' code: |sum p_i loss change of the last step|, every round)",
    )
    RANGES: ClassVar[dict[str, Range]] = dict(gamma=NON_NEGATIVE)


def optimal_tau(mu: float, T: float, C: float, sigma: float, d: int, B_hat: float, gamma: float) -> float:
    """ALI-DPFL eq. 9 (Lemma 2):
    tau* = sqrt(1 + (4/mu^2 + 3C^2 + 2 Gamma T mu + sigma^2 C^2 d / B^2) / ((2 + 1/T)(C^2 + sigma^2 C^2 d / B^2)))."""
    noise = sigma**2 * C**2 * d / B_hat**2
    return math.sqrt(1 + (4 / mu**2 + 3 * C**2 + 2 * gamma * T * mu + noise) / ((2 + 1 / T) * (C**2 + noise)))


def estimate_mu_last_step(
    results: Sequence[ClientResult], factors: dict[int, float], new_global: dict[str, np.ndarray]
) -> float | None:
    """The ALI-DPFL code's mu: sum_i p_i ||last step's change of w_i|| / ||w_i - w_new||."""
    terms = []
    for r in results:
        distance = math.sqrt(
            sum(float(np.sum((r.weights[k].astype(np.float64) - w) ** 2)) for k, w in new_global.items())
        )
        if "last_step_change" in r.metrics and distance > 0:
            terms.append((factors[r.client], r.metrics["last_step_change"] / distance))
    weight = sum(p for p, _ in terms)
    return sum(p * m for p, m in terms) / weight if weight > 0 else None


def estimate_gamma_loss_change(results: Sequence[ClientResult], factors: dict[int, float]) -> float | None:
    """The ALI-DPFL code's Gamma: |sum_i p_i (loss after - loss before the last step, on its batch)|."""
    terms = [
        (factors[r.client], r.metrics["last_step_loss_change"]) for r in results if "last_step_loss_change" in r.metrics
    ]
    weight = sum(p for p, _ in terms)
    return abs(sum(p * g for p, g in terms) / weight) if weight > 0 else None


def estimate_mu(results: Sequence[ClientResult], factors: dict[int, float]) -> float | None:
    """§IV-B step 4.1: mu = sum_i p_i ||grad F_i(w_i) - grad F_i(w)|| / ||w_i - w|| over the clients
    that reported a parameter change; None when none did."""
    terms = [
        (factors[r.client], r.metrics["grad_change"] / r.metrics["param_change"])
        for r in results
        if r.metrics.get("param_change", 0.0) > 0
    ]
    weight = sum(p for p, _ in terms)
    return sum(p * m for p, m in terms) / weight if weight > 0 else None


class AliDpfl(Policy):
    name = "ali_dpfl"
    Options = AliDpflConfig
    options_help = "policy=ali_dpfl (ALI-DPFL Alg. 2)"
    state_keys = ("R_s", "R_c", "B_hat", "tau", "mu", "gamma", "k", "t", "steps")
    options: AliDpflConfig

    @classmethod
    def check(cls, options: AliDpflConfig, settings: RunSettings, check: Check) -> None:
        check(
            MuEstimate.admits(options.mu_estimate), "ali_dpfl.mu_estimate", options.mu_estimate, MuEstimate.describe()
        )
        check(
            GammaEstimate.admits(options.gamma_estimate),
            "ali_dpfl.gamma_estimate",
            options.gamma_estimate,
            GammaEstimate.describe(),
        )
        # eq. 9's tau* divides by C^2 + noise: its bound assumes clipped gradients
        clip = settings.dp.clip
        check(clip > 0, "dp.clip", clip, f"a gradient clipping bound > 0 (policy={cls.name}, eq. 9)")

    def __init__(self, options: AliDpflConfig, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        dp = ctx.settings.dp
        self.R_s = ctx.rounds_budget
        # Algorithm 3, under the scenario's accountant
        self.R_c = max_steps(dp.q, dp.sigma, dp.delta, dp.epsilon, conversion=dp.conversion, accountant=dp.accountant)
        self.B_hat = min(dp.q * n for n in ctx.data_sizes)  # §IV-B step 4.3
        self.tau = dp.tau  # Alg. 2 input: the first round's local iterations
        self.mu: float | None = None
        self.gamma = self.options.gamma  # replaced by each round's estimate when gamma_estimate = loss_change
        self.k = 0  # global rounds done
        self.t = 0  # local iterations done (Alg. 2's t)
        self.steps = 0  # this round's local iterations

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        dp = self.ctx.settings.dp
        T = min(self.R_s * self.tau, self.R_c)  # §IV-B step 4.2, previous tau*
        state = {"T": float(T), "mu": self.mu, "R_s": self.R_s, "R_c": self.R_c, "t": self.t}
        adaptive = self.R_s < self.R_c
        if not adaptive:
            self.tau = 1  # Lemma 1 (Alg. 2 lines 15-16)
        elif self.mu:  # known from the previous round; the first round runs the input tau
            tau_star = optimal_tau(
                self.mu, T, dp.clip, dp.sigma, self.ctx.num_params, self.B_hat, self.gamma
            )  # eq. 9 (Alg. 2 line 18)
            state["tau_star"] = tau_star
            self.tau = math.floor(tau_star + 0.5)  # nearest integer; tau* >= 1
        self.steps = min(self.tau, self.R_c - self.t)  # the last round stops at R_c
        opts = self.options
        last_step = opts.mu_estimate == MuEstimate.LAST_STEP or opts.gamma_estimate == GammaEstimate.LOSS_CHANGE
        tasks = tuple(
            ClientTask.dp_sgd(
                i,
                dp,
                steps=self.steps,
                report_grad_diff=adaptive and opts.mu_estimate == MuEstimate.GRADIENT,
                report_last_step=adaptive and last_step,
            )
            for i in select_clients(self.ctx.settings, rnd, eligible)
        )
        state.update(tau=float(self.steps), sigma=dp.sigma, gamma=self.gamma)
        return RoundPlan(tasks=tasks, state=state)

    def aggregate(
        self, rnd: int, global_weights: dict[str, np.ndarray], results: list[ClientResult], factors: dict[int, float]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        self.k += 1
        self.t += self.steps
        new = fedavg(global_weights, results, factors)
        opts = self.options
        measured = (
            estimate_mu_last_step(results, factors, new)
            if opts.mu_estimate == MuEstimate.LAST_STEP
            else estimate_mu(results, factors)
        )
        if measured is not None:
            self.mu = measured
        if opts.gamma_estimate == GammaEstimate.LOSS_CHANGE:
            gamma = estimate_gamma_loss_change(results, factors)
            if gamma is not None:
                self.gamma = gamma
        return new, {"mu_measured": measured}

    def should_stop(self) -> str:
        if self.k >= self.R_s:
            return f"ALI-DPFL: k = {self.k} rounds >= R_s = {self.R_s}"
        if self.t >= self.R_c:
            return f"ALI-DPFL: t = {self.t} local iterations >= R_c = {self.R_c} (privacy budget)"
        return ""

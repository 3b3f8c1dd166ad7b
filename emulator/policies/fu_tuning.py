"""`fu_tuning` — Fu et al. Algorithm 1 (client-based DP-FedAvg): b of N clients, chosen round
robin, run E clipped, noise-free local iterations on their full data and upload the model
plus Laplace (Thm 1) or Gaussian (Thm 2) noise calibrated for the T_l rounds each takes part
in. E is fixed, or E = round(T^{z/(z+1)}) (Thm 4-5; z = 2 Laplace, z = 1 Gaussian) for T
total local iterations; without either, T = R_s^{z+1}, the T whose schedule takes the R_s rounds
the budgets allow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from emulator.policies.accounting import ReleaseAccountant
from emulator.policies.base import Policy, RoundPlan, RunContext, RunSettings, fedavg, select_clients
from emulator.privacy import check_delta, check_epsilon, gaussian_c
from nodes.contracts.schema import MAX_STEPS, Check, Choice, Range, Selection, setting
from nodes.contracts.tasks import ClientResult, ClientTask

# --- noise calibration (Fu et al. Thm 1-2) --------------------------------------------


def gaussian_sigma(eps: float, delta: float, sensitivity: float, releases: int = 1) -> float:
    """Noise std for `releases` Gaussian releases of an L2-`sensitivity` query, totalling
    (eps, delta): sensitivity * sqrt(2 ln(1.25/delta)) * sqrt(releases) / eps.

    The per-release calibration is the classic Gaussian mechanism; composition over the
    releases follows Fu et al. Theorem 2 (moments accountant), where sigma grows as
    sqrt(T_l). This is `fu_gaussian_sigma` with q = 1 (Fu's Algorithm 1 is full-batch) and
    its unspecified constant c_2 fixed so that one release is the classic mechanism.
    """
    eps = check_epsilon(eps)
    if releases < 1:
        raise ValueError(f"releases must be >= 1, got {releases}")
    if eps == math.inf:
        return 0.0
    return float(sensitivity) * gaussian_c(delta) * math.sqrt(releases) / eps


def fu_gaussian_sigma(
    epsilon: float, delta: float, T_l: int, Xi_2: float = 1.0, q: float = 1.0, c_2: float | None = None
) -> float:
    """Fu et al. Theorem 2: noise N(0, sigma^2 Xi_2^2) with
    sigma = c_2 * q * sqrt(T_l log(1/delta)) / epsilon; returns the std sigma * Xi_2.

    Xi_2 = eta~ * E * xi_2 is the L2 sensitivity of one upload (`fu_sensitivity`). The paper
    leaves c_2 unspecified; by default c_2 = sqrt(2 ln(1.25/delta) / ln(1/delta)), so that
    q = 1, T_l = 1 gives the classic Gaussian mechanism (and equals `gaussian_sigma`).
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
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
    eps = check_epsilon(eps)
    if releases < 1:
        raise ValueError(f"releases must be >= 1, got {releases}")
    if eps == math.inf:
        return 0.0
    return releases * float(l1_sensitivity) / eps


class Mechanism(Choice):
    LAPLACE = "laplace"
    GAUSSIAN = "gaussian"


@dataclass
class FuTuningConfig:
    mechanism: str = setting(
        "gaussian", "output noise: laplace (Thm 1, z = 2) | gaussian (Thm 2, z = 1); dp.clip is xi"
    )
    local_iters: int = setting(0, "E local iterations per round (0 = round(T^(z/(z+1))) from iterations)")
    iterations: int = setting(
        0,
        "T, total local iterations: sets E when local_iters = 0 and caps rounds at T/E "
        "(0 = from the round budget R_s: T = R_s^(z+1) when local_iters = 0, so E = R_s^z; "
        "no cap otherwise)",
    )
    RANGES: ClassVar[dict[str, Range]] = dict(
        local_iters=Range(0, MAX_STEPS), iterations=Range(0, 10**9)
    )  # E <= T^(2/3) <= 10^6


Z: dict[str, int] = {Mechanism.LAPLACE: 2, Mechanism.GAUSSIAN: 1}  # Definition 2: V_M = O(eta^2 E^2 T_g^z), eq. 2-3


def local_iterations(T: int, mechanism: str) -> int:
    """Thm 4-5: E = O(T^{z/(z+1)}), rounded half up to an integer >= 1."""
    z = Z[mechanism]
    return max(1, math.floor(float(T ** (z / (z + 1))) + 0.5))  # float(): typeshed's ** returns Any


def iterations_for_rounds(rounds: int, mechanism: str) -> int:
    """The T whose Thm 4-5 schedule takes exactly `rounds` global iterations: T_g = T / E = T^{1/(z+1)},
    so T = rounds^{z+1} (E = rounds^z, at most MAX_STEPS)."""
    z = Z[mechanism]
    return min(int(rounds**z), MAX_STEPS) * rounds  # int(): z > 0, typeshed's ** returns Any


class FuTuning(Policy):
    name = "fu_tuning"
    Options = FuTuningConfig
    options_help = "policy=fu_tuning (Fu et al. Alg. 1)"
    state_keys = ("E", "T_g", "T_l", "clip", "Xi", "scale", "rounds")
    options: FuTuningConfig

    @classmethod
    def check(cls, options: FuTuningConfig, settings: RunSettings, check: Check) -> None:
        check(Mechanism.admits(options.mechanism), "fu_tuning.mechanism", options.mechanism, Mechanism.describe())
        clip = settings.dp.clip
        check(clip > 0, "dp.clip", clip, f"a gradient clipping bound > 0 (policy={cls.name})")

    def __init__(self, options: FuTuningConfig, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        fu, dp = options, ctx.settings.dp
        # Without E or T, T is the one whose schedule fills the round budget R_s (the paper fixes T).
        T = fu.iterations or (0 if fu.local_iters else iterations_for_rounds(ctx.rounds_budget, fu.mechanism))
        self.E = fu.local_iters or local_iterations(T, fu.mechanism)
        self.T_g = min(ctx.rounds_budget, T // self.E) if T else ctx.rounds_budget
        b = ctx.settings.per_round or ctx.n_clients
        self.T_l = math.ceil(b * self.T_g / ctx.n_clients)  # most rounds a client takes part in (round robin)
        # xi bounds each gradient's norm: L2 for Gaussian; for Laplace's L1 bound the per-sample L2
        # clip is xi/sqrt(d), since ||g||_1 <= sqrt(d) ||g||_2.
        self.clip = dp.clip if fu.mechanism == "gaussian" else dp.clip / math.sqrt(ctx.num_params)
        self.Xi = fu_sensitivity(dp.lr, self.E, dp.clip)  # Xi = eta E xi (Thm 1-2)
        if fu.mechanism == Mechanism.LAPLACE:
            self.scale = laplace_scale(dp.epsilon, self.Xi, self.T_l)  # Thm 1: Lap(0, T_l Xi_1 / eps)
        else:
            self.scale = gaussian_sigma(dp.epsilon, dp.delta, self.Xi, self.T_l)  # Thm 2, q = 1 (full batch)
        self.rounds = 0

    def make_accountant(self) -> ReleaseAccountant:
        return ReleaseAccountant(
            self.ctx.settings.dp.epsilon, self.ctx.n_clients, self._epsilon_of, f"fu_{self.options.mechanism}"
        )

    def _epsilon_of(self, client: int, scales: Sequence[float]) -> float:
        """Epsilon of releases with these noise scales: Thm 1 composes eps_r = Xi/b linearly; Thm 2's
        sigma grows as sqrt(T_l), i.e. eps = Xi c sqrt(sum 1/sigma^2) (inverse of `gaussian_sigma`)."""
        if not scales:
            return 0.0
        if min(scales) == 0:
            return math.inf
        if self.options.mechanism == Mechanism.LAPLACE:
            return sum(self.Xi / b for b in scales)
        return self.Xi * gaussian_c(self.ctx.settings.dp.delta) * math.sqrt(sum(1 / s**2 for s in scales))

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        fu = self.options
        tasks = tuple(
            ClientTask.dp_sgd(
                i,
                self.ctx.settings.dp,
                steps=self.E,
                sigma=0.0,
                clip=self.clip,
                q=1.0,
                output_noise=fu.mechanism,
                output_noise_scale=self.scale,
            )
            for i in select_clients(self.ctx.settings, rnd, eligible, how=Selection.ROUND_ROBIN)
        )
        state = {
            "tau": float(self.E),
            "sigma": self.scale,
            "T": float(self.T_g),
            "T_l": self.T_l,
            "sensitivity": self.Xi,
            "mechanism": fu.mechanism,
        }
        return RoundPlan(tasks=tasks, state=state)

    def aggregate(
        self, rnd: int, global_weights: dict[str, np.ndarray], results: list[ClientResult], factors: dict[int, float]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        self.rounds += 1
        return fedavg(global_weights, results, factors), {}

    def should_stop(self) -> str:
        return f"Fu et al.: T_g = {self.T_g} global iterations done" if self.rounds >= self.T_g else ""

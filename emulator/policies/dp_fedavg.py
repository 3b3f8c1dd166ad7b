"""`dp_fedavg` — DP-FedAvg (McMahan et al., ICLR 2018, Alg. 1), with the adaptive clipping of Andrew
et al. (NeurIPS 2021, Alg. 1) as an option: the clients a round draws (Poisson, each with
q = clients.per_round / clients.n, or clients.per_round of clients.n without replacement) take dp.tau
plain SGD steps at dp.lr on their Poisson batches (dp.q); each update w_i - w is clipped to L2 norm S,
and the server releases w + (sum of the clipped updates + N(0, z^2 S^2 I)) / m, m = clients.per_round
the expected number of clients a round (McMahan et al.'s fixed-denominator estimator with unit
weights, whatever impact.* says). Client-level DP for the whole population (population.py), z as set
or calibrated to spend dp.epsilon in the run's R_s rounds.

Where the noise is added (dp_fedavg.noise):
* central: the server clips the updates it receives and adds the noise. The trusted-server model, in
  which clipping on the server equals clipping on the client; the task is plain SGD, unchanged.
* local: each of the round's k selected clients clips its own update and adds N(0, z^2 S^2 / k I)
  before uploading, so that the sum of the k uploads carries the central noise. It assumes an
  honest-but-curious server that sees only that sum (secure aggregation; the emulator sums in the
  clear, and each upload alone carries z / sqrt(k)) and no dropouts: a client that does not arrive
  takes its share of the noise with it, the aggregate carries less than it is accounted with, and no
  epsilon holds for that round (recorded: the population accountant's short rounds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from emulator.policies.base import Policy, RoundPlan, RunContext, RunSettings
from emulator.policies.population import (
    PopulationAccountant,
    Sampling,
    calibrated_noise_multiplier,
    calibration_problem,
)
from emulator.privacy.pld import PLD_INSTALL, pld_installed
from emulator.timemodel.by_index import members
from nodes.contracts.rng import stream
from nodes.contracts.schema import (
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY,
    Check,
    Choice,
    Conversion,
    Range,
    setting,
)
from nodes.contracts.tasks import ClientResult, ClientTask, Weights


class NoisePlacement(Choice):
    CENTRAL = "central"
    LOCAL = "local"


@dataclass
class AdaptiveClipConfig:
    enabled: bool = setting(False, "adaptive clipping (Andrew et al. Alg. 1): S follows a quantile of the update norms")
    target_quantile: float = setting(0.5, "gamma: the share of the updates S should leave unclipped")
    lr: float = setting(0.2, "eta_C: S <- S exp(-eta_C (b - gamma)), b the noised unclipped share")
    noise: float = setting(
        0.0,
        "sigma_b: std of the noise on the count of unclipped updates, > z/2 (0 = clients.per_round / 20, "
        "Andrew et al.'s choice)",
    )
    RANGES: ClassVar[dict[str, Range]] = dict(target_quantile=PROBABILITY, lr=NON_NEGATIVE, noise=NON_NEGATIVE)


@dataclass
class DpFedAvgConfig:
    noise: str = setting(
        "central",
        f"{NoisePlacement.describe()}: the server adds N(0, z^2 S^2) to the clipped sum, or each of the "
        "k selected clients clips its update and adds N(0, z^2 S^2 / k) before uploading",
    )
    sampling: str = setting(
        "poisson",
        f"{Sampling.describe()}: each client with q = clients.per_round / clients.n, or clients.per_round "
        "of them without replacement (dp.accountant=rdp, by dp-accounting); replaces clients.select",
    )
    noise_multiplier: float = setting(
        0.0,
        "z: the noise's std over the clip S, on the sum of the clipped updates (0 = calibrated: the smallest z "
        "at which the run's R_s rounds spend dp.epsilon; no noise when dp.epsilon is inf)",
    )
    clip: float = setting(1.0, "S: L2 clip of each update w_i - w (adaptive clipping: the initial S)")
    adaptive: AdaptiveClipConfig = setting(None, "adaptive clipping (Andrew et al. Alg. 1)", AdaptiveClipConfig)
    RANGES: ClassVar[dict[str, Range]] = dict(noise_multiplier=NON_NEGATIVE, clip=POSITIVE)


# --- the mechanism -----------------------------------------------------------------------


def update_noise_multiplier(z: float, sigma_b: float) -> float:
    """Andrew et al. Thm 1: updates noised with z_Delta and the centred count with sigma_b together
    are the Gaussian mechanism with z, for z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)."""
    if z == 0.0:
        return 0.0
    if not 2 * sigma_b > z:
        raise ValueError(f"sigma_b = {sigma_b}: expected more than z/2 = {z / 2} (Andrew et al. Thm 1)")
    return float((z**-2 - (2 * sigma_b) ** -2) ** -0.5)


def noised_unclipped_share(unclipped: Sequence[bool], count_noise: float, m: float) -> float:
    """Andrew et al. Alg. 1's b: (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / m + 1/2, the bits b_i =
    [||update_i|| <= S] centred so that one client moves their sum by 1/2 (the 2 sigma_b of Thm 1)."""
    return (sum(b - 0.5 for b in unclipped) + count_noise) / m + 0.5


def next_clip(clip: float, share: float, gamma: float, lr: float) -> float:
    """Andrew et al. Alg. 1's geometric step: S <- S exp(-lr (b - gamma))."""
    return clip * math.exp(-lr * (share - gamma))


def poisson_sample(seed: int, rnd: int, n: int, q: float, candidates: Sequence[int]) -> list[int]:
    """Each of the n client ids independently with probability q, from the round's own stream, and the
    candidates (in id order) among them. The gaps between sampled ids are geometric, drawn until past n: a
    round costs the ids it samples, not n (python -m bench --only scale10m), and a client's draw does not
    depend on who else was a candidate."""
    rng = stream(seed, "dp_fedavg_sample", rnd)
    sampled: list[int] = []
    at = -1  # the last id sampled
    while at < n:
        ids = at + np.cumsum(rng.geometric(q, size=math.ceil(n * q + 4 * math.sqrt(n * q)) + 16))
        at = int(ids[-1])
        sampled += ids[ids < n].tolist()
    return members(candidates, sampled)


def fixed_sample(seed: int, rnd: int, k: int, candidates: Sequence[int]) -> list[int]:
    """k of the candidates (in id order) uniformly without replacement, from the round's own stream."""
    pick = stream(seed, "dp_fedavg_sample", rnd).choice(len(candidates), size=min(k, len(candidates)), replace=False)
    return sorted(int(candidates[i]) for i in pick)


def server_noise(seed: int, rnd: int, std: float, like: Weights) -> Weights:
    """N(0, std^2) per coordinate of each tensor of `like`, in its order, from the round's own stream."""
    rng = stream(seed, "dp_fedavg_noise", rnd)
    return {k: rng.normal(0.0, std, v.shape) for k, v in like.items()}


def _norm(update: Weights) -> float:
    return math.sqrt(sum(float(np.sum(d * d)) for d in update.values()))


class DpFedAvg(Policy):
    name = "dp_fedavg"
    Options = DpFedAvgConfig
    options_help = "policy=dp_fedavg (McMahan et al. Alg. 1; Andrew et al. Alg. 1)"
    state_keys = ("clip",)
    accountant: PopulationAccountant  # make_accountant's
    options: DpFedAvgConfig

    @classmethod
    def check(cls, options: DpFedAvgConfig, settings: RunSettings, check: Check) -> None:
        o = options
        check(NoisePlacement.admits(o.noise), "dp_fedavg.noise", o.noise, NoisePlacement.describe())
        check(Sampling.admits(o.sampling), "dp_fedavg.sampling", o.sampling, Sampling.describe())
        dp = settings.dp
        if o.sampling == Sampling.FIXED:
            check(
                pld_installed(),
                "dp_fedavg.sampling",
                o.sampling,
                f"poisson: fixed is accounted by Google's dp-accounting, not installed ({PLD_INSTALL})",
            )
            check(
                dp.accountant == "rdp" and dp.conversion == Conversion.IMPROVED,
                "dp.accountant",
                f"{dp.accountant} ({dp.conversion})",
                "rdp (improved) with dp_fedavg.sampling=fixed: only dp-accounting's RDP accounts sampling "
                "without replacement",
            )
        n = settings.n_clients
        k = settings.per_round or n
        if math.isfinite(dp.epsilon) and o.noise_multiplier > 0:
            first = PopulationAccountant(dp, n, o.sampling, k / n, k, o.noise_multiplier).population_epsilon(1)
            check(
                first <= dp.epsilon,
                "dp.epsilon",
                dp.epsilon,
                f"at least one round's client-level epsilon, {first:.3g} at dp_fedavg.noise_multiplier = "
                f"{o.noise_multiplier:g} and q = {k / n:g} (raise z, or lower clients.per_round)",
            )
        if o.noise_multiplier == 0:  # calibrated at start: to a budget some z up to Z_MAX reaches
            problem = calibration_problem(dp, n, o.sampling, k / n, k, settings.rounds)
            check(not problem, "dp.epsilon", dp.epsilon, problem)
        if o.adaptive.enabled:
            check(
                o.noise == NoisePlacement.CENTRAL,
                "dp_fedavg.adaptive.enabled",
                True,
                "false with dp_fedavg.noise=local: each client's clipped-or-not bit would reach the server unnoised",
            )
            sigma_b = cls.count_noise(settings, o)
            # a calibrated z is largest for budget.rounds, R_s's upper bound
            z = o.noise_multiplier or calibrated_noise_multiplier(dp, n, o.sampling, k / n, k, settings.rounds)
            check(
                z == 0 or 2 * sigma_b > z,
                "dp_fedavg.adaptive.noise",
                sigma_b,
                f"a count noise sigma_b > z/2 = {z / 2:g} (Andrew et al. Thm 1)",
            )

    @staticmethod
    def count_noise(settings: RunSettings, o: DpFedAvgConfig) -> float:
        """sigma_b: as set, or m / 20 (Andrew et al.'s recommendation)."""
        return o.adaptive.noise or (settings.per_round or settings.n_clients) / 20

    def __init__(self, options: DpFedAvgConfig, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        o = options
        self.m = ctx.settings.per_round or ctx.n_clients  # expected clients a round, both samplings
        self.clip = o.clip  # S of the next round; adaptive clipping moves it
        self.sigma_b = self.count_noise(ctx.settings, o) if o.adaptive.enabled else 0.0
        self.z = self.accountant.z  # as set, or calibrated to the budget
        self.z_delta = update_noise_multiplier(self.z, self.sigma_b) if o.adaptive.enabled else self.z
        self._round: dict[str, Any] = {}  # this round's draw, from configure_round to aggregate

    def make_accountant(self) -> PopulationAccountant:
        o, n, run = self.options, self.ctx.n_clients, self.ctx.settings
        k = run.per_round or n
        z = o.noise_multiplier or calibrated_noise_multiplier(run.dp, n, o.sampling, k / n, k, self.ctx.rounds_budget)
        return PopulationAccountant(run.dp, n, o.sampling, k / n, k, z, run.sampling_caveat)

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        o, dp, n = self.options, self.ctx.settings.dp, self.ctx.n_clients
        if not eligible:  # every client's budget is spent: nothing to release
            return RoundPlan(tasks=())
        if o.sampling == Sampling.POISSON:
            chosen = poisson_sample(self.ctx.settings.seed, rnd, n, self.m / n, eligible)
        else:
            chosen = fixed_sample(self.ctx.settings.seed, rnd, self.m, eligible)
        local: dict[str, Any] = {}
        if o.noise == NoisePlacement.LOCAL and chosen:
            # each of the k uploads carries 1/k of the central noise's variance
            scale = self.z * self.clip / math.sqrt(len(chosen))
            local = dict(update_clip=self.clip, output_noise="gaussian", output_noise_scale=scale)
        # plain SGD (sigma = clip = 0): dp.tau steps at dp.lr on the client's Poisson batches at dp.q
        tasks = tuple(ClientTask.dp_sgd(i, dp, sigma=0.0, clip=0.0, **local) for i in chosen)
        self._round = {"selected": len(chosen), "clip": self.clip}
        state = {
            "tau": float(dp.tau),
            "sigma": self.z,
            "z": self.z,
            "z_delta": self.z_delta,
            "clip": self.clip,
            "m": self.m,
            "q": self.m / n,
            "sampling": o.sampling,
            "noise": o.noise,
            "selected": len(chosen),
        }
        return RoundPlan(tasks=tasks, state=state, empty_round=not chosen)

    def aggregate(
        self, rnd: int, global_weights: Weights, results: list[ClientResult], factors: dict[int, float]
    ) -> tuple[Weights, dict[str, Any]]:
        """w + (sum of the clipped updates + noise) / m, every arrived update weighing 1/m."""
        o, acc = self.options, self.accountant
        clip, selected = self._round["clip"], self._round["selected"]
        w = {k: v.astype(np.float64) for k, v in global_weights.items()}
        updates = [{k: r.weights[k].astype(np.float64) - w[k] for k in w} for r in results]
        norms = [_norm(u) for u in updates]
        total = {k: np.zeros_like(v) for k, v in w.items()}
        central = o.noise == NoisePlacement.CENTRAL
        for u, norm in zip(updates, norms):
            scale = min(1.0, clip / norm) if central and norm > 0 else 1.0  # local: clipped on the client
            for k in total:
                total[k] += scale * u[k]
        if central or not selected:  # with no client selected, no client adds the local noise: the server does
            std = (self.z_delta if central else self.z) * clip
            for k, noise in server_noise(self.ctx.settings.seed, rnd, std, w).items():
                total[k] += noise
            noise_std = std / self.m
        else:
            noise_std = self.z * clip * math.sqrt(len(results) / selected) / self.m
            if len(results) < selected:
                acc.short_rounds.append(rnd)
        new = {k: (w[k] + total[k] / self.m).astype(v.dtype) for k, v in global_weights.items()}
        state: dict[str, Any] = {
            "noise_std": noise_std,
            "epsilon_unamplified": acc.unamplified_max(),
            "amplification_valid": not acc.amplification_invalid,
            "epsilon_valid": acc.valid(),
            "norm_quantile": float(np.quantile(norms, o.adaptive.target_quantile)) if central and norms else None,
        }
        if o.adaptive.enabled:
            unclipped = [norm <= clip for norm in norms]
            count_noise = float(stream(self.ctx.settings.seed, "dp_fedavg_count", rnd).normal(0.0, self.sigma_b))
            share = noised_unclipped_share(unclipped, count_noise, self.m)
            self.clip = next_clip(clip, share, o.adaptive.target_quantile, o.adaptive.lr)
            state |= {
                "unclipped_share": sum(unclipped) / len(unclipped) if unclipped else None,
                "unclipped_noised": share,
                "clip_next": self.clip,
            }
        return new, state

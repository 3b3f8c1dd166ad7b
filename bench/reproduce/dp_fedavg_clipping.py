"""Andrew et al. (NeurIPS 2021), Alg. 1 and Thm 1, on McMahan et al.'s DP-FedAvg (ICLR 2018, Alg. 1):
adaptive against fixed clipping, and the population's client-level epsilon against the accounting
libraries' own.

(a) scenarios/dp_fedavg.yaml with S fixed at 0.1 or 1.0, or adaptive from either; and a
near-stationary population (40 clients every round, local lr 0.02, 60 rounds), adaptive from below and
from above: does S settle at the target quantile (the median) of the unclipped update norms? The
server of this emulator sees every unclipped norm, so each round records the true median beside S.
(b) The epsilon the run's ledger reports for two settings, each sampling and accountant, against the
library called directly: dp_accounting's RDP and PLD, Opacus's PRV.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from bench.reproduce.common import Options, column, fmt, group, markdown_table, mean_std, runs, sweep
from emulator.policies.population import PopulationAccountant, Sampling
from emulator.privacy.rdp import DEFAULT_ORDERS
from nodes.contracts.schema import DPConfig

SCENARIO = "dp_fedavg.yaml"
CLIPS = [0.1, 1.0]  # the scenario's S: Andrew et al.'s starting clip, and one above the update norms' median
TRACKING = [  # a near-stationary population: every client every round, small local steps
    "clients.n=40",
    "clients.per_round=0",
    "dp.lr=0.02",
    "dp.epsilon=inf",
    "dp_fedavg.adaptive.enabled=true",
    "dp_fedavg.adaptive.noise=0",  # sigma_b = m / 20, Andrew et al.'s choice
    "budget.rounds=60",
]
TRACKING_CLIPS = [0.1, 1.0]
WITHIN = 0.1  # the acceptance: S within 10 % of the median after 50 rounds (on average over the later rounds)
AFTER = 50


@dataclass(frozen=True)
class Setting:
    name: str
    n: int  # clients
    k: int  # expected a round
    z: float
    rounds: int
    delta: float


SETTINGS = [
    Setting("the shipped scenario", 500, 50, 1.0, 32, 1e-5),
    Setting("cross-device", 10**6, 1000, 1.0, 2000, 1e-6),
]


def _states(run) -> list[dict]:
    return [json.loads(s) for s in column(run, "rounds", "policy_state")]


def _errors(run) -> np.ndarray:
    """|S / median - 1| per round: S of the round against the true median of its unclipped norms."""
    s = [x for x in _states(run) if x["norm_quantile"]]
    return np.array([abs(x["clip"] / x["norm_quantile"] - 1) for x in s])


def _first_within(errors: np.ndarray) -> float:
    """The first round in which S is within WITHIN of the median (nan if none is)."""
    inside = np.flatnonzero(errors <= WITHIN)
    return float(inside[0]) if inside.size else math.nan


def _settles(rs: list) -> str:
    """The mean over seeds of `_first_within`, and how many seeds never got there."""
    firsts = [_first_within(_errors(r)) for r in rs]
    reached = [f for f in firsts if not math.isnan(f)]
    if not reached:
        return "never"
    text = fmt(*mean_std(reached))
    return (
        text if len(reached) == len(firsts) else f"{text} ({len(firsts) - len(reached)} of {len(firsts)} seeds never)"
    )


def _population(run) -> dict:
    return run.manifest["privacy"]["population"]


def _row(label: str, rs: list) -> list:
    def of(fn) -> str:
        mean, std = mean_std([float(fn(r)) for r in rs])
        return fmt(mean, std)

    return [
        label,
        of(lambda r: len(column(r, "rounds", "round"))),
        of(lambda r: 100 * column(r, "rounds", "test_accuracy")[-1]),
        of(lambda r: 100 * max(a for a in column(r, "rounds", "test_accuracy") if not math.isnan(a))),
        of(lambda r: _states(r)[-1]["clip"]),
        of(lambda r: _states(r)[-1]["norm_quantile"]),
        of(lambda r: 100 * _errors(r)[-10:].mean()),
        _settles(rs),
        of(lambda r: _population(r)["epsilon_amplified"]),
        of(lambda r: _population(r)["epsilon_unamplified_max"]),
    ]


HEADER = [
    "clipping",
    "rounds",
    "final acc %",
    "best acc %",
    "final S",
    "final median norm",
    "|S/median - 1| %, last 10 rounds",
    "first round S within 10 %",
    "eps (amplified)",
    "eps (unamplified, largest)",
]


def _opacus(setting: Setting, accountant: str) -> float:
    """Opacus's own RDPAccountant or PRVAccountant (the rdp and prv accountants' library)."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    acc = RDPAccountant() if accountant == "rdp" else PRVAccountant()
    acc.history = [(setting.z, setting.k / setting.n, setting.rounds)]
    if accountant == "rdp":
        return float(acc.get_epsilon(setting.delta))
    return float(acc.get_epsilon(setting.delta, eps_error=0.01))


def _dp_accounting(setting: Setting, sampling: str, accountant: str) -> float:
    """dp_accounting's RdpAccountant (Opacus's orders) or PLDAccountant, called directly."""
    import dp_accounting

    if sampling == Sampling.FIXED:  # replace-one: one client swapped moves the clipped sum by 2S
        acc = dp_accounting.rdp.RdpAccountant(
            orders=DEFAULT_ORDERS, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
        )
        one = dp_accounting.SampledWithoutReplacementDpEvent(
            setting.n, setting.k, dp_accounting.GaussianDpEvent(setting.z / 2)
        )
        acc.compose(dp_accounting.SelfComposedDpEvent(one, setting.rounds))
        return float(acc.get_epsilon(setting.delta))
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(setting.k / setting.n, dp_accounting.GaussianDpEvent(setting.z)),
        setting.rounds,
    )
    if accountant == "pld":
        pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
        pld.compose(event)
        return float(pld.get_epsilon(setting.delta))
    rdp = dp_accounting.rdp.RdpAccountant(orders=DEFAULT_ORDERS)
    rdp.compose(event)
    return float(rdp.get_epsilon(setting.delta))


def epsilon_rows() -> list[list]:
    """(b): per setting, sampling and accountant, the ledger's epsilon, the libraries' (called directly;
    dp_accounting has no PRV, Opacus no PLD and no sampling without replacement), and the difference to
    the accountant's own library: Opacus's for rdp and prv, dp_accounting's for pld and fixed."""
    rows = []
    for s in SETTINGS:
        for sampling, accountant in [(Sampling.POISSON, a) for a in ("rdp", "prv", "pld")] + [(Sampling.FIXED, "rdp")]:
            dp = DPConfig(epsilon=math.inf, delta=s.delta, accountant=accountant)
            ours = PopulationAccountant(dp, s.n, sampling, s.k / s.n, s.k, s.z).population_epsilon(s.rounds)
            poisson = sampling == Sampling.POISSON
            opacus = _opacus(s, accountant) if poisson and accountant != "pld" else math.nan
            google = _dp_accounting(s, sampling, accountant) if accountant != "prv" else math.nan
            own = opacus if poisson and accountant in ("rdp", "prv") else google
            rows.append(
                [
                    f"{s.name}: N = {s.n:,}, m = {s.k:,}, z = {s.z:g}, {s.rounds:,} rounds, delta = {s.delta:g}",
                    sampling,
                    accountant,
                    f"{ours:.6g}",
                    "-" if math.isnan(opacus) else f"{opacus:.6g}",
                    "-" if math.isnan(google) else f"{google:.6g}",
                    f"{abs(ours / own - 1):.1e}",
                ]
            )
    return rows


def report(opts: Options) -> str:
    g = group(
        runs(
            sweep(
                opts,
                "dp_fedavg_clipping",
                SCENARIO,
                {"dp_fedavg.adaptive.enabled": ["false", "true"], "dp_fedavg.clip": CLIPS},
            )
        ),
        "dp_fedavg.adaptive.enabled",
        "dp_fedavg.clip",
    )
    rows = [
        _row(f"{'adaptive from' if adaptive == 'true' else 'fixed'} S = {clip}", g[(adaptive, str(clip))])
        for adaptive in ("false", "true")
        for clip in CLIPS
    ]
    tracking = group(
        runs(sweep(opts, "dp_fedavg_clipping-tracking", SCENARIO, {"dp_fedavg.clip": TRACKING_CLIPS}, TRACKING)),
        "dp_fedavg.clip",
    )
    tracked = [_row(f"adaptive from S = {clip}", tracking[(str(clip),)]) for clip in TRACKING_CLIPS]
    settled = all(
        len(_errors(r)) > AFTER and _errors(r)[AFTER:].mean() <= WITHIN for rs in tracking.values() for r in rs
    )
    eps = epsilon_rows()
    exact = all(float(row[-1]) <= 1e-6 for row in eps)
    apart = [row for row in eps if row[1] == Sampling.POISSON and row[2] == "rdp" and row[4] != row[5]]
    return (
        "## DP-FedAvg: adaptive against fixed clipping (Andrew et al. Alg. 1)\n\n"
        "Claim (Andrew et al. §3-4): the geometric update S <- S exp(-eta_C (b - gamma)) moves S to the "
        "gamma-quantile of the unclipped update norms, from a start far off either side, within rounds, "
        "at little privacy cost (Thm 1). Ours: gamma = 0.5, eta_C = 0.2, the count noise sigma_b = m / 20. "
        "Mean ± std over seeds " + ",".join(map(str, opts.seeds)) + ".\n\n"
        "### scenarios/dp_fedavg.yaml (500 clients, 50 a round, z = 1, eps = 5)\n\n"
        + markdown_table(HEADER, rows)
        + "\n### A near-stationary population (40 clients every round, local lr 0.02, eps unlimited)\n\n"
        + markdown_table(HEADER, tracked)
        + "\n"
        + f"Adaptive S within {100 * WITHIN:g} % of the round's median norm after {AFTER} rounds (the mean of "
        + "|S/median - 1| over the later rounds, each seed): "
        + ("yes" if settled else "no")
        + ".\n\n"
        "## The population's epsilon against the libraries' own\n\n"
        + markdown_table(
            ["setting", "sampling", "dp.accountant", "eps (ours)", "Opacus", "dp_accounting", "vs its own library"],
            eps,
        )
        + "\n"
        + ("Every figure is" if exact else "Not every figure is")
        + " its accountant's own library's to 1e-6 (rdp and prv: Opacus's; pld and fixed: dp_accounting's)."
        + (
            f" dp_accounting's RDP is not Opacus's in {len(apart)} setting(s): it leaves out the fractional "
            "orders at which its series does not converge (it warns), and its minimum over the rest can be larger."
            if apart
            else ""
        )
        + "\n\n"
        + EXPLAIN
    )


EXPLAIN = """\
### Reading the result

* **A fixed S is a bet on the norms.** Below the norms' median every update is cut to S, so the
  aggregate's step is small while the noise (z S / m a coordinate) is sized to it; above, few updates
  are clipped but the noise is sized to an S most updates do not reach. The adaptive runs pay a
  slightly larger z_Delta on the updates for the noised count (Thm 1), and the budget the same.
* **The clip's first rounds.** From 0.1 the geometric step can grow S by at most exp(eta_C gamma) a
  round, so S needs a number of rounds of the order of log(median / S) / (eta_C gamma) to reach the
  norms; from above it falls at most by exp(eta_C (1 - gamma)). After that it follows the median as
  the norms drift, within the count noise sigma_b / m.
* **Fixed-size sampling costs more epsilon.** dp_accounting accounts sampling without replacement
  only for replace-one neighbours, where one client swapped moves the clipped sum by 2S: its
  Gaussian is z / 2 of that, not z, and its epsilon is well above Poisson's add-or-remove one.
* **The two epsilons.** The amplified one holds only because the server's draw alone picks the
  clients (no availability model here); the unamplified one (q = 1 in each round a client trained
  in) holds whatever decided participation, and is the larger.
"""

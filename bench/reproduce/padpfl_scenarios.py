"""Talaei & Izadi (arXiv 2406.18491), Sec. VI: quality-aware (personalised) impact factors beat
equal ones in their scenarios 1-4, without DP (Figs. 2, 4, 6, 8) and with the client / server
noise of eq. 8 / eq. 13 (Figs. 3, 5, 7, 9). The paper's MNIST runs use FashionMNIST here.

Per scenario (scenarios/paper/padpfl_scenario{1..4}.yaml): impact.kind = uniform vs the paper's
factors without noise; for scenario 1 also the three DP curves of Fig. 3 (paper factors at
eps = 20 and 5, uniform at eps = 20); for all four the noise the DP runs would carry.
"""

from __future__ import annotations

import math

import numpy as np

from bench.reproduce.common import (
    Options,
    final,
    fmt,
    group,
    markdown_table,
    mean_std,
    runs,
    sweep,
)
from emulator.aggregate.impact import impact_factors
from emulator.config import load, policy_options
from emulator.policies.padpfl import Padpfl, PadpflConfig, talaei_client_sigma, talaei_server_sigma

MLP_TALAEI_PARAMS = 159_010  # 784*200 + 200 + 200*10 + 10 (nodes.training.models.mlp_talaei)
SCENARIOS = {
    1: ("explicit", "0-1-2", "Figs. 2-3"),
    2: ("explicit", "0-2-1", "Figs. 4-5"),
    3: ("explicit", "1-3-5", "Figs. 6-7"),
    4: ("schedule", "0-1-2, then 2-1-0 after t = 10", "Figs. 8-9"),
}


def scenario(n: int) -> str:
    return f"paper/padpfl_scenario{n}.yaml"


def _paired(pers: list, unif: list, name: str, sign: float) -> tuple[float, float, int]:
    """Per-seed gain of the paper's factors over uniform (sign = +1 for accuracy, -1 for loss)."""
    u = {r.seed: float(final(r, name)) for r in unif}
    gains = [sign * (float(final(r, name)) - u[r.seed]) for r in pers if r.seed in u]
    m, s = mean_std(gains)
    return m, s, sum(g > 0 for g in gains)


def _noise_rows() -> list[list]:
    """sigma_C (eq. 8) and sigma_S (eq. 13) each scenario's DP runs carry at eps = 20, and the
    aggregate's per-coordinate noise std relative to the per-coordinate scale B / sqrt(d) of a
    weight vector of norm B (B cancels: the ratio is 2 R c sqrt(d sum p^2) / (min m eps))."""
    rows = []
    for n, (kind, label, _) in SCENARIOS.items():
        cfg = load(scenario(n))
        sizes = [g.samples for g in cfg.data.groups for _ in range(g.clients)]
        T = cfg.budget.rounds
        pa: PadpflConfig = policy_options(Padpfl, cfg)
        R = pa.revelations or T
        sC = talaei_client_sigma(pa.bound, R, sizes, cfg.dp.epsilon, delta=cfg.dp.delta)
        scale = pa.bound / math.sqrt(MLP_TALAEI_PARAMS)
        for name, imp in (("uniform", "uniform"), (label, kind)):
            cfg_k = load(scenario(n), [f"impact.kind={imp}"])
            p = impact_factors(cfg_k.impact, 0, sizes)
            sS = talaei_server_sigma(pa.bound, T, R, list(p), sizes, cfg.dp.epsilon, delta=cfg.dp.delta)
            agg = math.sqrt(sC**2 * float(np.sum(p**2)) + sS**2)
            rows.append([n, name, f"{sC:.3g}", f"{sS:.3g}", f"{agg:.3g}", f"{agg / scale:.1f}"])
    return rows


def _scenario3_evidence(opts: Options) -> str:
    """Scenario 3 without DP, last round, per part: how far each client's local training moved the
    model and how well it fits its own data (client_rounds of the uniform runs)."""
    rs = group(runs(opts.out / "padpfl_scenarios-s3-noise_free"), "impact.kind")[("uniform",)]
    rows = []
    for part, (a, b, m) in enumerate([(0, 20, 50), (20, 40, 120), (40, 60, 271)], start=1):
        norms, losses = [], []
        for r in rs:
            t = r.table("client_rounds").to_pydict()
            last = max(t["round"])
            for rnd, c, un, tl in zip(t["round"], t["client"], t["update_norm"], t["train_loss"]):
                if rnd == last and a <= c < b:
                    norms.append(un)
                    losses.append(tl)
        rows.append([part, m, fmt(*mean_std(norms)), fmt(*mean_std(losses))])
    return (
        "Scenario 3, uniform factors, last round: the clients' own training (all seeds)\n\n"
        + markdown_table(["part", "samples per client", "update norm (x_i - x)", "train loss on own data"], rows)
        + "\n"
    )


def report(opts: Options) -> str:
    out = [
        "## Talaei & Izadi: quality-aware impact factors vs uniform (scenarios 1-4)\n\n",
        "Claim (Sec. VI-B): in each of the four scenarios of Table I the paper's personalised impact "
        "factors give a lower loss / higher accuracy than equal p_i, without DP (Figs. 2, 4, 6, 8) and "
        "with DP (Figs. 3, 5, 7, 9: even the paper's factors at eps = 5 beat equal p_i at eps = 20). "
        "**The paper's MNIST runs use FashionMNIST here** (MNIST is not on this machine); densities of "
        '"severe / moderate / slight" noise, B, mu, local steps and hidden width are ours (the paper '
        "gives none) and are named in the scenario files. Final values after 30 rounds, mean ± std over "
        "seeds " + ",".join(map(str, opts.seeds)) + "; the gain is paired by seed (same data and initial "
        "model).\n\n",
    ]

    # --- without DP: all four scenarios ---------------------------------------------------------
    rows, verdict = [], {}
    for n, (kind, label, figs) in SCENARIOS.items():
        g = group(
            runs(
                sweep(
                    opts,
                    f"padpfl_scenarios-s{n}-noise_free",
                    scenario(n),
                    {"impact.kind": ["uniform", kind]},
                    ["dp.epsilon=inf"],
                )
            ),
            "impact.kind",
        )
        unif, pers = g[("uniform",)], g[(kind,)]
        acc_gain = _paired(pers, unif, "test_accuracy", +1)
        loss_gain = _paired(pers, unif, "test_loss", -1)
        verdict[n] = acc_gain[0] > 0 and loss_gain[0] > 0
        for name, rs in (("uniform", unif), (label, pers)):
            rows.append(
                [
                    f"{n} ({figs.split('-')[0]})",
                    name,
                    fmt(*mean_std([float(final(r, "test_loss")) for r in rs])),
                    fmt(*mean_std([100 * float(final(r, "test_accuracy")) for r in rs])),
                    ""
                    if rs is unif
                    else f"{fmt(100 * acc_gain[0], 100 * acc_gain[1])} pts ({acc_gain[2]}/{len(rs)} seeds)",
                    "" if rs is unif else ("yes" if verdict[n] else "no"),
                ]
            )
    out.append(
        "### Without DP (Figs. 2, 4, 6, 8)\n\n"
        + markdown_table(
            [
                "scenario (fig.)",
                "impact factors",
                "final test loss",
                "final test accuracy %",
                "accuracy gain over uniform",
                "paper's factors better",
            ],
            rows,
        )
        + "\n"
    )

    out.append(_scenario3_evidence(opts))

    # --- with DP: scenario 1, the three curves of Fig. 3 ----------------------------------------
    g20 = group(
        runs(sweep(opts, "padpfl_scenarios-s1-eps20", scenario(1), {"impact.kind": ["uniform", "explicit"]})),
        "impact.kind",
    )
    g5 = runs(sweep(opts, "padpfl_scenarios-s1-eps5", scenario(1), None, ["dp.epsilon=5"]))
    rows = []
    curves = (("0-1-2, eps = 5", g5), ("0-1-2, eps = 20", g20[("explicit",)]), ("uniform, eps = 20", g20[("uniform",)]))
    for name, rs in curves:
        rows.append(
            [
                name,
                f"{float(final(rs[0], 'sigma')):.3g}",
                fmt(*mean_std([float(final(r, "test_loss")) for r in rs])),
                fmt(*mean_std([100 * float(final(r, "test_accuracy")) for r in rs])),
                fmt(*mean_std([100 * max(r.table("rounds").column("test_accuracy").to_pylist()) for r in rs])),
            ]
        )
    out.append(
        "### With DP, scenario 1 (Fig. 3): eq. 8 client noise, eq. 13 server noise\n\n"
        + markdown_table(
            ["curve", "sigma_C", "final test loss", "final test accuracy %", "best accuracy over the 30 rounds %"], rows
        )
        + "\n"
    )

    out.append(
        "### The noise eq. 8 / eq. 13 put on the aggregate at eps = 20 (R = T = 30), every scenario\n\n"
        "sigma_agg = sqrt(sigma_C^2 sum p_i^2 + sigma_S^2) per coordinate; the last column divides it by "
        "B / sqrt(d), the per-coordinate size of a weight vector of norm B (d = 159,010 for the MLP): a "
        "ratio above 1 means every round's broadcast is mostly noise, whatever B is.\n\n"
        + markdown_table(
            [
                "scenario",
                "impact factors",
                "sigma_C (eq. 8)",
                "sigma_S (eq. 13)",
                "sigma_agg",
                "sigma_agg / (B / sqrt d)",
            ],
            _noise_rows(),
        )
        + "\n"
    )
    out.append(EXPLAIN)
    return "".join(out)


EXPLAIN = """\
### Reading the result

* **Without DP** (the paper's Figs. 2, 4, 6, 8: same clients, data and initial model, only the
  aggregation weights differ) the paper's factors win where they down-weight corrupted clients
  (scenarios 1, 2 and the adaptive scenario 4, every seed). In scenario 3, where the parts differ
  only in size, 1-3-5 ties with equal factors (same loss, a fraction of a point lower accuracy).
  Likely cause, from the table above: no client fits its own data -- after 3 full-batch steps at
  the paper's learning rate 0.02 a 50-sample client's training loss is that of a 271-sample one
  and every update is a small step (norm ~0.05; the MLP's initial weights have norm 8.4) along nearly the same
  gradient, so weighting by size has nothing to correct. Size-proportional weights pay off when
  local models fit (or overfit) small datasets, i.e. with many more local steps, or with
  label-skewed clients (Sec. VI-A says the subset is "distributed between the clients
  non-identically" without saying how; we draw IID). The paper gives neither the local steps nor
  the split.
* **With DP** eq. 8 sets sigma_C = 2 B R c / (min m_i eps) with R = T = 30 uploads per client
  (basic composition), c = sqrt(2 ln(1.25 / 0.01)) = 3.11 and m = 150: at eps = 20 that is
  0.062 B per coordinate, 25 times the 0.0025 B per coordinate of a weight vector of norm B in
  d = 159,010 dimensions. Weighted averaging divides it by 1 / sqrt(sum p_i^2) (7.7 for 60 equal
  clients, 6.0 for 0-1-2), so each broadcast still carries 3-4 times more noise than weight (last
  column above; about 10 in scenario 3, whose smallest clients hold 50 samples). Clients then clip to
  ||x|| <= B, which shrinks the learned part with the noise, and add fresh noise. Every DP run
  of scenario 1 ends at chance (about 10 %), so the paper's ordering of the three Fig. 3 curves
  cannot be observed; here the uniform curve has the lower loss, as it carries less aggregate
  noise (ratio 3.2 against 4.1). eq. 13 adds
  nothing here: with R = T, T max p_i <= R sqrt(sum p_i^2) always holds, so sigma_S = 0. The ratio
  does not depend on B, so no choice of B rescues it; the paper's decreasing DP loss curves need R
  far below T, a much smaller model, or noise other than eq. 8 as written. The paper gives neither
  R, B nor its code (we found no public implementation), so we cannot say which.
"""

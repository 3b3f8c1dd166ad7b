"""Fu et al. (arXiv 2101.04163), Thm 4-5: with T total local iterations the final loss of
DP-FedAvg is lowest near E = T^(z/(z+1)) local iterations per round, z = 2 for the Laplace
mechanism (E* = T^(2/3)) and z = 1 for the Gaussian one (E* = T^(1/2)).

Two sweeps of E = fu_tuning.local_iters at the paper's T (Laplace T = 120, Fig. 5 / 7; Gaussian
T = 240, Fig. 6), each with a noise-free reference at two E, all over the seeds. The settings and
why they differ from the paper are in the scenario files' headers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

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
from emulator.policies.fu_tuning import Z, local_iterations


@dataclass
class Mechanism:
    name: str
    scenario: str
    T: int
    grid: list[int]  # E values swept
    reference: list[int]  # E values also run without noise (eps = inf)
    paper: str  # what the paper reports for this mechanism

    @property
    def predicted(self) -> int:
        return local_iterations(self.T, self.name)


LAPLACE = Mechanism(
    "laplace",
    "paper/fu_laplace_lr.yaml",
    120,
    [1, 2, 5, 10, 15, 24, 40, 120],
    [1, 24],
    "Fig. 7 (Lending Club LR, eps = 3, b = N): of E in {1, T^(1/3), T^(1/2), T^(2/3), T}, the "
    "E = T^(2/3) curve has the lowest final loss at every T up to 120. Fig. 5 / Table III (T = 120, "
    "b/N = 0.1) sweeps only E <= 12 (the table's values are not in our copy of the paper).",
)
GAUSSIAN = Mechanism(
    "gaussian",
    "paper/fu_gaussian_fmnist.yaml",
    240,
    [1, 2, 4, 8, 15, 24, 48],
    [1, 15],
    "Table IV (FEMNIST CNN, T = 240): best E = 24 at eps = 10, 12 at eps = 20 and 30, 2 without "
    "noise; best test accuracy 0.466 / 0.635 / 0.678 / 0.747.",
)


def _t_l(run) -> int:
    return int(json.loads(final(run, "policy_state"))["T_l"])


def _stats(rs, name):
    return mean_std([float(final(r, name)) for r in rs])


def _section(opts: Options, m: Mechanism) -> tuple[str, dict]:
    dp = group(
        runs(sweep(opts, f"fu_tuning_e-{m.name}", m.scenario, {"fu_tuning.local_iters": m.grid})),
        "fu_tuning.local_iters",
    )
    ref = group(
        runs(
            sweep(
                opts,
                f"fu_tuning_e-{m.name}-noise_free",
                m.scenario,
                {"fu_tuning.local_iters": m.reference},
                ["dp.epsilon=inf"],
            )
        ),
        "fu_tuning.local_iters",
    )
    loss = {E: _stats(dp[(str(E),)], "test_loss") for E in m.grid}
    acc = {E: _stats(dp[(str(E),)], "test_accuracy") for E in m.grid}
    best_loss = min(m.grid, key=lambda E: loss[E][0])
    best_acc = max(m.grid, key=lambda E: acc[E][0])
    E_star = m.predicted
    rows = []
    for E in m.grid:
        rs = dp[(str(E),)]
        marks = [
            s
            for s, on in (
                ("predicted T^(z/(z+1))", E == E_star),
                ("lowest loss", E == best_loss),
                ("highest accuracy", E == best_acc),
            )
            if on
        ]
        noise_free = (
            fmt(*_stats(ref[(str(E),)], "test_loss")) + " / " + fmt(*_stats(ref[(str(E),)], "test_accuracy"))
            if (str(E),) in ref
            else ""
        )
        rows.append(
            [
                E,
                len(rs[0].table("rounds")),
                _t_l(rs[0]),
                f"{float(final(rs[0], 'sigma')):.3g}",
                fmt(*loss[E]),
                fmt(*acc[E]),
                noise_free,
                ", ".join(marks),
            ]
        )
    table = markdown_table(
        [
            "E",
            "T_g rounds",
            "T_l uploads",
            "noise scale",
            "final test loss",
            "final test accuracy",
            "noise-free loss / accuracy",
            "",
        ],
        rows,
    )
    ratio = best_loss / E_star
    near = 0.5 <= ratio <= 2.0
    within = abs(loss[E_star][0] - loss[best_loss][0]) <= max(loss[E_star][1], loss[best_loss][1])
    n_seeds = len(dp[(str(m.grid[0]),)])
    per_seed: dict[int, tuple[int, float]] = {}  # seed -> (E with the lowest final loss of that seed's runs)
    for E in m.grid:
        for r in dp[(str(E),)]:
            assert r.seed is not None  # a sweep's run directories are .../seed=S/
            v = float(final(r, "test_loss"))
            if r.seed not in per_seed or v < per_seed[r.seed][1]:
                per_seed[r.seed] = (E, v)
    seed_best = [per_seed[s][0] for s in sorted(per_seed)]
    verdict = (
        f"Predicted E* = round({m.T}^({Z[m.name]}/{Z[m.name] + 1})) = {E_star}; our lowest mean final loss is "
        f"at E = {best_loss} ({fmt(*loss[best_loss])}, {n_seeds} seeds), highest accuracy at E = {best_acc}; "
        f"seed by seed the lowest loss is at E = {', '.join(map(str, seed_best))}. "
        f"The minimiser is {'within' if near else 'outside'} a factor 2 of the prediction, and the loss "
        f"at E* is {fmt(*loss[E_star])}, {'within' if within else 'more than'} one standard deviation "
        f"{'of' if within else 'from'} the minimum."
    )
    head = (
        f"### {m.name.capitalize()} mechanism (z = {Z[m.name]}), T = {m.T}, scenario `{m.scenario}`\n\n"
        f"Paper: {m.paper}\n\n"
    )
    return head + table + "\n" + verdict + "\n", {
        "best": best_loss,
        "seed_best": seed_best,
        "predicted": E_star,
        "near": near,
        "within": within,
    }


EXPLAIN = """\
### Reading the result

* **Laplace (z = 2): agrees.** With every client in every round (b = N, the paper's Fig. 7),
  T_l = T_g = T/E, so the Laplace scale T_l eta E xi / eps = T eta xi / eps is the same for every E
  (the "noise scale" column) while the number of noisy aggregations T_g = T/E falls: the noise
  term of eq. 4 is O(T/E). Small E is ruinous (E = 1 ends an order of magnitude above the noise-free loss),
  and the loss falls steeply up to E ~ T^(2/3) = 24, where the mean is lowest. Beyond it the
  drift term O(E^2/T) should take over; our curve is flat within the seed spread from E = 15 to
  E = 120 (the seeds put their minima at different E there), so the data confirm the side of
  the optimum the theory is about (too small an E) but cannot locate it more sharply than
  "E >= 15" -- a linear model drifts little even at E = T.
* **Gaussian (z = 1): disagrees with E = T^(1/2), agrees with the paper's own eq. 4.** For the
  Gaussian mechanism T_l = b T_g / N and the std grows as sqrt(T_l) E, so the summed noise
  variance over the T_g rounds, T_g sigma^2 / b, is the same for every E while T_l >= 1: eq. 4's
  noise term is O(E^(1-z) T^(z-1)) = O(1) for z = 1, independent of E, and only the drift /
  progress term depends on E. The optimum is then the smallest E, which is what we see with and
  without noise (lowest loss and highest accuracy at E = 1 in both). The T^(1/2) rule comes from
  setting the derivative of O(E^2/T) + O(E^(1-z) T^(z-1)) to zero after dropping the (1 - z)
  factor, which is 0 for z = 1; Thm 5's own remark ("if we set E = O(1), Y_T will converge to
  O(1)") and the proof of Thm 4 point to small E too. Once T_l reaches its floor of 1 (E >= 24
  here: b T_g / N = 24 / E), the std grows as E and large E loses outright (E = 48). Fu et al.'s
  Table IV finds E* = 12-24 with noise on FEMNIST with a CNN (E* = 2 without); the paper gives
  no learning rate or decay and no code, so we cannot tell whether their larger E* comes from the
  CNN's optimisation (more local steps per noisy upload at a decaying rate) or from the
  experiment; it does not follow from their eq. 4.
* **What we cannot match.** The paper's data (Lending Club, FEMNIST), its CNN and its client
  counts (5000 / 3500) are out of reach on two cores; eps is rescaled by sqrt(b_paper / b_ours)
  so that the per-round averaged noise is comparable (scenario headers). The paper's absolute
  losses and accuracies are therefore not comparable to ours; only the location of the optimum is.
* **No public code.** We found no public implementation of Fu et al. (searched by title and
  arXiv id 2101.04163), so every setting the paper leaves open is ours and is named in the
  scenario files.
"""


def report(opts: Options) -> str:
    parts = [
        "## Fu et al.: E-tuning, Laplace (z = 2) vs Gaussian (z = 1)\n\n",
        "Claim (Thm 4-5, Sec. V case study): for T total local iterations the final loss is "
        "minimised near E = T^(z/(z+1)) local iterations per round: T^(2/3) for Laplace, T^(1/2) "
        "for Gaussian. We sweep E at the paper's T and compare where our final test loss "
        "(mean ± std over seeds " + ",".join(map(str, opts.seeds)) + ") is lowest.\n\n",
    ]
    verdicts = {}
    for m in (LAPLACE, GAUSSIAN):
        text, verdicts[m.name] = _section(opts, m)
        parts.append(text + "\n")
    summary = [
        [m, v["predicted"], v["best"], ", ".join(map(str, v["seed_best"])), "yes" if v["near"] or v["within"] else "no"]
        for m, v in verdicts.items()
    ]
    parts.append(
        "### Summary\n\n"
        + markdown_table(
            [
                "mechanism",
                "predicted E*",
                "lowest mean loss at E",
                "lowest loss per seed at E",
                "agrees (within x2, or E* within 1 std of the minimum)",
            ],
            summary,
        )
        + "\n"
    )
    parts.append(EXPLAIN)
    return "".join(parts)

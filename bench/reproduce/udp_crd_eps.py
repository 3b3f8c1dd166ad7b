"""Wei et al. (IEEE TMC 2021), Sec. 5.4, Figs. 8(b) / 9(b): UDP with communication-rounds
discounting (Alg. 2) is at least as good as UDP with a fixed horizon (Alg. 1) over the paper's
privacy levels eps in [4, 20]; plus eps = 0.5, below the paper's range, where the noise matters.

One sweep of dp.epsilon x udp_crd.crd over the seeds (scenarios/paper/udp_crd_fmnist.yaml).
"""

from __future__ import annotations

import json

from bench.reproduce.common import (
    Options,
    column,
    final,
    fmt,
    group,
    markdown_table,
    mean_std,
    runs,
    sweep,
)

EPSILONS = [0.5, 4, 20]  # the paper's range is 4..20 (Figs. 8-9); 0.5 is below it
LR, LR_EPS = 0.5, 4  # the sensitivity run: a learning rate at which the model converges early
SCENARIO = "paper/udp_crd_fmnist.yaml"


def _discounts(run) -> int:
    return sum(bool(json.loads(s).get("discounted")) for s in column(run, "rounds", "policy_state"))


def _vals(rs, fn):
    return mean_std([float(fn(r)) for r in rs])


HEADER = [
    "setting",
    "UDP sigma (eq. 10)",
    "UDP lowest-loss round",
    "UDP final loss",
    "CRD final loss",
    "UDP final acc %",
    "CRD final acc %",
    "CRD rounds",
    "CRD discounts",
    "CRD - UDP accuracy (paired)",
    "CRD at least as good",
]


def _row(label: str, udp: list, crd: list) -> tuple[list, bool]:
    u_acc = {r.seed: float(final(r, "test_accuracy")) for r in udp}
    gains = [float(final(r, "test_accuracy")) - u_acc[r.seed] for r in crd if r.seed in u_acc]
    gm, gs = mean_std(gains)
    ok = gm >= 0 or abs(gm) <= gs  # the paired accuracy gain is not negative beyond its own spread
    return [
        label,
        f"{float(final(udp[0], 'sigma')):.3g}",
        fmt(*_vals(udp, lambda r: min(enumerate(column(r, "rounds", "test_loss")), key=lambda x: x[1])[0])),
        fmt(*_vals(udp, lambda r: final(r, "test_loss"))),
        fmt(*_vals(crd, lambda r: final(r, "test_loss"))),
        fmt(*_vals(udp, lambda r: 100 * final(r, "test_accuracy"))),
        fmt(*_vals(crd, lambda r: 100 * final(r, "test_accuracy"))),
        fmt(*_vals(crd, lambda r: len(column(r, "rounds", "round")))),
        fmt(*_vals(crd, _discounts)),
        (
            f"{fmt(100 * gm, 100 * gs)} pts ({sum(x > 0 for x in gains)}+ / {sum(x < 0 for x in gains)}- / "
            f"{sum(x == 0 for x in gains)}= seeds)"
        ),
        "yes" if ok else "no",
    ], ok


def report(opts: Options) -> str:
    g = group(
        runs(sweep(opts, "udp_crd_eps", SCENARIO, {"dp.epsilon": EPSILONS, "udp_crd.crd": ["false", "true"]})),
        "dp.epsilon",
        "udp_crd.crd",
    )
    rows, verdicts = [], {}
    for eps in EPSILONS:
        label = f"eps = {eps:g}" + ("" if 4 <= eps <= 20 else " (below the paper's range)")
        row, verdicts[eps] = _row(label, g[(str(eps), "false")], g[(str(eps), "true")])
        rows.append(row)
    # Sensitivity: the paper gives no learning rate; at lr = 0.5 the model converges within the
    # horizon and fixed-T UDP keeps adding noise after that, the situation CRD is designed for.
    lr = group(
        runs(
            sweep(
                opts,
                "udp_crd_eps-lr0.5",
                SCENARIO,
                {"udp_crd.crd": ["false", "true"]},
                [f"dp.epsilon={LR_EPS}", f"dp.lr={LR}"],
            )
        ),
        "udp_crd.crd",
    )
    lr_row, lr_ok = _row(f"eps = {LR_EPS:g}, lr = {LR:g} (sensitivity)", lr[("false",)], lr[("true",)])
    in_range = [e for e in EPSILONS if 4 <= e <= 20]
    return (
        "## Wei et al.: UDP with communication-rounds discounting vs fixed T\n\n"
        "Claim (Sec. 5.4, Figs. 8-9): Algorithm 2 (CRD, beta = 0.9) is at least as good as Algorithm 1 "
        '(fixed T = 200) at every privacy level eps in {4, 8, 12, 16, 20}, and "can greatly improve the '
        'convergence performance". Paper: MNIST, 256-unit MLP, U = 50, K = 30. Ours: FashionMNIST '
        "(MNIST is not on this machine), logistic regression, U = 10, K = 6, |D_i| = 800, lr 0.02 and "
        "C = 1.8 from the authors' code (scenario header). Final values, mean ± std over seeds "
        + ",".join(map(str, opts.seeds))
        + "; the accuracy difference is paired by seed.\n\n"
        + markdown_table(HEADER, rows + [lr_row])
        + "\n"
        + f"Over the paper's range (eps = {', '.join(f'{e:g}' for e in in_range)}) with the authors' lr = 0.02, "
        + (
            "CRD is at least as good as fixed-T UDP at every eps"
            if all(verdicts[e] for e in in_range)
            else "CRD is worse than fixed-T UDP at some eps"
        )
        + f"; at lr = {LR:g} (eps = {LR_EPS:g}) it is "
        + ("at least as good" if lr_ok else "worse")
        + ".\n\n"
        + EXPLAIN
    )


EXPLAIN = """\
### Reading the result

* **At the paper's eps the discount never fires, so CRD ties.** eq. 13 bounds a full-batch
  step's sensitivity by 2 eta C / |D_i| = 2 * 0.02 * 1.8 / 800 = 9e-5, and eq. 10 gives
  sigma = 9e-5 sqrt(2 q T ln(1/delta)) / eps = 3.7e-3 / eps per coordinate (9e-4 at eps = 4).
  Averaged over K = 6 uploads that is 3.7e-4 per round, and its random walk over 200 rounds
  (about 5e-3) stays small next to the weights learned. The test loss falls by more than
  zeta = 0.001 every round, so V(w_t) - V(w_t+1) < zeta never holds and Algorithm 2 runs
  Algorithm 1 round for round (same seeds, same draws): "at least as good" holds as a tie, the
  paper's large gains do not appear. eps = 8, 12, 16 lie between two settings with no discount
  at all (the noise falls as 1 / eps), so we did not run them.
* **Where the discount fires, it costs accuracy.** Below the paper's range (eps = 0.5) and at a
  faster learning rate (lr = 0.5, eps = 4; the paper gives none) CRD discounts 11-17 times and
  stops after 80-100 rounds, 4-7 points below fixed-T UDP. In both, UDP's test loss is still
  falling at round 200 (its lowest-loss round is the last or nearly): 200 rounds are not past
  the optimal T, so every round CRD removes is progress lost, while the noise it saves was not
  what limited the model. The trigger reacts to per-round improvements below zeta, which a
  slowly converging or slightly noisy model produces long before more rounds start to hurt.
  CRD can only win where fixed-T UDP's loss turns up before T (the convex loss-vs-T curves of the
  paper's Figs. 5-6); we do not reach that regime at eps >= 0.5 with |D_i| = 800, and the paper's
  own eq. 10 noise at its eps is too small to create it for this task.
* **The authors' code differs from Algorithm 2** (github.com/AdamWei-boop/Federated-Learning-
  with-Local-Differential-Privacy, Privacy.py `Adjust_T`, `Privacy_account`): it discounts when
  the *training* loss of the previous round did not fall at all (zeta = 0, one round late),
  sets T = ceil(0.8 T) rather than floor(beta (T - t)) + t, and runs T + 1 rounds (it stops
  after the round whose index reaches T, and eq. 25's T - t counts that extra round); its clients take
  minibatch steps (local_bs = 128, about 7 per round) while the noise is calibrated with
  eq. 13's full-batch sensitivity, and it tests on 512 samples. Its eq. 10 noise
  (`Privacy_account`: 2 lr C / |D_i| * sqrt(2 q T ln(1/delta)) / eps) is ours exactly. We follow
  the paper (test loss, zeta, eq. 25, one full-batch step).
"""

"""Wei et al. (IEEE TMC 2021), Sec. 5.4, Figs. 8(b) / 9(b): UDP with communication-rounds
discounting (Alg. 2) is at least as good as UDP with a fixed horizon (Alg. 1) over the paper's
privacy levels eps in [4, 20]; plus eps = 0.5, below the paper's range, where the noise matters.

One sweep of dp.epsilon x udp_crd.crd over the seeds (scenarios/paper/udp_crd_fmnist.yaml).
"""
from __future__ import annotations

import json

from bench.reproduce.common import Options, column, final, fmt, group, markdown_table, mean_std, runs, sweep

EPSILONS = [0.5, 4, 20]          # the paper's range is 4..20 (Figs. 8-9); 0.5 is below it
SCENARIO = "paper/udp_crd_fmnist.yaml"


def _discounts(run) -> int:
    return sum(bool(json.loads(s).get("discounted")) for s in column(run, "rounds", "policy_state"))


def _vals(rs, fn):
    return mean_std([float(fn(r)) for r in rs])


def report(opts: Options) -> str:
    g = group(runs(sweep(opts, "udp_crd_eps", SCENARIO, {"dp.epsilon": EPSILONS, "udp_crd.crd": ["false", "true"]})),
              "dp.epsilon", "udp_crd.crd")
    rows, verdicts = [], {}
    for eps in EPSILONS:
        udp, crd = g[(str(eps), "false")], g[(str(eps), "true")]
        u_acc = {r.seed: float(final(r, "test_accuracy")) for r in udp}
        gains = [float(final(r, "test_accuracy")) - u_acc[r.seed] for r in crd if r.seed in u_acc]
        gm, gs = mean_std(gains)
        # "at least as good": the paired accuracy gain is not negative beyond its own spread
        ok = gm >= 0 or abs(gm) <= gs
        verdicts[eps] = ok
        rows.append([f"{eps:g}" + ("" if 4 <= eps <= 20 else " (below the paper's range)"),
                     f"{float(final(udp[0], 'sigma')):.3g}",
                     fmt(*_vals(udp, lambda r: final(r, "test_loss"))),
                     fmt(*_vals(crd, lambda r: final(r, "test_loss"))),
                     fmt(*_vals(udp, lambda r: 100 * final(r, "test_accuracy"))),
                     fmt(*_vals(crd, lambda r: 100 * final(r, "test_accuracy"))),
                     fmt(*_vals(crd, lambda r: len(column(r, "rounds", "round")))),
                     fmt(*_vals(crd, _discounts)),
                     f"{fmt(100 * gm, 100 * gs)} pts ({sum(x > 0 for x in gains)}+ / {sum(x < 0 for x in gains)}- / {sum(x == 0 for x in gains)}= seeds)",
                     "yes" if ok else "no"])
    table = markdown_table(
        ["eps", "UDP sigma (eq. 10)", "UDP final loss", "CRD final loss", "UDP final acc %", "CRD final acc %",
         "CRD rounds", "CRD discounts", "CRD - UDP accuracy (paired)", "CRD at least as good"], rows)
    in_range = [e for e in EPSILONS if 4 <= e <= 20]
    return ("## Wei et al.: UDP with communication-rounds discounting vs fixed T\n\n"
            "Claim (Sec. 5.4, Figs. 8-9): Algorithm 2 (CRD, beta = 0.9) is at least as good as Algorithm 1 "
            "(fixed T = 200) at every privacy level eps in {4, 8, 12, 16, 20}, and \"can greatly improve the "
            "convergence performance\". Paper: MNIST, 256-unit MLP, U = 50, K = 30. Ours: FashionMNIST "
            "(MNIST is not on this machine), logistic regression, U = 10, K = 6, |D_i| = 800, lr 0.02 and "
            "C = 1.8 from the authors' code (scenario header). Final values, mean ± std over seeds "
            + ",".join(map(str, opts.seeds)) + "; the accuracy difference is paired by seed.\n\n"
            + table + "\n"
            + f"Over the paper's range (eps = {', '.join(f'{e:g}' for e in in_range)}) CRD is "
            + ("at least as good as fixed-T UDP at every eps." if all(verdicts[e] for e in in_range)
               else "worse than fixed-T UDP at some eps.") + "\n\n" + EXPLAIN)


EXPLAIN = """\
### Reading the result

* **The noise at the paper's eps is tiny.** eq. 13 bounds a full-batch step's sensitivity by
  2 eta C / |D_i| = 2 * 0.02 * 1.8 / 800 = 9e-5, so eq. 10 gives sigma = 9e-5 sqrt(2 q T ln(1/delta)) / eps
  = 3.7e-3 / eps per coordinate: 9e-4 at eps = 4, against a per-round step of the weights of about
  eta * C / sqrt(d) = 4e-4 per coordinate averaged over K = 6 clients. The test loss then falls
  by more than zeta = 0.001 every round, the CRD trigger V(w_t) - V(w_t+1) < zeta never fires,
  and Algorithm 2 is Algorithm 1 round for round (same seeds, same draws): a tie, which the claim
  allows, but not the paper's large gains. CRD can only help when the noise makes later rounds
  useless, which at these eps needs a much noisier setting than the paper's eq. 10 gives for
  |D_i| = 800 (the eps = 0.5 row shows what CRD does once the noise matters).
* **The authors' code differs from Algorithm 2** (github.com/AdamWei-boop/Federated-Learning-
  with-Local-Differential-Privacy, Privacy.py `Adjust_T`): it discounts when the *training*
  loss of the previous round did not fall at all (zeta = 0, one round late) and sets
  T = ceil(0.8 T) rather than floor(beta (T - t)) + t; its clients take minibatch steps
  (local_bs = 128, about 7 per round) while the noise is calibrated with eq. 13's full-batch
  sensitivity. We follow the paper (test loss, zeta, eq. 25, one full-batch step).
"""

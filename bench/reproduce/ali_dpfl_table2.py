"""ALI-DPFL Table II, FashionMNIST, R_s = 1/2 R_c at epsilon = 2: the five fixed-tau rows and
ALI-DPFL, in the authors' code's setting (scenarios/paper/ali_dpfl_table2_fmnist.yaml), plus
ALI-DPFL with mu and Gamma as the paper's §IV-B defines them."""

from __future__ import annotations

from bench.reproduce.ali_dpfl import SCENARIO_DIR, rows_report
from bench.reproduce.common import Options, Point, run_points, runs

SCENARIO = f"{SCENARIO_DIR}/ali_dpfl_table2_fmnist.yaml"
SWEEP = "ali_dpfl_table2"
TAUS = (1, 2, 3, 5, 10)
PAPER_ESTIMATES = {"ali_dpfl.mu_estimate": "gradient", "ali_dpfl.gamma_estimate": "fixed"}
# Table II, FMNIST column under "R_s = 1/2 R_c, epsilon = 2" (best accuracy, mean of 3 runs).
PAPER = {
    "tau = 1": 81.64,
    "tau = 2": 83.20,
    "tau = 3": 82.60,
    "tau = 5": 82.25,
    "tau = 10": 78.23,
    "ALI-DPFL": 83.44,
    "ALI-DPFL (paper's mu, Gamma = 10)": 83.44,
}

EVIDENCE = """
#### What the authors' code does that the paper does not say (each confirmed in their files)

| # | setting | paper | authors' code (file) | effect |
|---|---|---|---|---|
| 1 | input normalisation | not stated | (x − 0.5)/0.5 (`dataset/generate_fmnist.py`) | `data.normalize=half` |
| 2 | clipping norm C | not stated | 0.1 (`-dpn` default, `system/main_ali_dpfl.py`) | `dp.clip=0.1` |
| 3 | model | Table V CNN, 26,010 parameters | FedAvgCNN, 582,026 parameters (`main_ali_dpfl.py`, `flcore/trainmodel/models.py`) | `model.name=cnn_fedavg`; d in eq. 9 is 22× larger |
| 4 | divisor of the noisy sum | the sampled batch size \\|B\\| (Alg. 1, line 10) | the fixed `batch_size` 64 (`DPSGD(minibatch_size=args.batch_size)`, `step_dp`) | `dp.batch_divisor=64`: a 204-sample client steps with 1/20 the noise of the expected-batch rule |
| 5 | empty Poisson batch | a step (the analysis assumes one) | skipped (`IIDBatchSampler` yields only non-empty batches, `clientbase.py`) | `dp.empty_batch=skip` |
| 6 | data split | not stated | train+test pooled (70,000), capped Dirichlet with `np.random.seed(1)`, 75/25 per client, accuracy over the union of the clients' test shares (`dataset_utils.py`, `serverbase.evaluate`) | `data.split=per_client`, `partition=dirichlet_capped`, `partition_seed=1`: the identical client files (tested) |
| 7 | reported accuracy | "average accuracy" | the best over rounds, mean of 3 runs (`utils/result_utils.py: average_data`) | the table's first column |
| 8 | Γ | 10 for Dir(0.05) (Sec. V-A) | \\|Σ p_i (loss after − before the last step)\\|, re-estimated every round; the 10 is never read (`serveralidpfl.aggregate_parameters`) | `ali_dpfl.gamma_estimate=loss_change` |
| 9 | μ | Σ p_i ‖∇F_i(w_i) − ∇F_i(w)‖/‖w_i − w‖ (§IV-B) | the "gradient" copies are models: Σ p_i ‖w_i after − before its last step‖ / ‖w_i − w_new‖ | `ali_dpfl.mu_estimate=last_step` |
| 10 | R_c | 317 at ε = 2 (classic conversion, Thm 2) | `get_max_steps` calls the improved conversion: 549 (`optimizers/utils/RDP`) | we use the printed R_c (classic, `dp.conversion=classic`): 314, exact (see `ali_dpfl_rc`) |
| 11 | fixed-τ baselines' privacy | ε = 2 for every row | the DPFL server has no R_c stop: R_s + 1 = 159 rounds of τ steps, i.e. ε = 1.72, 2.01, 2.29, 2.79, 3.81 (classic) for τ = 1, 2, 3, 5, 10 (`serverdpfl.train`) | we keep ε ≤ 2: τ = 3, 5, 10 stop after 104, 62, 31 rounds; `ali_dpfl_table2_no_stop` runs them for all R_s rounds, as their server does |
| 12 | minor | | sampling rate int(q n)/n; B̂ = int(q min n); τ* capped at 100; R_s + 1 rounds | not modelled (each below 2 % on its quantity) |

#### Checked against the authors' code itself (their repository at 3294e90, 2023-12-01, on this CPU)

- One client step (`python -m bench.reproduce.authors_step --authors PATH`): their FedAvgCNN and
  `DPSGD.step_dp`, given our weights and our sampled batch (client 5, 168 samples), move every
  layer as ours does to float rounding without noise (largest difference 1.4e-6 on a layer whose
  update has norm 0.033); with σ = 1.1 both noise parts have norm 0.655 = lr·σ·C/64·√d.
- Their DPFL run, τ = 1, this setting, one seed, 144 of its 159 aggregations (about 23 s a
  round on one CPU core; the run was cut off by the machine, not by their code). Accuracy
  (`rs_test_acc`, the metric the paper reports) against ours, mean ± sd over 3 seeds, after the
  same number of aggregations:

  | aggregations | 10 | 30 | 50 | 70 | 90 | 110 | 130 | 140 |
  |---|---|---|---|---|---|---|---|---|
  | theirs | 19.5 | 37.8 | 44.4 | 47.5 | 51.2 | 55.0 | 56.4 | 56.5 |
  | ours | 24.0 ± 5.2 | 31.4 ± 3.5 | 34.4 ± 0.3 | 40.8 ± 1.6 | 48.6 ± 0.8 | 52.0 ± 1.5 | 55.6 ± 0.9 | 57.3 ± 0.9 |

  Best over the 144 aggregations: theirs 57.3 %, ours 57.9 ± 1.4 %. Their run leads by 6–10
  points between aggregations 30 and 80 and the two meet by 130. Both end far below the
  paper's 81.6 % for this row: in the setting their files give, the authors' own code does not
  reach the paper's τ = 1 figure either (one seed).
- Their DPFL run, τ = 2 (`-li 2`), the same setting, one seed, all 159 rounds (about 20 s a
  round on one core); the crash that follows is their `save_results` opening a Windows path:

  | aggregations | 10 | 30 | 50 | 70 | 90 | 110 | 130 | 150 | 157 |
  |---|---|---|---|---|---|---|---|---|---|
  | theirs | 33.1 | 39.4 | 51.4 | 58.1 | 61.6 | 62.9 | 63.7 | 64.5 | 64.6 |
  | ours | 31.3 ± 9.5 | 37.1 ± 2.1 | 50.0 ± 0.5 | 58.0 ± 1.5 | 60.9 ± 1.1 | 62.4 ± 0.9 | 63.3 ± 1.2 | 63.8 ± 0.6 | 63.9 ± 0.6 |

  Best over the run: theirs 65.2 % (after 145 aggregations), ours 64.4 ± 0.4 % (157 rounds: the
  158th would pass ε = 2). The paper gives 83.2 % for this row, its best fixed τ: the authors'
  own code, in the setting its files give, ends 18 points below it, where ours does.
- Their ALI-DPFL run (`main_ali_dpfl.py -dpe 2.0`, the same setting and seed), its first 20
  rounds (stopped there): R_c = 549 (the improved conversion), B̂ = int(0.015 · 204) = 3, and in
  every round μ = 1.089–1.095, Γ = 0.10–0.15 and raw τ* = 1.234–1.238 (eq. 9), so τ = 1: the noise
  term σ²C²d/B̂² = 782 dominates both sides of eq. 9. Its accuracy equals their τ = 1 run's to
  the printed 4 decimals in all 20 rounds: their ALI-DPFL row is their τ = 1 row (57.3 % best,
  above). Ours with the same estimators, over all 158 rounds of all 3 seeds: μ = 1.088–1.089,
  Γ = 0.12–0.49, raw τ* = 1.237–1.270, so τ = 1 throughout, and our ALI-DPFL row equals our τ = 1 row. The paper's 83.44 % for
  ALI-DPFL, above its best fixed τ, is not what the authors' code computes in this setting: there
  ALI-DPFL is τ = 1, 8 points below their τ = 2.
- ALI-DPFL with the paper's own estimators instead (§IV-B: μ from each client's full-data
  gradients at its trained model and at the round's starting model, Γ = 10; the row "paper's mu"),
  3 seeds: μ rises with training from 1.08 to 21–22.5, and with Γ = 10 and T = 314 the term
  2ΓTμ of eq. 9 (6,280 μ) outgrows the noise term (782), so τ* climbs from 1 to 9–10 (mean
  6.6). The run spends R_c = 314 steps in 47–48 of its R_s = 158 rounds and stops on the
  privacy budget with its accuracy still rising (best = last round in every seed): 57.6 ± 0.1 %,
  between our τ = 5 and τ = 10 rows, 6.8 points below τ = 2. Neither estimator pair lifts
  ALI-DPFL above the best fixed τ here: the authors' keeps τ = 1, the paper's overshoots.
"""


def points(opts: Options) -> list[Point]:
    """Seed by seed, so an interrupted reproduction has whole seeds; the paper-estimate variant last."""
    out = []
    for seed in opts.seeds:
        out += [Point(SWEEP, SCENARIO, seed, {"policy": "fedavg_dp", "dp.tau": str(t)}) for t in TAUS]
        out.append(Point(SWEEP, SCENARIO, seed, {"policy": "ali_dpfl"}))
    out += [Point(SWEEP, SCENARIO, seed, {"policy": "ali_dpfl", **PAPER_ESTIMATES}) for seed in opts.seeds]
    return out


def row_of(run) -> str:
    if run.keys["policy"] == "fedavg_dp":
        return f"tau = {run.keys['dp.tau']}"
    return "ALI-DPFL (paper's mu, Gamma = 10)" if "ali_dpfl.mu_estimate" in run.keys else "ALI-DPFL"


def report(opts: Options) -> str:
    run_points(opts, points(opts))
    return (
        rows_report("Table II (FashionMNIST, R_s = 1/2 R_c, epsilon = 2)", PAPER, runs(opts.out / SWEEP), row_of)
        + EVIDENCE
    )

"""ALI-DPFL Table II, FashionMNIST, R_s = 1/2 R_c at epsilon = 2: the five fixed-tau rows and
ALI-DPFL, in the authors' code's setting (scenarios/paper/ali_dpfl_table2_fmnist.yaml)."""
from __future__ import annotations

from bench.reproduce.common import Options, Point, runs, run_points
from bench.reproduce.ali_dpfl import SCENARIO_DIR, rows_report

SCENARIO = f"{SCENARIO_DIR}/ali_dpfl_table2_fmnist.yaml"
SWEEP = "ali_dpfl_table2"
TAUS = (1, 2, 3, 5, 10)
# Table II, FMNIST column under "R_s = 1/2 R_c, epsilon = 2" (best accuracy, mean of 3 runs).
PAPER = {"tau = 1": 81.64, "tau = 2": 83.20, "tau = 3": 82.60, "tau = 5": 82.25, "tau = 10": 78.23,
         "ALI-DPFL": 83.44}


def points(opts: Options) -> list[Point]:
    """Seed by seed, so an interrupted reproduction has whole seeds."""
    out = []
    for seed in opts.seeds:
        out += [Point(SWEEP, SCENARIO, seed, {"policy": "fedavg_dp", "dp.tau": str(t)}) for t in TAUS]
        out.append(Point(SWEEP, SCENARIO, seed, {"policy": "ali_dpfl"}))
    return out


def row_of(run) -> str:
    return "ALI-DPFL" if run.keys["policy"] == "ali_dpfl" else f"tau = {run.keys['dp.tau']}"


def report(opts: Options) -> str:
    run_points(opts, points(opts))
    return rows_report("Table II (FashionMNIST, R_s = 1/2 R_c, epsilon = 2)", PAPER,
                       runs(opts.out / SWEEP), row_of)

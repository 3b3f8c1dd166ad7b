"""FedCS (Nishio & Yonetani, ICC 2019) against random selection on real cellular links
(emulator/scenarios/cellular.yaml: Mahimahi LTE traces, throttling phones, diurnal availability,
1.5 s deadline), 4 clients a round, 100 rounds: FedCS's claim is more on-time updates per round
and a target accuracy in less virtual time than random selection with the same deadline.

Two data settings: the scenario's own Synthetic(1, 1), whose clients label by their own models
(the pooled test set caps accuracy near 0.6 whoever is chosen), and FashionMNIST IID with the
Table V CNN, where what a round delivers is what counts. Time to a target is read off the
seed-mean curve of test accuracy against virtual time (the accuracy of the last evaluated round
ended by t), and per seed.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from analysis.summary import run_numbers
from bench.reproduce.common import Options, Point, column, fmt, markdown_table, mean_std, run_points, runs

SWEEP = "fedcs_cellular"
POLICIES = {"fedcs": "FedCS", "fedavg_dp": "random (uniform)"}
COMMON = ["clients.per_round=4", "clients.select=uniform", "budget.rounds=100"]
SETTINGS = {  # data.dataset -> (its other overrides, targets)
    "synthetic": ([], (0.4, 0.5)),
    "fashion_mnist": (["model.name=cnn_fmnist", "data.partition=iid"], (0.6, 0.65, 0.7)),
}
GRID_S = np.arange(0.0, 200.0, 0.5)  # virtual seconds at which the curves are read


def points(opts: Options) -> list[Point]:
    return [
        Point(SWEEP, "cellular.yaml", seed, {"data.dataset": data, "policy": policy}, [*COMMON, *extra])
        for seed in opts.seeds
        for data, (extra, _) in SETTINGS.items()
        for policy in POLICIES
    ]


def curve(run) -> np.ndarray:
    """Test accuracy known at each GRID_S time: the last evaluated round that ended by then (0 before)."""
    acc = np.array(column(run, "rounds", "test_accuracy"), dtype=float)
    ends = np.array(column(run, "rounds", "t_end"), dtype=float)[~np.isnan(acc)]
    acc = acc[~np.isnan(acc)]
    k = np.searchsorted(ends, GRID_S, side="right") - 1
    return np.where(k >= 0, acc[np.maximum(k, 0)], 0.0)


def time_to(values: np.ndarray, target: float) -> float:
    hit = np.flatnonzero(values >= target)
    return float(GRID_S[hit[0]]) if len(hit) else math.inf


def per_round(run, name: str) -> float:
    return statistics.fmean(column(run, "rounds", name))


def round_length(run) -> float:
    return statistics.fmean(e - s for s, e in zip(column(run, "rounds", "t_start"), column(run, "rounds", "t_end")))


def _seed_time(run, target: float) -> float:
    """One seed's virtual time to the target: the end of its first round at or above it (analysis's rule)."""
    t = run_numbers(run, target).time_to_target_s
    return math.inf if math.isnan(t) else t


def _s(t: float) -> str:
    return "not reached" if math.isinf(t) else f"{t:.1f} s"


def report(opts: Options) -> str:
    run_points(opts, points(opts))
    done = [r for r in runs(opts.out / SWEEP) if r.status == "complete"]
    parts = [f"# FedCS vs random selection on cellular.yaml ({', '.join(COMMON)})\n"]
    for data, (_, targets) in SETTINGS.items():
        header = ["policy", "seeds", "on time / round", "late / round", "round length (s)", "final acc %"]
        header += [f"time to {t:.0%} (seed-mean curve)" for t in targets]
        header += [f"time to {t:.0%} per seed" for t in targets]
        rows = []
        for policy, label in POLICIES.items():
            rs = [r for r in done if r.keys.get("data.dataset") == data and r.keys.get("policy") == policy]
            if not rs:
                continue
            mean_curve = np.mean([curve(r) for r in rs], axis=0)
            row = [
                label,
                len(rs),
                fmt(*mean_std([per_round(r, "arrived") for r in rs])),
                fmt(*mean_std([per_round(r, "late") for r in rs])),
                fmt(*mean_std([round_length(r) for r in rs])),
                fmt(*mean_std([100 * column(r, "rounds", "test_accuracy")[-1] for r in rs])),
            ]
            row += [_s(time_to(mean_curve, t)) for t in targets]
            row += [", ".join(_s(_seed_time(r, t)).removesuffix(" s") for r in rs) for t in targets]
            rows.append(row)
        parts.append(f"## {data}\n\n" + markdown_table(header, rows))
    return "\n".join(parts)

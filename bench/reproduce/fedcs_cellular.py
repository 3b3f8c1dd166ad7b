"""FedCS (Nishio & Yonetani, ICC 2019) against random selection on real cellular links
(scenarios/cellular.yaml: Mahimahi LTE traces, throttling phones, diurnal availability,
1.5 s deadline), 4 clients a round, 100 rounds: FedCS's claim is more on-time updates per round
and a target accuracy in less virtual time than random selection with the same deadline.

Two data settings: the scenario's own Synthetic(1, 1), whose clients label by their own models
(the pooled test set caps accuracy near 0.6 whoever is chosen), and FashionMNIST IID with the
Table V CNN, where what a round delivers is what counts. Time to a target is read off the
seed-mean curve of test accuracy against virtual time (the accuracy of the last evaluated round
ended by t), and per seed.
"""

from __future__ import annotations

import statistics

import numpy as np

from bench.reproduce.common import (
    Options,
    Point,
    accuracy_curve,
    column,
    fmt,
    markdown_table,
    mean_std,
    run_points,
    runs,
    seconds,
    seed_time,
    time_to,
)

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


def per_round(run, name: str) -> float:
    return statistics.fmean(column(run, "rounds", name))


def round_length(run) -> float:
    return statistics.fmean(e - s for s, e in zip(column(run, "rounds", "t_start"), column(run, "rounds", "t_end")))


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
            mean_curve = np.mean([accuracy_curve(r, GRID_S) for r in rs], axis=0)
            row = [
                label,
                len(rs),
                fmt(*mean_std([per_round(r, "arrived") for r in rs])),
                fmt(*mean_std([per_round(r, "late") for r in rs])),
                fmt(*mean_std([round_length(r) for r in rs])),
                fmt(*mean_std([100 * column(r, "rounds", "test_accuracy")[-1] for r in rs])),
            ]
            row += [seconds(time_to(mean_curve, t, GRID_S)) for t in targets]
            row += [", ".join(seconds(seed_time(r, t)).removesuffix(" s") for r in rs) for t in targets]
            rows.append(row)
        parts.append(f"## {data}\n\n" + markdown_table(header, rows))
    return "\n".join(parts)

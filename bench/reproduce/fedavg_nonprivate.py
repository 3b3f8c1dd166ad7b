"""Sanity check: non-private FedAvg on IID FashionMNIST with the papers' CNN (ALI-DPFL Table V)
must reach the accuracy a centralised run of that CNN reaches (~90 %) within a few dozen rounds.
Ten clients, every one each round, 50 local SGD steps at q = 0.01 (about 60 samples a step),
eta = 0.05, standard input normalisation."""

from __future__ import annotations

from typing import Any

from bench.reproduce.common import (
    Options,
    Point,
    column,
    markdown_table,
    mean_std,
    pct,
    run_points,
    runs,
)

SWEEP = "fedavg_nonprivate"
TARGET = 0.85
SCENARIO = "paper/fedavg_nonprivate_fmnist.yaml"


def report(opts: Options) -> str:
    run_points(opts, [Point(SWEEP, SCENARIO, s) for s in opts.seeds])
    rows: list[list[Any]] = []  # seed, final %, best %, first round at TARGET (or why none)
    for r in runs(opts.out / SWEEP):
        acc = column(r, "rounds", "test_accuracy")
        first = next((i + 1 for i, a in enumerate(acc) if a >= TARGET), None)
        rows.append([r.seed, pct(acc[-1]), pct(max(acc)), first or f"not within {len(acc)}"])
    finals = mean_std([float(row[1]) / 100 for row in rows])
    spread = finals[1] if len(rows) > 1 else None
    return (
        "### Non-private FedAvg, IID FashionMNIST, Table V CNN (target: >= 85 % within 30 rounds)\n\n"
        + markdown_table(["seed", "final acc. %", "best acc. %", f"first round >= {100 * TARGET:.0f} %"], rows)
        + f"\nFinal accuracy over {len(rows)} seed(s): {pct(finals[0], spread)} %.\n"
    )

"""FashionMNIST through the full emulator: non-private vs DP-SGD at epsilon = 2.

    python bench/fmnist_accuracy.py [rounds=30] [workers=2]

10 clients, IID, the ALI-DPFL Table V CNN, no link constraints. Prints the test accuracy
after each run and the wall time. Needs the IDX files (apt-get install dataset-fashion-mnist).
"""

from __future__ import annotations

import sys
import tempfile
import time

from emulator.config import load
from emulator.output.results import read_table
from emulator.run.lifecycle import run

COMMON = [
    "data.dataset=fashion_mnist",
    "data.partition=iid",
    "model.name=cnn_fmnist",
    "clients.n=10",
    "output.progress=false",
    "dp.tau=20",
]
SETTINGS = {
    "non-private (sigma=0, no clipping)": ["dp.sigma=0", "dp.clip=0", "dp.q=0.01", "dp.lr=0.1"],
    # ALI-DPFL's defaults: q=0.015, sigma=1.1, eta=0.5, delta=1e-5; R_c = 553 steps at epsilon=2
    "DP-SGD, epsilon=2": ["dp.sigma=1.1", "dp.clip=1.0", "dp.q=0.015", "dp.lr=0.5", "dp.epsilon=2"],
}


def main(argv: list[str]) -> None:
    opts = dict(a.split("=", 1) for a in argv)
    rounds, workers = opts.get("rounds", "30"), opts.get("workers", "2")
    for label, overrides in SETTINGS.items():
        with tempfile.TemporaryDirectory() as tmp:
            cfg = load(
                None, [*COMMON, *overrides, f"budget.rounds={rounds}", f"workers={workers}", f"output.dir={tmp}"]
            )
            t0 = time.perf_counter()
            rd = read_table(run(cfg), "rounds").to_pylist()
            wall = time.perf_counter() - t0
        acc = [r["test_accuracy"] for r in rd]
        first80 = next((r["round"] + 1 for r in rd if r["test_accuracy"] >= 0.8), None)
        print(
            f"{label:36s} rounds={len(rd):3d} final={acc[-1]:.4f} best={max(acc):.4f} "
            f"first>=80% at round {first80} max_eps={rd[-1]['max_epsilon']:.3f} wall={wall:.0f}s",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])

"""Wall-time overhead of the emulator vs. the same local training in one process.

    python bench/overhead.py [clients=10] [rounds=20] [workers=2]

Runs a scenario through the full emulator (server + worker processes, ZeroMQ, SimPy,
Parquet), then performs the same local DP-SGD steps (same tasks, same trainer, FedAvg)
sequentially in this process, and prints both wall times and their ratio.
"""

from __future__ import annotations

import sys
import tempfile
import time

import numpy as np
import torch

from emulator.aggregate.impact import impact_factors
from emulator.config import load
from emulator.run.lifecycle import run
from nodes.contracts.tasks import ClientTask
from nodes.data import load_federated
from nodes.training.trainer import build_trainer, state_to_numpy


def main(argv: list[str]) -> None:
    opts = dict(a.split("=", 1) for a in argv)
    n, rounds, workers = int(opts.get("clients", 10)), int(opts.get("rounds", 20)), int(opts.get("workers", 2))
    overrides = [
        f"clients.n={n}",
        f"budget.rounds={rounds}",
        f"workers={workers}",
        "output.progress=false",
        "model.name=mlp",
        "model.hidden=200",
        "dp.tau=5",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load(None, [*overrides, f"output.dir={tmp}"])
        t0 = time.perf_counter()
        run(cfg)
        emulated = time.perf_counter() - t0

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    data = load_federated(cfg.data, cfg.clients.n, cfg.seed)
    trainer = build_trainer(cfg, data, torch.device("cpu"))
    weights = state_to_numpy(trainer.model)
    p = impact_factors(cfg.impact, 0, data.sizes)
    dp = cfg.dp
    for rnd in range(rounds):
        updates = [trainer.train(rnd, ClientTask.dp_sgd(c, dp), weights)[0] for c in range(n)]
        weights = {
            k: sum(p[c] * updates[c][k].astype(np.float64) for c in range(n)).astype(np.float32) for k in weights
        }
    local = time.perf_counter() - t0
    print(f"{n} clients x {rounds} rounds x {dp.tau} steps, {workers} workers")
    print(f"emulator (processes, ZeroMQ, SimPy, Parquet, startup included): {emulated:8.2f} s")
    print(f"same training in one process:                                  {local:8.2f} s")
    print(f"ratio emulator / single process:                               {emulated / local:8.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])

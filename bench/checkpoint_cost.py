"""Cost of the per-round checkpoint for the ALI-DPFL Table V CNN (26 010 parameters).

    python bench/checkpoint_cost.py [clients=10] [repeats=50]

Saves the global model plus the state an ali_dpfl run checkpoints (policy attributes, one RDP
ledger per client, link states) the way the server does after every round, and reports the
median wall time and the file size.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from emulator.config import load, policy_options, policy_settings
from emulator.output import checkpoint
from emulator.policies import POLICIES
from emulator.policies.base import RunContext
from nodes.training.models import build_model
from nodes.training.trainer import state_to_numpy


def main(argv: list[str]) -> None:
    opts = dict(a.split("=", 1) for a in argv)
    n, repeats = int(opts.get("clients", 10)), int(opts.get("repeats", 50))
    cfg = load(
        None,
        [
            "policy=ali_dpfl",
            "data.dataset=fashion_mnist",
            "model.name=cnn_fmnist",
            f"clients.n={n}",
            "dp.epsilon=2",
            "dp.q=0.015",
            "dp.sigma=1.1",
        ],
    )
    weights = state_to_numpy(build_model(cfg.model, (1, 28, 28), 10, cfg.seed))
    policy = POLICIES["ali_dpfl"](
        policy_options(POLICIES["ali_dpfl"], cfg),
        RunContext(
            settings=policy_settings(cfg), n_clients=n, data_sizes=[6000] * n, num_params=26010, rounds_budget=276
        ),
    )
    state = {"next_round": 1, "now": 0.0, "bytes_spent": 0, "links_bad": [], "policy": policy.state_dict()}
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            t0 = time.perf_counter()
            size = checkpoint.save(Path(tmp), weights, checkpoint.snapshot(state))
            times.append(time.perf_counter() - t0)
    print(
        f"Table V CNN, {n} clients: checkpoint {size} bytes, median {1000 * statistics.median(times):.2f} ms "
        f"(min {1000 * min(times):.2f}, max {1000 * max(times):.2f}) over {repeats} saves, fsync included"
    )


if __name__ == "__main__":
    main(sys.argv[1:])

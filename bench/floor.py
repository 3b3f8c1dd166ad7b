"""The floor of the W1 / W2 workloads: the emulator's local training and FedAvg in one process,
one thread, with no processes, sockets or clock.

    python -m bench.floor OVERRIDES...     (the floor in a fresh process: its imports included)
"""

from __future__ import annotations

import sys

import torch

from emulator.config import load
from emulator.impact import impact_factors, renormalise
from emulator.policies.base import fedavg, select_clients
from nodes.data import load_federated
from nodes.tasks import ClientResult, ClientTask
from nodes.trainer import Trainer, state_to_numpy


def floor(overrides: list[str]):
    """The same local training and FedAvg in this process, one thread, no processes, sockets or clock."""

    def go():
        cfg = load(None, overrides)
        torch.set_num_threads(1)
        data = load_federated(cfg.data, cfg.clients.n, cfg.seed)
        dp = cfg.dp
        # nodes.worker.build_trainer's trainer, without importing the worker's sockets into the floor
        trainer = Trainer(
            data,
            torch.device("cpu"),
            model=cfg.model,
            data_cfg=cfg.data,
            seed=cfg.seed,
            per_sample=dp.per_sample,
            batch_eval=dp.batch_eval,
            batch_divisor=dp.batch_divisor,
            empty_batch=dp.empty_batch,
        )
        weights = state_to_numpy(trainer.model)
        sizes = data.sizes
        for rnd in range(cfg.budget.rounds):
            chosen = select_clients(cfg, rnd, list(range(cfg.clients.n)))
            results = []
            for c in chosen:
                new, m = trainer.train(rnd, ClientTask.dp_sgd(c, dp), weights)
                results.append(ClientResult(c, new, int(m["steps"]), m["train_loss"], m["update_norm"], m))
            weights = fedavg(weights, results, renormalise(impact_factors(cfg.impact, rnd, sizes), chosen))

    return go


if __name__ == "__main__":
    floor(sys.argv[1:])()

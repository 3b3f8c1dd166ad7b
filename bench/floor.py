"""The floor of the W1 / W2 workloads: the emulator's local training and FedAvg in one process,
one thread, with no processes, sockets or clock.

    python -m bench.floor OVERRIDES...     (the floor in a fresh process: its imports included)
    python -m bench.floor --device cuda --evaluate [--scenario NAME] OVERRIDES...     (on a GPU, evaluating)

On a GPU the trainer is set up as a GPU worker's is (nodes.training.determinism), and `--evaluate` evaluates the
global model after the rounds the scenario's eval.every evaluates, as a run does; with dp.per_sample=hooks
its per-sample gradients are Opacus's own.
"""

from __future__ import annotations

import argparse
import time

from emulator.aggregate.impact import impact_factors, renormalise
from emulator.config import load, policy_settings
from emulator.policies.base import fedavg, select_clients
from emulator.run.evaluation import EvaluationSchedule
from nodes.contracts.tasks import ClientResult, ClientTask
from nodes.data import load_federated
from nodes.training.determinism import set_up_torch
from nodes.training.trainer import GlobalEvaluation, build_trainer, resolve_device, state_to_numpy


def floor(
    overrides: list[str],
    device: str = "cpu",
    evaluate: bool = False,
    scenario: str | None = None,
    round_walls: list[float] | None = None,
):
    """The same local training and FedAvg in this process, one thread, no processes, sockets or clock:
    on `device`, and with the global model evaluated where the run would evaluate it if `evaluate`;
    each round's wall seconds (training and aggregation) appended to `round_walls` if given."""

    def go():
        cfg = load(scenario, overrides)
        on = resolve_device(device)
        set_up_torch(on)
        data = load_federated(cfg.data, cfg.clients.n, cfg.seed)
        dp = cfg.dp
        trainer = build_trainer(cfg, data, on)
        evaluation = (
            GlobalEvaluation(data, on, model=cfg.model, seed=cfg.seed, batch_eval=dp.batch_eval) if evaluate else None
        )
        schedule = EvaluationSchedule(cfg.eval.every, cfg.budget.rounds, False)
        weights = state_to_numpy(trainer.model)
        sizes = data.sizes
        settings = policy_settings(cfg)
        for rnd in range(cfg.budget.rounds):
            start = time.perf_counter()
            chosen = select_clients(settings, rnd, list(range(cfg.clients.n)))
            results = []
            for c in chosen:
                new, m = trainer.train(rnd, ClientTask.dp_sgd(c, dp), weights)
                results.append(ClientResult(c, new, int(m["steps"]), m["train_loss"], m["update_norm"], m))
            weights = fedavg(weights, results, renormalise(impact_factors(cfg.impact, rnd, sizes), chosen))
            if round_walls is not None:
                round_walls.append(time.perf_counter() - start)
            if evaluation is not None and schedule.after(rnd):
                evaluation(weights)

    return go


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.floor", description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("overrides", nargs="*", help="the scenario's dotted overrides, as python -m emulator takes them")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    ap.add_argument("--evaluate", action="store_true", help="evaluate the global model as the run would")
    ap.add_argument("--scenario", help="a scenario's path or shipped name, as scenario= takes it")
    args = ap.parse_args(argv)
    floor(args.overrides, args.device, args.evaluate, args.scenario)()


if __name__ == "__main__":
    main()

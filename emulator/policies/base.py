"""The policy contract (Flower's Strategy, narrowed): configure a round, then aggregate it.

The runtime knows nothing about any one paper: it asks the policy for a `RoundPlan`,
delivers the `ClientResult`s that arrived on time, and reports the evaluation back.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Sequence

import numpy as np

from emulator.rng import stream

if TYPE_CHECKING:
    from emulator.config import Scenario


@dataclass
class ClientTask:
    """What one selected client is asked to do this round; its fields travel in the task message."""
    client: int
    steps: int
    lr: float
    sigma: float
    clip: float
    q: float

    def to_wire(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_wire(cls, d: dict) -> "ClientTask":
        names = {f.name: f.type for f in fields(cls)}
        if set(d) != set(names):
            raise ValueError(f"task params {sorted(d)} do not match {sorted(names)}")
        return cls(**{k: (int if names[k] in ("int", int) else float)(v) for k, v in d.items()})


@dataclass
class RoundPlan:
    tasks: list[ClientTask]                               # sorted by client id
    # Policy state recorded in `rounds` once the round is over, so aggregate() and observe()
    # may add to it (e.g. mu estimated from the round's updates).
    state: dict[str, float] = field(default_factory=dict)


@dataclass
class ClientResult:
    client: int
    weights: dict[str, np.ndarray]
    steps: int
    train_loss: float
    update_norm: float
    metrics: dict = field(default_factory=dict)   # everything the trainer reported


@dataclass
class RunContext:
    """What a policy may know about the run when it is built."""
    n_clients: int
    data_sizes: list[int]
    num_params: int
    rounds_budget: int     # R_s as derived from the round, byte and time budgets


def select_clients(cfg: "Scenario", rnd: int, eligible: Sequence[int]) -> list[int]:
    """Client selection: all, K-of-N uniform (per-round stream), or round-robin over client ids."""
    c = cfg.clients
    k = c.per_round or len(eligible)
    if c.select == "all" or k >= len(eligible):
        return sorted(eligible)
    if c.select == "uniform":
        pick = stream(cfg.seed, "select", rnd).choice(len(eligible), size=k, replace=False)
        return sorted(eligible[i] for i in pick)
    start = (rnd * k) % len(eligible)  # round_robin
    return sorted(eligible[(start + j) % len(eligible)] for j in range(k))


class Policy:
    name = "base"

    def __init__(self, cfg: "Scenario", ctx: RunContext):
        self.cfg, self.ctx = cfg, ctx

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        raise NotImplementedError

    def aggregate(self, rnd: int, global_weights: dict[str, np.ndarray], results: list[ClientResult],
                  factors: dict[int, float]) -> dict[str, np.ndarray]:
        """Weighted FedAvg: w = sum_i p_i w_i over the on-time results (factors sum to 1)."""
        if not results:
            return global_weights
        return {name: sum(factors[r.client] * r.weights[name].astype(np.float64) for r in results).astype(w.dtype)
                for name, w in global_weights.items()}

    def observe(self, rnd: int, test_loss: float, test_accuracy: float) -> None:
        """The server's evaluation after aggregation; adaptive policies react to it."""

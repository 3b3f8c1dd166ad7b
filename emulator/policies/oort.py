"""`oort` — Oort's guided participant selection (Lai et al., OSDI 2021, §4-5), each selected
client running the scenario's DP-SGD round as in `fedavg_dp`.

Utility of client i (eq. 2 and §5.1):  U_i = |B_i| sqrt(mean loss^2) * (T / t_i)^alpha if t_i > T,
with |B_i| its data size, the loss its last reported training loss (the trainer reports the
batch mean, which stands in for the root mean square), t_i its last observed round duration
(download start to upload end) or, before it has one, its estimate from its link and device,
and T the preferred round duration. A client that has not yet reported a loss is given the
mean of the reported ones. Each late or lost round among its last `window` multiplies U_i by
`penalty` (Oort's exclusion of unreliable clients, made soft).

Each round (§5.2), a share epsilon = max(explore_min, explore * explore_decay^round) of the
slots goes to clients never selected, drawn uniformly from stream(seed, "oort", round); the
rest go to the highest utilities (ties by id). Oort samples the exploited clients in proportion
to utility above a cut-off and adds a staleness bonus; this keeps the deterministic top-k.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from emulator.policies.base import Policy, RoundPlan, RunContext, dp_sgd_tasks
from emulator.policies.system import ClientInfo, histories
from emulator.timemodel.by_index import Without, positions
from emulator.timemodel.clock import Outcome
from nodes.contracts.rng import stream
from nodes.contracts.schema import MAX_ROUNDS, MAX_SECONDS, OPEN_UNIT, PROBABILITY, Range, setting

MISSES = (Outcome.LATE, Outcome.LOST_DOWN, Outcome.LOST_UP)  # the outcomes `penalty` counts


@dataclass
class OortConfig:
    alpha: float = setting(2.0, "straggler penalty exponent: utility x (T / t_i)^alpha when t_i > T")
    preferred_s: float = setting(0.0, "T, the preferred round duration, virtual seconds (0 = round.deadline_s)")
    explore: float = setting(0.9, "epsilon at round 0: the share of slots for clients never selected")
    explore_decay: float = setting(0.98, "epsilon is multiplied by this each round ...")
    explore_min: float = setting(0.3, "... down to this floor")
    penalty: float = setting(0.5, "utility factor for each late or lost round among a client's last `window`")
    window: int = setting(5, "a client's latest rounds that count towards `penalty`")
    RANGES: ClassVar[dict[str, Range]] = dict(
        alpha=Range(0, 100),
        preferred_s=Range(0, MAX_SECONDS),
        explore=PROBABILITY,
        explore_decay=OPEN_UNIT,
        explore_min=PROBABILITY,
        penalty=PROBABILITY,
        window=Range(1, MAX_ROUNDS),
    )


def statistical_utility(c: ClientInfo, default_loss: float) -> float:
    last = c.history.last_arrived()
    loss = last.train_loss if last is not None and math.isfinite(last.train_loss) else default_loss
    return c.data_size * abs(loss)


def speed_factor(duration_s: float, preferred_s: float, alpha: float) -> float:
    """(T / t)^alpha for a client slower than T, else 1 (Oort eq. 2)."""
    return (preferred_s / duration_s) ** alpha if duration_s > preferred_s else 1.0


class Oort(Policy):
    name = "oort"
    partial_work = True
    Options = OortConfig
    needs_client_view = True
    options_help = "policy=oort (Lai et al. 2021, utility-guided selection)"
    options: OortConfig

    def __init__(self, options: OortConfig, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        self.preferred_s = options.preferred_s or ctx.settings.deadline_s

    def utility(self, c: ClientInfo, default_loss: float) -> float:
        o = self.options
        last = c.history.last_arrived()
        duration = (
            last.duration_s
            if last is not None
            else c.estimated_round_s(self.ctx.task_bytes, self.ctx.settings.dp.tau, self.ctx.update_bytes)
        )
        misses = sum(h.outcome in MISSES for h in c.history[-o.window :])  # failed, implausible: no delay of its link
        return (
            statistical_utility(c, default_loss) * speed_factor(duration, self.preferred_s, o.alpha) * o.penalty**misses
        )

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        o = self.options
        clients = self.ctx.clients
        k = min(self.ctx.settings.per_round or len(eligible), len(eligible))
        epsilon = max(o.explore_min, o.explore * o.explore_decay**rnd)
        selected = histories(clients)  # no view made of a client never selected
        offered = set(eligible) if isinstance(eligible, list | tuple) else eligible  # a list is asked by a set
        seen = sorted(i for i in selected if i in offered)
        # the eligible never selected, without a list of them: eligible is in id order, seen's positions in it
        fresh = Without(eligible, positions(eligible, seen).tolist())
        n_explore = min(len(fresh), max(k - len(seen), round(epsilon * k)))
        explored = (
            [fresh[i] for i in stream(self.ctx.settings.seed, "oort", rnd).choice(len(fresh), n_explore, replace=False)]
            if n_explore
            else []
        )
        losses = [h.train_loss for i in seen if (h := selected[i].last_arrived()) is not None]
        default_loss = float(np.mean(losses)) if losses else 1.0
        ranked = sorted(seen, key=lambda i: (-self.utility(clients[i], default_loss), i))
        chosen = explored + ranked[: k - n_explore]
        return RoundPlan(
            tasks=dp_sgd_tasks(self.ctx.settings.dp, chosen),
            state={
                "tau": float(self.ctx.settings.dp.tau),
                "sigma": self.ctx.settings.dp.sigma,
                "explore": epsilon,
                "explored": n_explore,
            },
        )

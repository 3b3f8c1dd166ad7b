"""`adap_dpfl` — the Adap DP-FL baseline of ALI-DPFL §V: fixed tau local DP-SGD steps, and the
noise multiplier decays when the test loss has not decreased for `patience` (4) rounds.
Each task carries its round's sigma, so the RDP ledgers compose the changing sigma.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from emulator.policies.base import Policy, RoundPlan, RunContext, select_clients
from nodes.contracts.schema import MAX_ROUNDS, OPEN_UNIT, Range, setting
from nodes.contracts.tasks import ClientTask


@dataclass
class AdapDpflConfig:
    decay: float = setting(0.9, "the noise multiplier is multiplied by this, in (0, 1), when the loss stalls")
    patience: int = setting(4, "rounds without a new lowest test loss before sigma decays")
    RANGES: ClassVar[dict[str, Range]] = dict(decay=OPEN_UNIT, patience=Range(1, MAX_ROUNDS))


class AdapDpfl(Policy):
    name = "adap_dpfl"
    partial_work = True
    changes_sigma = True  # decays, at most once a round
    Options = AdapDpflConfig
    options_help = "policy=adap_dpfl (Adap DP-FL baseline)"
    state_keys = ("sigma", "best", "stalled")
    options: AdapDpflConfig

    def __init__(self, options: AdapDpflConfig, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        self.sigma = ctx.settings.dp.sigma
        self.best = math.inf
        self.stalled = 0  # rounds since the test loss last reached a new low

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        dp = self.ctx.settings.dp
        tasks = tuple(
            ClientTask.dp_sgd(i, dp, sigma=self.sigma) for i in select_clients(self.ctx.settings, rnd, eligible)
        )
        return RoundPlan(tasks=tasks, state={"tau": float(dp.tau), "sigma": self.sigma})

    def observe(self, rnd: int, test_loss: float, test_accuracy: float) -> dict[str, Any]:
        if test_loss < self.best:
            self.best, self.stalled = test_loss, 0
            return {}
        self.stalled += 1
        if self.stalled == self.options.patience:
            self.sigma *= self.options.decay
            self.stalled = 0
        return {}

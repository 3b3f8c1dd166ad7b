"""`fedavg_dp` — ALI-DPFL Algorithm 1: a fixed tau of local DP-SGD steps, weighted FedAvg."""

from __future__ import annotations

from collections.abc import Sequence

from emulator.policies.base import Policy, RoundPlan, dp_sgd_tasks, select_clients


class FedAvgDP(Policy):
    name = "fedavg_dp"
    partial_work = True
    buffered = True

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        dp = self.ctx.settings.dp
        tasks = dp_sgd_tasks(self.ctx.settings.dp, select_clients(self.ctx.settings, rnd, eligible, k=self.ctx.slots()))
        return RoundPlan(tasks=tasks, state={"tau": float(dp.tau), "sigma": dp.sigma})

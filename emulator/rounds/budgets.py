"""Round, byte, virtual-time and energy budgets, and R_s — the number of rounds the first three allow.

Bytes are checked before a round is committed, against the real sizes of every message the
round would put on the links, so the byte budget is never exceeded; the time budget caps the
round deadline, so virtual time never passes it; energy is checked once the clock has timed the
round, against its tasks' joules (emulator.energy), before it is committed, so the energy budget is
never exceeded either.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from emulator.timemodel.clock import Job, RoundTimeline
from emulator.timemodel.resources import ClientResources, Resources
from nodes.contracts.schema import BudgetConfig


class Budgets:
    def __init__(
        self,
        budget: BudgetConfig,
        resources: Iterable[ClientResources],
        *,
        task_bytes: int,
        update_bytes: int = 0,
        per_round: int,
        tau: int,
        deadline_s: float,
    ):
        """`per_round` clients a round (clients.per_round, or clients.n when it is 0), each taking `tau`
        steps (dp.tau) in rounds of at most `deadline_s` (round.deadline_s). An uncompressed update carries
        the broadcast's tensors, so `task_bytes` estimates both; a compressed one is `update_bytes`."""
        self.budget, self.deadline_s = budget, deadline_s
        self.bytes_spent = 0
        self.energy_spent = 0.0  # joules, summed round by round (a resumed run: the tables' rounds)
        up = update_bytes or task_bytes
        round_bytes = per_round * (task_bytes + up)
        if isinstance(resources, Resources):  # on its arrays, for a run of any size
            round_time = resources.slowest_round(task_bytes, tau, up)
        else:
            round_time = max(
                r.download_time(task_bytes, 0.0) + r.compute_time(tau, 0.0) + r.upload_time(up, 0.0) for r in resources
            )
        round_time = min(round_time, deadline_s)
        by_bytes = math.floor(budget.bytes / round_bytes) if math.isfinite(budget.bytes) else None
        by_time = math.floor(budget.time_s / round_time) if math.isfinite(budget.time_s) and round_time > 0 else None
        self.rounds = max(1, min(v for v in (budget.rounds, by_bytes, by_time) if v is not None))
        self.derivation = {
            "R_s": self.rounds,
            "rounds_budget": budget.rounds,
            "rounds_by_bytes": by_bytes,
            "rounds_by_time": by_time,
            "message_bytes": task_bytes,
            "clients_per_round": per_round,
            "bytes_per_round_estimate": round_bytes,
            "round_time_estimate_s": round_time,
            "rule": "R_s = min(budget.rounds, floor(budget.bytes / (clients_per_round * 2 * message_bytes)), "
            "floor(budget.time_s / min(deadline, slowest client's download + tau*step + upload)))",
        }
        if update_bytes:  # compressed updates: the key and the rule say so; uncompressed runs' stay as they were
            self.derivation["update_bytes"] = update_bytes
            self.derivation["rule"] = (
                "R_s = min(budget.rounds, floor(budget.bytes / (clients_per_round * (message_bytes + update_bytes))), "
                "floor(budget.time_s / min(deadline, slowest client's download + tau*step + compressed upload)))"
            )

    def exhausted_by(self, jobs: list[Job], now: float) -> str:
        """Why the round these jobs make must not run ('' when it may)."""
        if now >= self.budget.time_s:
            return f"time budget {self.budget.time_s} s reached"
        need = sum(j.bytes_down + j.bytes_up for j in jobs)
        if self.bytes_spent + need > self.budget.bytes:
            return (
                f"byte budget {self.budget.bytes:.0f} reached: {self.bytes_spent} spent, next round needs up to {need}"
            )
        return ""

    def energy_exhausted_by(self, joules: float | None) -> str:
        """Why a round whose tasks draw `joules` must not be committed ('' when it may; None: not modelled)."""
        if joules is None or self.energy_spent + joules <= self.budget.energy_j:
            return ""
        return (
            f"energy budget {self.budget.energy_j:g} J reached: {self.energy_spent:.6g} J spent, "
            f"the next round's tasks would draw {joules:.6g} J"
        )

    def deadline(self, now: float) -> float:
        return min(now + self.deadline_s, self.budget.time_s)

    def spend(self, tl: RoundTimeline, joules: float | None = None) -> None:
        """Charge a committed round's bytes, and its tasks' joules where energy is modelled."""
        self.bytes_spent += sum(c.bytes_down + c.bytes_up for c in tl.clients.values())
        if joules is not None:
            self.energy_spent += joules

    def time_exhausted(self, now: float) -> bool:
        return now >= self.budget.time_s

"""The rounds of one run: the emulated clients (`EmulatedSystem`) and the loop that plays synchronous
rounds on them (`RoundLoop`), which emulator.run.buffered's versions build on; emulator.run.lifecycle starts, resumes
and ends the run around it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

from emulator.aggregate.compression import Compression
from emulator.aggregate.impact import Impact
from emulator.aggregate.plausibility import UpdateBounds
from emulator.config import round_settings
from emulator.energy.model import Energy
from emulator.hooks import RoundHook
from emulator.policies import OutcomeLog, Policy
from emulator.policies.system import ClientViews, client_infos
from emulator.rounds.budgets import Budgets
from emulator.rounds.round import RoundNotPlayed, RoundRecord, play_round
from emulator.run.evaluation import EvaluationSchedule, Evaluator
from emulator.run.state import RunState, checkpoint_state
from emulator.timemodel.clock import Clock
from emulator.timemodel.resources import Resources, build_resources
from nodes.contracts.protocol import Message
from nodes.contracts.schema import Scenario
from nodes.contracts.tasks import Weights
from nodes.transport.dispatch import Reply


class Workers(Protocol):
    """WorkerPool.run_tasks: a round's (client, task message) pairs trained on the workers, and the server's
    own work (`meanwhile`: True once done, never blocking) done while they train."""

    def __call__(
        self, rnd: int, frames: list[tuple[int, Message]], meanwhile: Callable[[], bool] | None = None
    ) -> dict[int, Reply]: ...


@dataclass
class EmulatedSystem:
    """What the server emulates of the clients: their links and compute as drawn for the run, their
    outcome histories (what the policy may read), the clock that times their rounds, and how they
    compress their updates (with the residuals they keep), and their impact factors; and the bound on
    their updates that the server finds plausible (aggregate.max_update_norm). Per-client state is
    held for the clients selected so far (emulator.timemodel.resources.Resources, OutcomeLog)."""

    resources: Resources
    outcomes: OutcomeLog
    clients: ClientViews
    clock: Clock
    compression: Compression
    impact: Impact
    bounds: UpdateBounds
    energy: Energy | None  # None: energy is not modelled

    @classmethod
    def build(cls, cfg: Scenario, sizes: list[int], state: RunState) -> EmulatedSystem:
        resources = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, cfg.seed)
        state.apply_to_links(resources)
        outcomes = OutcomeLog(cfg.clients.n)
        outcomes.extend(state.outcomes)
        energy = Energy.of(cfg.energy, cfg.clients.n, cfg.seed, resources)
        if energy is not None and energy.batteries is not None:
            energy.batteries.after = state.batteries
        clock = Clock(
            resources,
            cfg.seed,
            cfg.links.server_down_bps,
            cfg.links.server_up_bps,
            start=state.now,
            on_unavailable=cfg.availability.on_unavailable,
            drain=None if energy is None else energy.batteries,
        )
        compression = Compression(cfg.compression, state.residuals)
        infos = client_infos(resources, sizes, outcomes)
        bounds = UpdateBounds(cfg.aggregate.max_update_norm, cfg.dp.batch_divisor, sizes)
        return cls(resources, outcomes, infos, clock, compression, Impact(cfg.impact, sizes), bounds, energy)


class RoundLoop:
    """The rounds of one run, from its first until a budget, the policy or a round that cannot be
    played stops them; `played` counts the rounds done, for the rounds table to hold."""

    def __init__(
        self,
        cfg: Scenario,
        policy: Policy,
        system: EmulatedSystem,
        budgets: Budgets,
        train: Workers,
        evaluator: Evaluator,
    ) -> None:
        self.cfg, self.policy, self.system, self.budgets = cfg, policy, system, budgets
        self.train, self.evaluator = train, evaluator
        self.settings = round_settings(cfg)
        self.schedule = EvaluationSchedule(cfg.eval.every, cfg.budget.rounds, policy.reads_evaluation())
        self.played = 0

    def restore(self, state: dict[str, Any] | None, weights: Weights) -> None:
        """Buffered mode's part of a checkpoint (emulator.run.buffered); synchronous rounds keep none."""

    def play(self, first_round: int, weights: Weights) -> tuple[str, Weights]:
        """Returns why the run stopped and the final model. Every round's hooks have run when it
        returns, however it returns."""
        self.played = first_round
        clock = self.system.clock
        try:
            for rnd in range(first_round, self.cfg.budget.rounds):
                stop = self.policy.should_stop()
                if stop:
                    return stop, weights
                try:
                    weights = self._round(rnd, weights).weights
                except RoundNotPlayed as e:
                    return str(e), weights
                if self.budgets.time_exhausted(clock.now):
                    return f"time budget {self.cfg.budget.time_s} s reached", weights
            return f"round budget {self.cfg.budget.rounds} reached", weights
        finally:  # Ctrl-C, SIGTERM and errors too: the round before keeps its rows and its checkpoint
            self.evaluator.flush()

    def evaluate_last(self, rnd: int | None, weights: Weights, hooks: Sequence[RoundHook]) -> None:
        """The evaluation of round `rnd`, the last on disk, left unevaluated by a stop found as the
        next round was planned (None: there is none to add)."""
        if rnd is not None:
            evaluation = self.evaluator(rnd, weights)
            for hook in hooks:
                hook.after_final_evaluation(rnd, *evaluation)

    def _round(self, rnd: int, weights: Weights) -> RoundRecord:
        """Play round `rnd`; its outcomes join the clients' histories (the next round's plan reads
        them) and it goes to the evaluator with its checkpoint state, taken now."""
        clock = self.system.clock
        evaluate = partial(self.evaluator, rnd) if self.schedule.within_rounds else None
        record = play_round(
            rnd,
            weights,
            settings=self.settings,
            policy=self.policy,
            clock=clock,
            budgets=self.budgets,
            train=self._train,
            evaluate=evaluate,
            compression=self.system.compression,
            impact=self.system.impact,
            bounds=self.system.bounds,
            energy=self.system.energy,
        )
        self.played = rnd + 1
        self.system.outcomes.extend(record.outcomes.values())
        system = self.system
        state = checkpoint_state(rnd + 1, clock.now, self.budgets, system.resources, self.policy, system.compression)
        self.evaluator.round_played(replace(record, checkpoint=state), self.schedule.after(rnd))
        return record

    def _train(self, rnd: int, frames: list[tuple[int, Message]]) -> dict[int, Reply]:
        """The workers train round `rnd` while the round before's hooks run here, once its evaluation is in
        (Evaluator.flush_if_evaluated)."""
        return self.train(rnd, frames, self.evaluator.flush_if_evaluated)

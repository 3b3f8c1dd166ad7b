"""round.mode = buffered | async: FedBuff's and FedAsync's server, in virtual time (docs/async.md).

`buffered.concurrency` clients are in flight at once. A dispatch trains the newly selected clients on
the workers from the current model, then the clock simulates each one's download, compute and upload
from now (`Clock.simulate_client`): its finish is a virtual time, and finishes are handled in the order
of (virtual time, dispatch, client), never in the order replies came from the workers. Each finish frees
a slot, which the policy fills at that virtual time; every `buffered.k` arrived updates (async: each one)
the server applies them by the staleness rule (emulator.aggregate.staleness) and the model becomes a new version:
the tables' round. A version's record holds every client that finished since the one before.

A client is in flight at most once and adds at most one update to a version: those in flight and those
that finished since the last version are not offered to the policy. A dispatch's task carries the
dispatch's number as its round, so its RNG streams are keyed by (dispatch, client), unique in a run.

Budgets: a client is dispatched only if the bytes of every client in flight and its own fit the byte
budget, and is cut (late) at the end of the time budget; when the version budget is reached or the
policy stops the run, the clients still in flight are cut at that moment, into the last version's
record. A run that ends while waiting (time or bytes spent, no client left) records the clients that
finished after the last version in a closing record whose model is unchanged.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from itertools import chain
from typing import Any

import numpy as np

from emulator.aggregate.plausibility import norm
from emulator.aggregate.staleness import fedasync, fedbuff, fedbuff_factors, staleness_weight
from emulator.policies import RoundPlan
from emulator.rounds.flights import Flight, dispatched, from_state, to_state
from emulator.rounds.round import (
    RoundRecord,
    charge_privacy,
    client_job,
    evaluated,
    finite_or_stop,
    outcomes_of,
    privacy_columns,
    reject_implausible,
    tasks_energy,
)
from emulator.run.round_loop import RoundLoop
from emulator.run.state import checkpoint_state
from emulator.timemodel.clock import Job, RoundTimeline
from nodes.contracts.schema import RoundMode
from nodes.contracts.tasks import Weights
from nodes.transport.dispatch import Reply


class BufferedLoop(RoundLoop):
    """The versions of one run in buffered or async mode; `restore` takes a checkpoint's clients in flight."""

    def restore(self, state: dict[str, Any] | None, weights: Weights) -> None:
        self.batch = 0  # dispatches so far
        self.inflight: dict[int, Flight] = {}
        self.finished: list[Flight] = []  # since the last version, in the order handled
        self.refused = ""  # why a dispatch was refused (the byte budget): none is made after it
        self.plan_state: dict[str, Any] = {}
        self.denied = False  # the policy's last selection was refused by the clients' privacy budgets
        self.slots = 0  # free slots as the policy selects (RunContext.slots)
        self.policy.ctx.slots = lambda: self.slots
        self.t_version = self.system.clock.now  # when the last version was made
        if state is not None:
            self.batch, self.plan_state = state["batch"], state["plan"]
            self.refused, self.denied = state["refused"], state["denied"]
            shapes = {k: w.shape for k, w in weights.items()}
            for d in state["flights"]:
                f = from_state(d, self.system.clock, shapes)
                self.inflight[f.client] = f

    @property
    def k(self) -> int:
        return 1 if self.cfg.round.mode == RoundMode.ASYNC else self.cfg.buffered.k

    def play(self, first_round: int, weights: Weights) -> tuple[str, Weights]:
        """Returns why the run stopped and the final model. Every version's hooks have run when it
        returns, however it returns."""
        self.played, self.version, self.weights = first_round, first_round, weights
        try:
            while True:
                self._dispatch()
                if self.refused == "" and self.budgets.time_exhausted(self.system.clock.now):
                    self.refused = f"time budget {self.cfg.budget.time_s} s reached"
                flight = self._next()
                if flight is None:
                    return self._close(self._why_idle()), self.weights
                if isinstance(flight, float):  # a candidate becomes available then
                    self._advance(flight)
                    continue
                self._advance(flight.finish)
                del self.inflight[flight.client]
                self._finish(flight)
                if sum(f.arrived for f in self.finished) == self.k:
                    stop = self._version()
                    if stop:
                        return stop, self.weights
        finally:
            self.evaluator.flush()

    # --- dispatching -------------------------------------------------------------------------------

    def _candidates(self) -> list[int]:
        """Clients the policy may be offered: within their privacy budget, not in flight, not in this version."""
        busy = set(self.inflight) | {f.client for f in self.finished}
        return [i for i in self.policy.accountant.eligible_clients(self.policy.ctx.n_clients) if i not in busy]

    def _dispatch(self) -> None:
        """Fill the free slots at the current virtual time: the policy selects among the available
        candidates, the workers train the selected from the current model, the clock simulates them."""
        clock, slots = self.system.clock, self.cfg.buffered.concurrency - len(self.inflight)
        if slots <= 0 or self.refused:
            return
        offered = clock.available_among(self._candidates())
        if not offered:
            return
        batch, self.batch = self.batch, self.batch + 1
        self.slots = slots
        plan = self.policy.configure_round(batch, offered)
        tasks = [t for t in plan.tasks if self.policy.accountant.allows(t)]
        if len(tasks) > slots or not {t.client for t in tasks} <= set(offered):
            raise RuntimeError(
                f"policy {self.cfg.policy} selected clients {[t.client for t in tasks]} for {slots} free slots "
                f"among {len(offered)} offered clients"
            )
        self.plan_state, self.denied = plan.state, bool(plan.tasks) and not tasks
        comp, weights = self.system.compression, self.weights
        frames = [(t.client, comp.task(batch, t, weights)) for t in tasks]
        replies = self.train(batch, frames)
        committed = sum(f.job.bytes_down + f.job.bytes_up for f in self.inflight.values())
        for t, (_, frame) in zip(tasks, frames):
            down = comp.charged_down(batch, t, weights, frame)
            job = client_job(t, down, replies[t.client], weights, comp, self.system.bounds)
            committed += job.bytes_down + job.bytes_up
            if self.budgets.bytes_spent + committed > self.cfg.budget.bytes:
                self.refused = (
                    f"byte budget {self.cfg.budget.bytes:.0f} reached: {self.budgets.bytes_spent} spent, "
                    f"{committed} more needed with client {t.client} dispatched"
                )
                return
            flight = dispatched(
                clock,
                batch,
                self.version,
                t,
                job,
                replies[t.client],
                self._tensors(job, replies[t.client]),
                self._cutoff(),
            )
            comp.keep(replies, [t.client] if flight.me.trained else [])
            msg = replies[t.client].message  # its tensors are the flight's now: the frames go
            flight.reply.message = {"metrics": msg["metrics"]} if msg is not None and not job.failed else None
            self.inflight[t.client] = flight

    def _tensors(self, job: Job, reply: Reply) -> Weights:
        """What the server keeps of an update: its delta from the current model (buffered) or the model (async);
        nothing of a failed or implausible one."""
        if reply.failure or reply.message is None:
            return {}
        model = reply.message["model"]
        if self.cfg.round.mode == RoundMode.ASYNC:
            return {k: np.array(v, dtype=np.float32) for k, v in model.items()}
        return {k: (model[k] - w).astype(np.float32) for k, w in self.weights.items()}

    def _cutoff(self) -> float:
        """A client dispatched now is late at its deadline, and at the end of the time budget."""
        return min(self.system.clock.now + self.cfg.round.deadline_s, self.cfg.budget.time_s)

    # --- virtual time ------------------------------------------------------------------------------

    def _next(self) -> Flight | float | None:
        """The next finish, or else the time a candidate becomes available while a slot is free,
        if before the time budget's end (None: neither will come)."""
        clock = self.system.clock
        first = min(self.inflight.values(), key=Flight.order, default=None)
        back = math.inf
        if len(self.inflight) < self.cfg.buffered.concurrency and not self.refused:
            back = clock.next_available(self._candidates())
        if first is not None and first.finish <= back:
            return first
        if clock.now < back <= self.cfg.budget.time_s and back < math.inf:
            return float(back)
        return first

    def _advance(self, t: float) -> None:
        clock = self.system.clock
        if t > clock.now:
            clock.env.run(until=t)

    def _finish(self, f: Flight) -> None:
        """A client finished: the links' bytes and its privacy are charged (it paid if it trained). An
        implausible update is rejected as it arrives."""
        me = f.me
        reject_implausible(me, f.reply, f.timeline.events)
        self.budgets.bytes_spent += me.bytes_down + me.bytes_up
        f.epsilon_spent = charge_privacy(self.policy.accountant, [f.task], lambda _: me.trained)[f.client]
        self.finished.append(f)

    # --- versions ----------------------------------------------------------------------------------

    def _version(self) -> str:
        """Apply the buffered updates (the arrived among `finished`); the new version's record goes to
        the evaluator and the hooks. Returns why the run stops after it ('' to go on)."""
        rnd, applied = self.version, [f for f in self.finished if f.arrived]
        opts = self.cfg.buffered
        staleness = [rnd - f.version_start for f in applied]
        before, is_async = self.weights, self.cfg.round.mode == RoundMode.ASYNC
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported once, below, in one line
            if is_async:
                factors = [opts.alpha * staleness_weight(opts, staleness[0])]
                self.weights = fedasync(self.weights, applied[0].tensors, factors[0])
            else:
                factors = fedbuff_factors(opts, staleness)
                self.weights = fedbuff(self.weights, [f.tensors for f in applied], factors)

        def updates() -> dict[int, float]:  # async keeps each client's model, buffered its delta
            return {f.client: norm(f.tensors, before if is_async else None) for f in applied}

        finite_or_stop(rnd, self.weights, updates, self.cfg.policy)
        self.version += 1
        stop = self.policy.should_stop()
        if self.version >= self.cfg.budget.rounds:
            stop = f"round budget {self.cfg.budget.rounds} reached"
        if stop:
            self._cut_all()
        self._record(rnd, {f.client: s for f, s in zip(applied, factors)})
        return stop

    def _cut_all(self) -> None:
        """The run stops now: every client in flight is cut (late) at this moment, and finishes."""
        now = self.system.clock.now
        for f in sorted(self.inflight.values(), key=lambda f: (f.batch, f.client)):
            f.simulate(self.system.clock, now)
            self._finish(f)
        self.inflight = {}

    def _close(self, why: str) -> str:
        """The run ends while no version is due: the clients that finished since the last one are
        recorded with the model unchanged (their updates, if any arrived, are not applied)."""
        if self.finished and self.version < self.cfg.budget.rounds:
            self._record(self.version, {})
            self.version += 1
        return why

    def _why_idle(self) -> str:
        if self.refused:
            return self.refused
        if self.denied or not self.policy.accountant.eligible_clients(self.policy.ctx.n_clients):
            return "privacy budget exhausted for every client the policy selects"
        if not self._candidates():
            return f"no client left to add an update to version {self.version}"
        return "no client is available before the time budget ends"

    def _record(self, rnd: int, factors: dict[int, float]) -> None:
        """Version `rnd`'s record, with its checkpoint state, to the evaluator and the hooks."""
        wall, clock, n = time.monotonic(), self.system.clock, self.policy.ctx.n_clients
        finished = sorted(self.finished, key=lambda f: f.client)
        tl = RoundTimeline(round=rnd, t_start=self.t_version, deadline=math.nan, t_end=clock.now)
        tl.clients = {f.client: f.me for f in finished}
        tl.events = sorted(chain.from_iterable(f.timeline.events for f in self.finished), key=lambda e: e[0])
        tl.events.append((clock.now, -1, "version" if factors else "stop", 0))
        replies = {f.client: f.reply for f in finished}
        outcomes = outcomes_of(tl, replies)
        seen = self.policy.observe_outcomes(rnd, outcomes)
        planned = np.zeros(n)
        opts = self.cfg.buffered
        for f in finished:
            planned[f.client] = staleness_weight(opts, rnd - f.version_start) if f.client in factors else 0.0
        within = self.schedule.within_rounds
        test_loss, test_acc, observed = evaluated(
            self.policy, rnd, (lambda: self.evaluator(rnd, self.weights)) if within else None
        )
        state = {**self.plan_state, "mode": self.cfg.round.mode, "applied": len(factors), **seen, **observed}
        record = RoundRecord(
            rnd=rnd,
            plan=RoundPlan(tasks=tuple(f.task for f in finished), state=state),
            tasks=[f.task for f in finished],
            replies=replies,
            timeline=tl,
            outcomes=outcomes,
            planned=planned,
            factors=factors,
            policy_state=state,
            weights=self.weights,
            test_loss=test_loss,
            test_accuracy=test_acc,
            **privacy_columns(self.policy.accountant, [f.client for f in finished], n),
            epsilon_spent={f.client: f.epsilon_spent for f in finished},
            wall_s=time.monotonic() - wall,
            starts={f.client: f.version_start for f in finished},
            energy=tasks_energy(self.system.energy, tl),
        )
        self._emit(record)

    def _emit(self, record: RoundRecord) -> None:
        """The record to the evaluator and the hooks, with the checkpoint state taken now: the
        clients in flight as they are at this version boundary."""
        rnd, system = record.rnd, self.system
        self.played, self.finished, self.t_version = rnd + 1, [], system.clock.now
        system.outcomes.extend(record.outcomes.values())
        flights = {
            "batch": self.batch,
            "plan": self.plan_state,
            "refused": self.refused,
            "denied": self.denied,
            "flights": [to_state(f) for f in self._flights()],
        }
        state = checkpoint_state(
            rnd + 1, system.clock.now, self.budgets, system.resources, self.policy, system.compression, flights
        )
        self.evaluator.round_played(replace(record, checkpoint=state), self.schedule.after(rnd))

    def _flights(self) -> list[Flight]:
        return sorted(self.inflight.values(), key=lambda f: (f.batch, f.client))

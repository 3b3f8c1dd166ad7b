"""One round: the policy plans -> the clients train -> the SimPy clock replays downloads,
compute and uploads with the real message sizes -> the policy sees every selected client's
outcome -> on-time updates are aggregated in client-id order with renormalised impact
factors -> the server evaluates, here only for a policy that reads the evaluation -> the privacy
ledgers are charged. `play_round` returns a `RoundRecord`, which knows its rows of the results
tables. Which rounds are evaluated, and when, is `emulator.run.evaluation.EvaluationSchedule`'s to say:
within the round for a policy that reads the evaluation (it is given `evaluate`), else after it.

Training is a parameter, `train(rnd, frames) -> replies`: the run sends the task frames to its
worker processes (WorkerPool.run_tasks); a test or a policy study can train in-process.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from emulator.aggregate.compression import Compression, task_frame
from emulator.aggregate.impact import Impact, arrival_rates, renormalise
from emulator.aggregate.plausibility import IMPLAUSIBLE, UpdateBounds, norm
from emulator.energy.model import Energy
from emulator.energy.task import TaskEnergy
from emulator.policies import Accountant, ClientOutcome, ClientResult, ClientTask, Policy, RoundPlan
from emulator.policies.system import histories
from emulator.rounds.budgets import Budgets
from emulator.timemodel.clock import ClientTimeline, Clock, Job, Outcome, RoundTimeline
from emulator.timemodel.partial_work import fit_task, normalised
from nodes.contracts.protocol import Message
from nodes.contracts.schema import CompressionConfig, DataConfig, ImpactConfig, ImpactKind
from nodes.contracts.tasks import MAX_ABS, Weights
from nodes.data.quality import corruption_for
from nodes.transport.dispatch import Reply

Train = Callable[[int, list[tuple[int, Message]]], dict[int, Reply]]  # (round, [(client, task message)]) -> replies
Evaluate = Callable[[Weights], tuple[float, float]]  # global model -> (test loss, test accuracy)


class RoundNotPlayed(Exception):
    """The round cannot run; the message is why the run stops."""


class ModelNotFinite(RuntimeError):
    """The global model has non-finite values after aggregation: the run fails, its rounds before kept
    (the bad round is not recorded)."""


@dataclass(frozen=True)
class RoundRecord:
    """What one round did: the new global model and everything the results tables keep."""

    rnd: int
    plan: RoundPlan
    tasks: list[ClientTask]  # the planned tasks within their clients' privacy budgets
    replies: dict[int, Reply]
    timeline: RoundTimeline
    outcomes: dict[int, ClientOutcome]  # every selected client's, by client id
    planned: np.ndarray  # impact factors p_i of every client
    factors: dict[int, float]  # p_i renormalised over the updates that arrived
    policy_state: dict[str, Any]  # the plan's state and what aggregate() and observe() added
    weights: Weights  # the new global model
    test_loss: float  # NaN until the round is evaluated, and for a round that is not
    test_accuracy: float
    epsilon: dict[int, float]  # per selected client, after the round
    max_epsilon: float  # the most any client has spent, after the round
    epsilon_spent: dict[int, float]
    wall_s: float
    checkpoint: str = ""  # the state the run's checkpoint keeps as the round ended (emulator.run.state)
    # Buffered mode: the model version each client's task started from (its staleness is rnd - start);
    # in sync mode every client starts from the round's model, rnd.
    starts: dict[int, int] = field(default_factory=dict)
    energy: dict[int, TaskEnergy] | None = None  # each selected client's task's; None: energy is not modelled
    battery: dict[int, tuple[float, float]] | None = None  # each task's charge at its start and end; None: no battery

    def rows(self, data: DataConfig) -> dict[str, list[dict[str, Any]]]:
        """The round's rows of the `rounds`, `client_rounds` and `events` tables (results.SCHEMAS)."""
        return {
            "rounds": [self.round_row()],
            "client_rounds": self._client_rows(data),
            "events": [
                {"round": self.rnd, "t": t, "client": c, "kind": k, "nbytes": n} for t, c, k, n in self.timeline.events
            ],
        }

    def round_row(self) -> dict[str, Any]:
        """The round's row of the `rounds` table."""
        tl, state = self.timeline, self.policy_state
        outcomes = [c.outcome for c in tl.clients.values()]
        arrived_loss = [float(_message(self.replies[c])["metrics"]["train_loss"]) for c in self.factors]
        return {
            "round": self.rnd,
            "t_start": tl.t_start,
            "t_end": tl.t_end,
            "deadline": tl.deadline,
            "selected": len(self.tasks),
            "unavailable": tl.unavailable,
            "arrived": outcomes.count(Outcome.ARRIVED),
            "late": outcomes.count(Outcome.LATE),
            "lost": outcomes.count(Outcome.LOST_DOWN) + outcomes.count(Outcome.LOST_UP),
            "failed": outcomes.count(Outcome.FAILED) + outcomes.count(Outcome.IMPLAUSIBLE),  # no update aggregated
            "bytes_down": sum(c.bytes_down for c in tl.clients.values()),
            "bytes_up": sum(c.bytes_up for c in tl.clients.values()),
            "bytes_total": sum(c.bytes_down + c.bytes_up for c in tl.clients.values()),
            "tau": state.get("tau"),
            "sigma": state.get("sigma"),
            "mu": state.get("mu"),
            "horizon": state.get("T"),
            "policy_state": json.dumps(state, sort_keys=True),
            "test_loss": self.test_loss,
            "test_accuracy": self.test_accuracy,
            "train_loss": _mean_loss(arrived_loss),
            "max_epsilon": self.max_epsilon,
            "energy_j": None if self.energy is None else round_energy(self.energy),
            "wall_s": self.wall_s,
        }

    def _client_rows(self, data: DataConfig) -> list[dict[str, Any]]:
        by_client = {t.client: t for t in self.tasks}
        rows = []
        for c, ct in sorted(self.timeline.clients.items()):
            t, r = by_client[c], self.replies[c]
            m = r.message["metrics"] if r.message and not r.failure else {}
            quality = corruption_for(data, c, self.rnd)  # a pure function of the scenario, as on the worker
            rows.append(
                {
                    "round": self.rnd,
                    "client": c,
                    "outcome": ct.outcome,
                    "impact_planned": float(self.planned[c]),
                    "impact_factor": self.factors.get(c, 0.0),
                    "t_download_start": ct.t_down_start,
                    "t_download_end": ct.t_down_end,
                    "t_compute_end": ct.t_compute_end,
                    "t_upload_end": ct.t_up_end,
                    "t_end": ct.t_end,
                    "bytes_down": ct.bytes_down,
                    "bytes_up": ct.bytes_up,
                    "local_steps": t.steps if ct.trained else 0,
                    "q": t.q,
                    "sigma": t.sigma,
                    "clip": t.clip,
                    "lr": t.lr,
                    "epsilon": self.epsilon[c],
                    "epsilon_spent": self.epsilon_spent.get(c, 0.0),
                    "train_loss": m.get("train_loss"),
                    "update_norm": m.get("update_norm"),
                    "failure": r.failure or None,
                    "output_noise_scale": t.output_noise_scale if t.output_noise != "none" else 0.0,
                    "salt_pepper": quality.salt_pepper,
                    "label_noise": quality.label_noise,
                    "version_start": self.starts.get(c, self.rnd),
                    "staleness": self.rnd - self.starts.get(c, self.rnd),
                    **energy_columns(None if self.energy is None else self.energy[c]),
                    "battery_start_j": None if self.battery is None else self.battery[c][0],
                    "battery_end_j": None if self.battery is None else self.battery[c][1],
                }
            )
        return rows


ENERGY_COLUMNS = ("energy_radio_down_j", "energy_radio_up_j", "energy_tail_j", "energy_compute_j")


def energy_columns(e: TaskEnergy | None) -> dict[str, float | None]:
    """A task's energy columns of the client_rounds table (None where energy is not modelled)."""
    values = (None,) * 4 if e is None else (e.radio_down_j, e.radio_up_j, e.tail_j, e.compute_j)
    return dict(zip(ENERGY_COLUMNS, values, strict=True))


def round_energy(energy: dict[int, TaskEnergy]) -> float:
    """The joules of a round's tasks, summed in client order (what budget.energy_j is charged)."""
    return sum((energy[c].total_j for c in sorted(energy)), 0.0)


def tasks_energy(model: Energy | None, tl: RoundTimeline) -> dict[int, TaskEnergy] | None:
    """The energy of each task of a timeline, by client (None where energy is not modelled)."""
    return None if model is None else {c: model.of_task(ct) for c, ct in sorted(tl.clients.items())}


@dataclass(frozen=True)
class RoundSettings:
    """What a round reads of the scenario, taken once for the run (emulator.config.round_settings): a round sees
    no other key.

    Attributes:
        time_s: budget.time_s: no client is offered a round that starts past it.
        partial_work: round.partial_work: each task runs the local steps that fit before the deadline.
        normalize: round.partial_work_normalize: such updates normalised by their steps (FedNova).
        impact: the impact section: the factors of a round given no `Impact`.
        compression: the compression section: the codec of a round given no `Compression`.
        policy: policy, as an aggregate that is not finite names it.
    """

    time_s: float
    partial_work: bool
    normalize: bool
    impact: ImpactConfig
    compression: CompressionConfig
    policy: str


def play_round(
    rnd: int,
    weights: Weights,
    *,
    settings: RoundSettings,
    policy: Policy,
    clock: Clock,
    budgets: Budgets,
    train: Train,
    evaluate: Evaluate | None,
    compression: Compression | None = None,
    impact: Impact | None = None,
    bounds: UpdateBounds | None = None,
    energy: Energy | None = None,
) -> RoundRecord:
    """Round `rnd` from the global model `weights`; raises RoundNotPlayed when the privacy or a
    byte or time budget leaves nothing to run, ModelNotFinite when the aggregated model is not finite.
    With `evaluate` the new model is evaluated within the round and the policy observes it before the
    next round is planned. `compression` (default: the settings', without residuals) encodes the
    updates and keeps the residuals across rounds; `impact` (default: the settings', for this round
    alone) gives the impact factors; `bounds` (default: none, for a test's crafted replies; a run
    passes the scenario's aggregate.max_update_norm) rejects implausible updates; `energy` (default: not
    modelled) gives each task's energy and keeps the batteries (`_timed`, `charged_enough`)."""
    comp = compression or Compression(settings.compression)
    wall = time.monotonic()
    privacy, n = policy.accountant, policy.ctx.n_clients
    eligible = charged_enough(energy, privacy.eligible_clients(n), clock.now)
    offered = clock.selectable(eligible, until=settings.time_s)  # availability (may move time on)
    if eligible and not offered:
        raise RoundNotPlayed("no client is available before the time budget ends")
    plan = policy.configure_round(rnd, offered)
    deadline = budgets.deadline(clock.now)
    tasks = _fit_steps(settings, clock, [t for t in plan.tasks if privacy.allows(t)], deadline, rnd, weights)
    if not tasks and not plan.empty_round:
        raise RoundNotPlayed("privacy budget exhausted for every client")

    frames = [(t.client, comp.task(rnd, t, weights)) for t in tasks]
    replies = train(rnd, frames)
    jobs = [
        client_job(t, comp.charged_down(rnd, t, weights, frame), replies[t.client], weights, comp, bounds)
        for t, (_, frame) in zip(tasks, frames)
    ]
    stop = budgets.exhausted_by(jobs, clock.now)
    if stop:
        raise RoundNotPlayed(stop)
    timeline, spent, battery = _timed(rnd, jobs, deadline, clock, budgets, energy)
    for ct in timeline.clients.values():
        reject_implausible(ct, replies[ct.client], timeline.events)
    _spend(budgets, energy, timeline, spent, battery)
    comp.keep(replies, [c for c, ct in sorted(timeline.clients.items()) if ct.trained])
    charged = charge_privacy(privacy, tasks, lambda c: timeline.clients[c].trained)
    outcomes = outcomes_of(timeline, replies)
    seen = policy.observe_outcomes(rnd, outcomes)

    planned = (impact or Impact(settings.impact, policy.ctx.data_sizes))(rnd, _arrival_rates(settings.impact, policy))
    arrived = [c for c in sorted(timeline.clients) if timeline.clients[c].outcome == Outcome.ARRIVED]
    factors = renormalise(planned, arrived)
    results = _results(settings, tasks, replies, arrived, weights, factors)
    weights, aggregated = _aggregated(rnd, policy, weights, results, factors, settings.policy)
    wall_s = time.monotonic() - wall  # the evaluation's time is not the round's: it may overlap the next round
    test_loss, test_acc, observed = evaluated(policy, rnd, None if evaluate is None else lambda: evaluate(weights))
    return RoundRecord(
        rnd=rnd,
        plan=plan,
        tasks=tasks,
        replies=replies,
        timeline=timeline,
        outcomes=outcomes,
        planned=planned,
        factors=factors,
        policy_state={**plan.state, **seen, **aggregated, **observed},
        weights=weights,
        test_loss=test_loss,
        test_accuracy=test_acc,
        **privacy_columns(privacy, [t.client for t in tasks], n),
        epsilon_spent=charged,
        wall_s=wall_s,
        energy=spent,
        battery=battery,
    )


def _spend(
    budgets: Budgets,
    energy: Energy | None,
    tl: RoundTimeline,
    spent: dict[int, TaskEnergy] | None,
    battery: dict[int, tuple[float, float]] | None,
) -> None:
    """A committed round's bytes and joules to the budgets, its tasks' end charges to their batteries."""
    budgets.spend(tl, None if spent is None else round_energy(spent))
    if battery is not None and energy is not None and energy.batteries is not None:
        energy.batteries.spend(battery, tl)


def charged_enough(energy: Energy | None, eligible: Sequence[int], now: float) -> Sequence[int]:
    """The eligible clients whose batteries may take a task now (energy.battery.on_low = skip leaves out those
    below the floor); RoundNotPlayed when some were eligible and none is."""
    if energy is None or energy.batteries is None or not len(eligible):
        return eligible
    offered = energy.batteries.offered(eligible, now)
    if not len(offered):
        raise RoundNotPlayed("every eligible client's battery is below energy.battery.floor")
    return offered


def _timed(
    rnd: int, jobs: list[Job], deadline: float, clock: Clock, budgets: Budgets, energy: Energy | None
) -> tuple[RoundTimeline, dict[int, TaskEnergy] | None, dict[int, tuple[float, float]] | None]:
    """The clock's timeline of the round's jobs, each task's energy where it is modelled and its battery's
    charge at its start and end where batteries are; RoundNotPlayed, virtual time back at the round's start,
    when the tasks' joules would pass budget.energy_j."""
    start = clock.now
    timeline = clock.simulate_round(rnd, jobs, deadline)
    spent, charges = tasks_energy(energy, timeline), None
    if spent is not None and energy is not None and energy.batteries is not None:
        spent, charges = energy.batteries.settle(spent, timeline)  # no task draws more than its battery held
    stop = budgets.energy_exhausted_by(None if spent is None else round_energy(spent))
    if stop:
        clock.rewind(start)
        raise RoundNotPlayed(stop)
    return timeline, spent, charges


def evaluated(
    policy: Policy, rnd: int, evaluate: Callable[[], tuple[float, float]] | None
) -> tuple[float, float, dict[str, Any]]:
    """The round's (test loss, test accuracy) where it is evaluated within the round (NaN where not),
    and what the policy observed of them."""
    if evaluate is None:
        return math.nan, math.nan, {}
    test_loss, test_acc = evaluate()
    return test_loss, test_acc, policy.observe(rnd, test_loss, test_acc)


def privacy_columns(privacy: Accountant, clients: Iterable[int], n: int) -> dict[str, Any]:
    """A RoundRecord's ε columns after the round: each of `clients`' ε, and the most any of the n
    clients has spent."""
    return {"epsilon": {c: privacy.epsilon(c) for c in clients}, "max_epsilon": privacy.max_epsilon(n)}


def outcomes_of(tl: RoundTimeline, replies: dict[int, Reply]) -> dict[int, ClientOutcome]:
    """What the server learnt of each selected client: the clock's verdict and times, and the
    training loss of the updates that arrived."""

    def loss(c: int, outcome: str) -> float:
        return float(_message(replies[c])["metrics"]["train_loss"]) if outcome == Outcome.ARRIVED else float("nan")

    return {
        c: ClientOutcome(
            round=tl.round,
            client=c,
            outcome=_outcome(ct),
            t_down_start=ct.t_down_start,
            t_down_end=ct.t_down_end,
            t_compute_end=ct.t_compute_end,
            t_up_end=ct.t_up_end,
            train_loss=loss(c, _outcome(ct)),
        )
        for c, ct in sorted(tl.clients.items())
    }


def _arrival_rates(impact: ImpactConfig, policy: Policy) -> list[float] | None:
    """What kind=reliability weighs data sizes by: each client's arrivals before this round."""
    clients = policy.ctx.clients
    if impact.kind != ImpactKind.RELIABILITY:
        return None
    arrivals, selections = np.zeros(len(clients)), np.zeros(len(clients))  # a client never selected: 0 of 0
    for c, history in histories(clients).items():
        arrivals[c], selections[c] = history.arrivals, len(history)
    rates: list[float] = arrival_rates(arrivals, selections, impact.prior_rate, impact.prior_weight).tolist()
    return rates


def _fit_steps(
    settings: RoundSettings, clock: Clock, tasks: list[ClientTask], deadline: float, rnd: int, weights: Weights
) -> list[ClientTask]:
    """round.partial_work: each task with the local steps that fit before the deadline
    (emulator.timemodel.partial_work), its messages estimated at the plain task's size (what the link
    carries of the broadcast)."""
    if not settings.partial_work:
        return tasks
    return [
        fit_task(t, clock.resources[t.client], clock.now, deadline, len(task_frame(rnd, t, weights))) for t in tasks
    ]


def _results(
    settings: RoundSettings,
    tasks: list[ClientTask],
    replies: dict[int, Reply],
    arrived: list[int],
    weights: Weights,
    factors: dict[int, float],
) -> list[ClientResult]:
    """The arrived updates as the policy aggregates them: normalised by the steps done under partial work."""
    results = [_result(replies[c]) for c in arrived]
    if not (settings.partial_work and settings.normalize):
        return results
    return normalised(weights, results, factors, {t.client: t.steps for t in tasks})


def _aggregated(
    rnd: int, policy: Policy, weights: Weights, results: list[ClientResult], factors: dict[int, float], name: str
) -> tuple[Weights, dict[str, Any]]:
    """The policy's aggregate of `results`, a model that must be finite (`finite_or_stop`)."""
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported once, below, in one line
        new, state = policy.aggregate(rnd, weights, results, factors)
    finite_or_stop(rnd, new, lambda: {r.client: norm(r.weights, weights) for r in results}, name)
    return new, state


def client_job(
    t: ClientTask, bytes_down: int, reply: Reply, weights: Weights, comp: Compression, bounds: UpdateBounds | None
) -> Job:
    """What the clock needs of a trained client; a reply that is no update of `weights` becomes a failure.
    An update above its bound (`bounds`) is uploaded as any other, and rejected as it arrives
    (`reject_implausible`): its reply's failure says why."""
    if not reply.failure:
        reply.failure = comp.unpack(reply, weights) or _update_problem(reply, weights)
        if not reply.failure and bounds is not None:
            reply.failure = bounds.problem(t, reply, weights, comp)
    ok = not reply.failure or is_implausible(reply)
    bytes_up = comp.charged_up(reply) if ok else 0
    return Job(client=t.client, bytes_down=bytes_down, steps=t.steps, bytes_up=bytes_up, failed=not ok)


def is_implausible(reply: Reply) -> bool:
    return reply.failure.startswith(IMPLAUSIBLE)


def reject_implausible(ct: ClientTimeline, reply: Reply, events: list[tuple[float, int, str, int]]) -> None:
    """An implausible update that arrived is rejected then: outcome `implausible`, an event after its upload's end."""
    if ct.outcome is not Outcome.ARRIVED or not is_implausible(reply):
        return
    ct.outcome = Outcome.IMPLAUSIBLE
    at = next((i for i, e in enumerate(events) if e[1] == ct.client and e[2] == "upload_end"), len(events) - 1)
    events.insert(at + 1, (ct.t_up_end, ct.client, "implausible", 0))


def finite_or_stop(rnd: int, new: Weights, updates: Callable[[], dict[int, float]], policy: str) -> None:
    """Raise ModelNotFinite unless every value of the aggregated model `new` is finite and below MAX_ABS in
    magnitude (a checkpoint of it would be refused), naming what made it so where that can be known: the
    updates aggregated, by their norms (`updates()`: client -> norm)."""
    bad = next((k for k, v in new.items() if v.size and not np.abs(v).max() < MAX_ABS), None)  # NaN too
    if bad is None:
        return
    if np.isfinite(new[bad]).all():
        top = float(np.abs(new[bad]).max())
        raise ModelNotFinite(
            f"round {rnd}: the global model has a value of magnitude {top:.3g} after aggregation, 2^64 or more, "
            f"from which every norm and loss is inf (first in {bad}; policy {policy})"
        )
    norms = updates()
    broken = [c for c, n in sorted(norms.items()) if not math.isfinite(n)]
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        why = f"client {broken[0]}'s update{more} has non-finite values"
    elif norms:
        c = max(norms, key=lambda c: (norms[c], -c))
        why = (
            f"client {c}'s update has the largest norm, {norms[c]:.3g}, of the {len(norms)} policy {policy} aggregated"
        )
    else:
        why = f"policy {policy} aggregated no update"
    raise ModelNotFinite(
        f"round {rnd}: the global model has non-finite values after aggregation ({why}; first in {bad})"
    )


def _update_problem(reply: Reply, weights: Weights) -> str:
    """An update that does not fit the global model is a failed client, not an input. (Finiteness
    is not checked again here: protocol.decode refuses a non-finite tensor in every reply that
    crossed a socket.)"""
    new = _message(reply)["model"]
    if not (isinstance(new, dict) and all(isinstance(v, np.ndarray) for v in new.values())):
        return "bad update: the model is not a map of tensors"
    if new.keys() != weights.keys() or any(new[k].shape != weights[k].shape for k in weights):
        return "bad update: tensors do not match the model"
    return ""


def _result(reply: Reply) -> ClientResult:
    m = _message(reply)["metrics"]
    return ClientResult(
        client=reply.client,
        weights=_message(reply)["model"],
        steps=int(m["steps"]),
        train_loss=float(m["train_loss"]),
        update_norm=float(m["update_norm"]),
        metrics=m,
    )


def _mean_loss(losses: list[float]) -> float | None:
    """The mean of the arrived updates' training losses, NaN ones left out (np.nanmean's value, without
    its warning where every one is NaN: an update whose every batch was empty); None without any."""
    if not losses:
        return None
    if all(math.isnan(x) for x in losses):
        return math.nan
    return float(np.nanmean(losses))


def _message(reply: Reply) -> dict[str, Any]:
    """The message of a reply that has one: only arrived (or being checked) updates are read.
    (Reply.message is None for a reply without one; a cast, so no check is added here.)"""
    return cast(dict[str, Any], reply.message)


def _outcome(ct: ClientTimeline) -> Outcome:
    """A selected client's outcome once the round is simulated (simulate_round resolves every one)."""
    assert ct.outcome is not None, f"client {ct.client}: no outcome after the round"
    return ct.outcome


def charge_privacy(
    privacy: Accountant, tasks: Sequence[ClientTask], trained: Callable[[int], bool]
) -> dict[int, float]:
    """Charge the tasks of the clients that trained, and return the ε each task's client spent.

    Every client that received the model ran its steps: it pays, whatever became of the upload. The
    policy's accountant decides what a round costs (its own mechanism may charge the others too)."""
    before = {t.client: privacy.epsilon(t.client) for t in tasks}
    privacy.charge([t for t in tasks if trained(t.client)])
    return {c: privacy.epsilon(c) - e for c, e in before.items()}

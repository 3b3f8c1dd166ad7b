"""Buffered mode's clients in flight: what the server holds of each (its task, its trained update, its
timeline), and that as a checkpoint keeps it.

A client in flight has trained already (the workers train when the client is dispatched); the clock
simulated its download, compute and upload alone on its links from its start (`Clock.simulate_client`),
so its whole timeline is a function of its start, its job, its cutoff and its link's loss state before
it: the checkpoint keeps those and the update's tensors, and a resumed run rebuilds the same timeline.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from emulator.timemodel.clock import ClientTimeline, Clock, Job, Outcome, RoundTimeline
from nodes.contracts.tasks import ClientTask, Weights
from nodes.transport.dispatch import Reply


@dataclass
class Flight:
    """One dispatched client: from its dispatch until it finished, and then in its version's record."""

    batch: int  # the dispatch it went out in: its task's round, which keys its RNG streams
    version_start: int  # the model version it trained from
    task: ClientTask
    job: Job
    reply: Reply  # its metrics (the tensors are `tensors`)
    tensors: Weights  # buffered: its delta w_i - w_start; async: its model w_i ({} when it failed)
    cutoff: float  # when it is cut (late): its deadline, or the time budget's end
    bad_before: bool  # its link's loss state (LinkLoss.bad) before its simulation
    timeline: RoundTimeline  # its simulation: t_start is its dispatch, t_end when it finished
    epsilon_spent: float = 0.0  # charged as it finished

    @property
    def client(self) -> int:
        return self.task.client

    @property
    def me(self) -> ClientTimeline:
        return self.timeline.clients[self.client]

    @property
    def finish(self) -> float:
        return self.timeline.t_end

    @property
    def arrived(self) -> bool:
        return self.me.outcome is Outcome.ARRIVED

    def order(self) -> tuple[float, int, int]:
        """The order finishes are handled in: by virtual time, then dispatch, then client id."""
        return self.finish, self.batch, self.client

    def simulate(self, clock: Clock, cutoff: float) -> None:
        """(Re)build the timeline from the dispatch, cut at `cutoff`, from the link state before it."""
        self.cutoff = cutoff
        clock.resources[self.client].loss.bad = self.bad_before
        self.timeline = clock.simulate_client(self.batch, self.job, self.timeline.t_start, cutoff)


def dispatched(
    clock: Clock, batch: int, version: int, task: ClientTask, job: Job, reply: Reply, tensors: Weights, cutoff: float
) -> Flight:
    """A client dispatched now, its timeline simulated."""
    start = RoundTimeline(round=batch, t_start=clock.now, deadline=cutoff)
    flight = Flight(batch, version, task, job, reply, tensors, cutoff, clock.resources[task.client].loss.bad, start)
    flight.simulate(clock, cutoff)
    return flight


def to_state(f: Flight) -> dict[str, Any]:
    """A flight as the checkpoint keeps it (plain JSON; tensors as float32 bytes in base64)."""
    m = f.reply.message or {}
    return {
        "batch": f.batch,
        "version_start": f.version_start,
        "task": f.task.to_wire(),
        "job": [f.job.bytes_down, f.job.steps, f.job.bytes_up, f.job.failed],
        "reply": {"nbytes": f.reply.nbytes, "failure": f.reply.failure, "metrics": m.get("metrics", {})},
        "tensors": {
            k: base64.b64encode(np.ascontiguousarray(v, "<f4").tobytes()).decode() for k, v in f.tensors.items()
        },
        "start": f.timeline.t_start,
        "cutoff": f.cutoff,
        "bad_before": f.bad_before,
    }


def from_state(d: Mapping[str, Any], clock: Clock, shapes: Mapping[str, tuple[int, ...]]) -> Flight:
    """`to_state`'s inverse (validated by `valid_state`), its timeline simulated again."""
    task = ClientTask.from_wire(d["task"])
    bytes_down, steps, bytes_up, failed = d["job"]
    job = Job(task.client, bytes_down, steps, bytes_up, failed)
    r = d["reply"]
    reply = Reply(task.client, None if r["failure"] else {"metrics": r["metrics"]}, r["nbytes"], r["failure"])
    tensors = {
        k: np.frombuffer(base64.b64decode(b), "<f4").astype(np.float32).reshape(shapes[k])
        for k, b in d["tensors"].items()
    }
    start = RoundTimeline(round=d["batch"], t_start=d["start"], deadline=d["cutoff"])
    flight = Flight(d["batch"], d["version_start"], task, job, reply, tensors, d["cutoff"], d["bad_before"], start)
    flight.simulate(clock, d["cutoff"])
    return flight


def valid_state(v: object, clients: int, shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether `v` is a buffered-mode checkpoint's state: the dispatches so far (`batch`), the last plan's
    state, why dispatching stopped ('' if it did not), whether the last selection was refused by privacy,
    and the clients in flight, each `to_state`'s."""
    if not (isinstance(v, dict) and set(v) == {"batch", "plan", "refused", "denied", "flights"}):
        return False
    if not (_count(v["batch"]) and isinstance(v["plan"], dict)):
        return False
    if not (isinstance(v["refused"], str) and isinstance(v["denied"], bool)):
        return False
    flights = v["flights"]
    if not isinstance(flights, list):
        return False
    seen = set()
    for d in flights:
        if not _valid_flight(d, clients, shapes):
            return False
        seen.add(d["task"]["client"])
    return len(seen) == len(flights)  # a client is in flight at most once


_FLIGHT_KEYS = {"batch", "version_start", "task", "job", "reply", "tensors", "start", "cutoff", "bad_before"}


def _valid_flight(d: object, clients: int, shapes: Mapping[str, tuple[int, ...]]) -> bool:
    if not (isinstance(d, dict) and set(d) == _FLIGHT_KEYS):
        return False
    try:
        task = ClientTask.from_wire(d["task"])
    except (TypeError, ValueError):
        return False
    job, reply, tensors = d["job"], d["reply"], d["tensors"]
    return (
        _count(d["batch"])
        and _count(d["version_start"])
        and 0 <= task.client < clients
        and isinstance(job, list)
        and len(job) == 4
        and all(_count(x) for x in job[:3])
        and isinstance(job[3], bool)
        and isinstance(reply, dict)
        and set(reply) == {"nbytes", "failure", "metrics"}
        and _count(reply["nbytes"])
        and isinstance(reply["failure"], str)
        and isinstance(reply["metrics"], dict)
        and isinstance(d["start"], float)
        and math.isfinite(d["start"])
        and isinstance(d["cutoff"], float)
        and d["cutoff"] >= d["start"] >= 0  # cutoff: inf without a deadline or a time budget
        and isinstance(d["bad_before"], bool)
        and isinstance(tensors, dict)
        and (tensors == {} if reply["failure"] else _tensors(tensors, shapes))
    )


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _tensors(tensors: dict[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> bool:
    if set(tensors) != set(shapes) or not all(isinstance(b, str) for b in tensors.values()):
        return False
    try:
        return all(len(base64.b64decode(b, validate=True)) == 4 * math.prod(shapes[k]) for k, b in tensors.items())
    except binascii.Error:
        return False

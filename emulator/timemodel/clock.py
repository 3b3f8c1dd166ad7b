"""Virtual time of a round: one SimPy process per selected client.

Training has already happened for real when a round is simulated (its results only
decide *what* is uploaded, never *when*), so the clock replays each client's
download -> compute -> upload with the real message sizes and decides, in virtual time,
who arrives, who is lost and who is late.

Round end: when every selected client has delivered, at the last arrival; otherwise the
server cannot know the missing ones will never come, so it waits for the deadline (with
no deadline, until the last client resolved).

Availability: a client that becomes unavailable during its round drops out at that moment
(event "unavailable"): before its download ended it is lost_down, after it lost_up, and a
transfer in flight leaves the link. `selectable` decides who is offered to the policy. A `Drain`
(emulator.energy's batteries) may make a client leave the same way: below its battery's floor at its
start ("low_battery"), or when its battery empties ("battery_empty").

Two engines, one timeline. SimPy runs a round in which something races a client's steps (a
deadline, a server link shared with the others, a client leaving before its steps end). In the
other rounds (the default scenario's) a client's times depend on its own link alone, and `_Queue`
runs the same steps without SimPy's processes and conditions: one entry per event SimPy would
schedule, ordered as SimPy orders them, so that same-instant events keep their order
(tests/unit/test_clock_engines.py). Whether a client leaves in time is known only once its steps
are timed: the queue then gives the round back to SimPy as it found it.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from heapq import heappop, heappush
from typing import Any, Protocol

import numpy as np
import simpy
from simpy.events import NORMAL, URGENT

from emulator.timemodel.availability import ObjectWindows
from emulator.timemodel.available_now import AvailableNow
from emulator.timemodel.network import Network
from emulator.timemodel.resources import ClientResources, Resources
from nodes.contracts.rng import stream
from nodes.contracts.schema import OnUnavailable

NAN = float("nan")
UNAVAILABLE, LOW_BATTERY, BATTERY_EMPTY = "unavailable", "low_battery", "battery_empty"  # why a client left


class Drain(Protocol):
    """What else may make a client leave its task: its battery (emulator.energy.battery.Batteries)."""

    def leaves_at(self, res: ClientResources, job: Job, t0: float) -> tuple[float, str]:
        """When the client leaves the task it starts at t0 for this reason (inf: never), and the event's kind.

        Args:
            res: the client's resources.
            job: its task.
            t0: the task's start.

        Returns:
            (virtual time, LOW_BATTERY | BATTERY_EMPTY).
        """
        ...


class Outcome(StrEnum):
    """How a client's round ended; a str, so tables store and tests compare the plain value."""

    ARRIVED = "arrived"
    LATE = "late"  # the deadline cut its round short
    LOST_DOWN = "lost_down"
    LOST_UP = "lost_up"
    FAILED = "failed"  # its worker reported no update
    IMPLAUSIBLE = "implausible"  # its update arrived, and the server rejected it (aggregate.max_update_norm)


@dataclass
class Job:
    """What the clock needs to know about one client's round."""

    client: int
    bytes_down: int
    steps: int
    bytes_up: int  # size of the real update message (0 when the worker failed)
    failed: bool = False


@dataclass
class ClientTimeline:
    client: int
    outcome: Outcome | None = None  # None until the client's round ends
    t_down_start: float = NAN
    t_down_end: float = NAN
    t_compute_end: float = NAN
    t_up_end: float = NAN
    t_end: float = NAN  # when its round ended for it: arrival, loss, failure or cut
    bytes_down: int = 0
    bytes_up: int = 0  # bytes of an upload that was started
    cut_bits: float = NAN  # bits of a transfer cut short (late, or the client left) that crossed its link
    battery_empty: bool = False  # it left because its battery emptied

    @property
    def trained(self) -> bool:
        """The client received the model, so it ran (and paid privacy for) its local steps."""
        trained = (Outcome.ARRIVED, Outcome.LATE, Outcome.LOST_UP, Outcome.FAILED, Outcome.IMPLAUSIBLE)
        return self.outcome in trained and not math.isnan(self.t_down_end)


@dataclass
class RoundTimeline:
    round: int
    t_start: float
    deadline: float
    t_end: float = NAN
    unavailable: int = 0  # candidates left out at the start as unavailable (on_unavailable=exclude)
    clients: dict[int, ClientTimeline] = field(default_factory=dict)
    events: list[tuple[float, int, str, int]] = field(default_factory=list)  # (t, client, kind, nbytes)


class Clock:
    def __init__(
        self,
        resources: Sequence[ClientResources],
        seed: int,
        server_down_bps: float = 0.0,
        server_up_bps: float = 0.0,
        start: float = 0.0,
        on_unavailable: str = OnUnavailable.EXCLUDE,
        drain: Drain | None = None,
    ):
        self.env = simpy.Environment(initial_time=start)
        self.resources = resources
        self._capacities = (server_down_bps, server_up_bps)
        self.network = Network(self.env, resources, *self._capacities)
        self.seed = seed
        self.on_unavailable = on_unavailable
        self.drain = drain
        self._leaving: dict[int, str] = {}  # why each client of the round would leave at its gone_at
        self._always = isinstance(resources, Resources) and resources.availability.always
        self._left_out = 0  # the unavailable candidates `selectable` left out, counted in the next round's row
        self._now: AvailableNow | None = None  # who is available, made when first asked
        if not self._always and on_unavailable == OnUnavailable.EXCLUDE:  # asked every round: indexed at start
            self._available_now().at(start)

    @property
    def now(self) -> float:
        return self.env.now

    def selectable(self, candidates: Sequence[int], until: float = math.inf) -> Sequence[int]:
        """The candidates to offer the policy for the next round. on_unavailable=drop: all of them (the
        unavailable drop out of their round). exclude: those available now; when none is, virtual time
        first moves on to the first moment one is, if that comes before `until` (else: none)."""
        if self.on_unavailable == OnUnavailable.DROP or self._always:  # always: no time to move, no one left out
            return candidates
        offered = self.available_among(candidates)
        if not len(offered):
            back = self.next_available(candidates)
            if self.now < back <= until and back < math.inf:  # no candidate ever back (none at all): time stays
                self.env.run(until=back)
                offered = self.available_among(candidates)
        self._left_out = len(candidates) - len(offered)
        return offered

    def available_among(self, candidates: Sequence[int]) -> Sequence[int]:
        """The candidates available now, in id order, from every client's windows at once."""
        if self._always:
            return candidates
        now = self._available_now()
        now.at(self.now)
        return now.among(candidates)

    def next_available(self, candidates: Sequence[int]) -> float:
        """The first time from now at which one of the candidates is available (inf: never)."""
        if self._always:
            return self.now if len(candidates) else math.inf
        return self._available_now().next_available(self.now, candidates)

    def _available_now(self) -> AvailableNow:
        if self._now is None:
            r = self.resources
            windows = r.availability.windows if isinstance(r, Resources) else None
            if windows is None:  # a plain sequence of ClientResources: their own objects
                windows = ObjectWindows(len(r), {i: c.availability for i, c in enumerate(r)})
            self._now = AvailableNow(windows)
        return self._now

    def simulate_round(self, rnd: int, jobs: list[Job], deadline: float) -> RoundTimeline:
        tl = RoundTimeline(round=rnd, t_start=self.env.now, deadline=deadline, unavailable=self._left_out)
        tl.events.append((self.env.now, -1, "round_start", 0))
        self._left_out = 0
        jobs = sorted(jobs, key=lambda j: j.client)
        for job in jobs:
            tl.clients[job.client] = ClientTimeline(client=job.client)
        if not self._queue_round(rnd, jobs, tl, deadline):
            self._simpy_round(rnd, jobs, tl, deadline)
        arrived = [c.t_up_end for c in tl.clients.values() if c.outcome is Outcome.ARRIVED]
        if arrived and len(arrived) == len(jobs):
            tl.t_end = max(arrived)
        elif math.isfinite(deadline):
            if self.env.now < deadline:
                self.env.run(until=deadline)
            tl.t_end = deadline
            tl.events.append((deadline, -1, "deadline", 0))
        else:
            tl.t_end = self.env.now
        tl.events.append((tl.t_end, -1, "round_end", 0))
        return tl

    def _simpy_round(self, rnd: int, jobs: list[Job], tl: RoundTimeline, deadline: float) -> None:
        """One process per client, each racing the deadline and its unavailability."""
        env = self.env
        clients = []
        for job in jobs:
            # One deadline event per client: at the deadline the late are cut in client order.
            cutoff = env.timeout(deadline - env.now) if math.isfinite(deadline) else env.event()
            clients.append(env.process(self._client(rnd, job, tl, cutoff)))
        env.run(until=simpy.AllOf(env, clients))

    def _queue_round(self, rnd: int, jobs: list[Job], tl: RoundTimeline, deadline: float) -> bool:
        """The round `_simpy_round` would run, on a `_Queue`, when nothing races: no deadline, no
        shared server link, no client unavailable before its steps end; then a fresh environment at
        the round's end (the old one holds only spent events: nothing waits). False when something
        races, with the timeline and the links as they were."""
        if math.isfinite(deadline) or self.network.shared:
            return False
        events, states = len(tl.events), [self.resources[j.client].loss.bad for j in jobs]
        queue = _Queue(self.env.now)
        for job in jobs:
            queue.start(self._queued_client(queue, rnd, job, tl))
        try:
            queue.run()
        except _Raced:
            del tl.events[events:]
            for job, bad in zip(jobs, states, strict=True):
                tl.clients[job.client] = ClientTimeline(client=job.client)
                self.resources[job.client].loss.bad = bad
            return False
        self.rewind(queue.now)
        return True

    def _queued_client(self, queue: _Queue, rnd: int, job: Job, tl: RoundTimeline) -> _Steps:
        """`_client` when nothing races, started by its Initialize: each yield is one event that
        SimPy schedules for it, as (delay, priority). Its process's end, and the AllOf of all
        clients, order nothing that follows: they are left out; so are its cutoff and the moment it
        becomes unavailable, which fire after its end (else _Raced) and find nothing waiting."""
        c = job.client
        me, res = tl.clients[c], self.resources[c]
        rng = self._loss_rng(rnd, c, res)
        me.t_down_start = now = queue.now
        gone_at = self._gone_at(res, job, now)
        if gone_at == now:
            return self._gone(me, tl, now)
        me.bytes_down = job.bytes_down
        yield from self._queued_steps(queue, c, res, job, rng, tl)
        if queue.now >= now + (gone_at - now):  # SimPy's timeout, scheduled before the client's steps
            raise _Raced

    def _queued_steps(
        self, queue: _Queue, c: int, res: ClientResources, job: Job, rng: np.random.Generator | None, tl: RoundTimeline
    ) -> _Steps:
        """Download, compute, upload: `_client`'s steps after its start."""
        me = tl.clients[c]
        yield from self._queued_transfer(queue, c, res, "down", job.bytes_down, tl)
        if self._downloaded(c, res, job, queue.now, rng, tl):
            return
        yield res.compute_time(job.steps, queue.now), NORMAL  # the compute timeout
        yield 0.0, NORMAL  # compute | cutoff triggers
        yield 0.0, NORMAL  # (compute | cutoff) | gone triggers: the client resumes
        me.t_compute_end, me.bytes_up = queue.now, job.bytes_up
        yield from self._queued_transfer(queue, c, res, "up", job.bytes_up, tl)
        self._uploaded(c, res, job, queue.now, rng, tl)

    def _queued_transfer(
        self, queue: _Queue, c: int, res: ClientResources, direction: str, nbytes: int, tl: RoundTimeline
    ) -> _Steps:
        """`_transfer`'s process (Network.transfer on the client's own link) and the client's race."""
        tl.events.append((queue.now, c, f"{_NAMES[direction]}_start", nbytes))
        yield 0.0, URGENT  # the transfer process's Initialize
        yield res.latency_s, NORMAL  # its latency timeout
        if nbytes:
            yield res.bandwidth(direction).transfer_seconds(nbytes, queue.now), NORMAL  # its bits
        yield 0.0, NORMAL  # the process ends
        yield 0.0, NORMAL  # transfer | cutoff triggers
        yield 0.0, NORMAL  # (transfer | cutoff) | gone triggers: the client resumes

    def rewind(self, t: float) -> None:
        """A fresh environment at time t, between rounds (nothing waits in the old one): after a queued
        round, at its end; after a round that is not committed (a budget it would pass), at its start.
        The links' loss states stay as they are."""
        self.env = simpy.Environment(initial_time=t)
        self.network = Network(self.env, self.resources, *self._capacities)

    def simulate_client(self, rnd: int, job: Job, start: float, cutoff: float) -> RoundTimeline:
        """Buffered mode (emulator.run.buffered): one client's download, compute and upload from `start`,
        alone on its links (no shared server link), cut at `cutoff` (late). Its own SimPy environment:
        the client's timeline is a function of its start, its job and its streams, so that a checkpoint
        can hold a client in flight as its job. `t_end` is when it finished (arrived, lost, failed or cut)."""
        solo = copy.copy(self)
        solo.env = env = simpy.Environment(initial_time=start)
        solo.network = Network(env, {job.client: self.resources[job.client]})
        tl = RoundTimeline(round=rnd, t_start=start, deadline=cutoff)
        tl.clients[job.client] = ClientTimeline(client=job.client)
        stop = env.timeout(cutoff - start) if math.isfinite(cutoff) else env.event()
        env.run(until=env.process(solo._client(rnd, job, tl, stop)))
        tl.t_end = env.now
        return tl

    def _client(self, rnd: int, job: Job, tl: RoundTimeline, cutoff: simpy.Event) -> Generator[simpy.Event, Any, None]:
        """Download, compute, upload: each step races the deadline (`cutoff`) and the moment
        the client becomes unavailable (`gone`)."""
        env, c = self.env, job.client
        me, res = tl.clients[c], self.resources[c]
        rng = self._loss_rng(rnd, c, res)
        me.t_down_start = env.now
        gone_at = self._gone_at(res, job, env.now)
        if gone_at == env.now:
            return self._gone(me, tl, env.now)
        me.bytes_down = job.bytes_down
        gone = env.timeout(gone_at - env.now) if math.isfinite(gone_at) else env.event()
        download = self._transfer(c, "down", job.bytes_down, tl)
        if download not in (yield download | cutoff | gone):
            return self._cut(me, tl, cutoff, download, job.bytes_down)
        if self._downloaded(c, res, job, env.now, rng, tl):
            return
        compute = env.timeout(res.compute_time(job.steps, env.now))
        if compute not in (yield compute | cutoff | gone):
            return self._cut(me, tl, cutoff)
        me.t_compute_end, me.bytes_up = env.now, job.bytes_up
        upload = self._transfer(c, "up", job.bytes_up, tl)
        if upload not in (yield upload | cutoff | gone):
            return self._cut(me, tl, cutoff, upload, job.bytes_up)
        self._uploaded(c, res, job, env.now, rng, tl)

    def _gone_at(self, res: ClientResources, job: Job, now: float) -> float:
        """When the client leaves the task it starts now: it becomes unavailable, or its drain makes it leave,
        whichever comes first (availability at a tie); why is kept for `_gone`."""
        gone_at, self._leaving[job.client] = res.availability.next_unavailable(now), UNAVAILABLE
        if self.drain is not None:
            at, why = self.drain.leaves_at(res, job, now)
            if at < gone_at:
                gone_at, self._leaving[job.client] = at, why
        return gone_at

    def _transfer(self, c: int, direction: str, nbytes: int, tl: RoundTimeline) -> simpy.Process:
        """One message over client c's link, as a process that ends when the last bit is in."""
        tl.events.append((self.env.now, c, f"{_NAMES[direction]}_start", nbytes))
        return self.env.process(self.network.transfer(c, direction, nbytes))

    def _downloaded(
        self, c: int, res: ClientResources, job: Job, now: float, rng: np.random.Generator | None, tl: RoundTimeline
    ) -> bool:
        """Client c's download ended `now`: whether its round ends there (its model lost on the way, or its
        worker reported no update)."""
        me = tl.clients[c]
        me.t_down_end = now
        if self._lost(c, res, "down", me.t_down_start, now, job.bytes_down, rng, tl):
            me.outcome, me.t_end = Outcome.LOST_DOWN, now
            return True
        if job.failed:
            me.outcome, me.t_end = Outcome.FAILED, now
            tl.events.append((now, c, "failed", 0))
            return True
        return False

    def _uploaded(
        self, c: int, res: ClientResources, job: Job, now: float, rng: np.random.Generator | None, tl: RoundTimeline
    ) -> None:
        """Client c's upload ended `now`: it arrived, or was lost on the way."""
        me = tl.clients[c]
        me.t_end = now
        if self._lost(c, res, "up", me.t_compute_end, now, job.bytes_up, rng, tl):
            me.outcome = Outcome.LOST_UP
            return
        me.t_up_end = now
        me.outcome = Outcome.ARRIVED

    def _loss_rng(self, rnd: int, c: int, res: ClientResources) -> np.random.Generator | None:
        """The client's loss draws this round, None when its loss model draws nothing."""
        return stream(self.seed, "loss", rnd, c) if res.loss.draws else None

    def _lost(
        self,
        c: int,
        res: ClientResources,
        direction: str,
        start: float,
        end: float,
        nbytes: int,
        rng: np.random.Generator | None,
        tl: RoundTimeline,
    ) -> bool:
        """Whether the message that went from `start` until `end` (now) was lost on the way."""
        lost = res.loss.lost(direction, start, end, rng)
        tl.events.append((end, c, f"{_NAMES[direction]}_{'lost' if lost else 'end'}", nbytes))
        return lost

    def _cut(
        self,
        me: ClientTimeline,
        tl: RoundTimeline,
        cutoff: simpy.Event,
        transfer: simpy.Process | None = None,
        nbytes: int = 0,
    ) -> None:
        """The deadline (the client is late) or the client's unavailability (it drops) came first;
        a transfer in flight (of `nbytes`) leaves the link, the bits that crossed it kept. At the same
        instant, the deadline counts."""
        if transfer is not None:
            up = not math.isnan(me.t_down_end)
            started = me.t_compute_end if up else me.t_down_start
            direction = "up" if up else "down"
            me.cut_bits = (
                self.network.sent_bits(me.client, direction, started, nbytes) if transfer.is_alive else 8.0 * nbytes
            )
        if cutoff.processed:
            me.outcome, me.t_end = Outcome.LATE, self.env.now
            tl.events.append((self.env.now, me.client, "late", 0))
        else:
            self._gone(me, tl, self.env.now)
        if transfer is not None and transfer.is_alive:
            assert me.outcome is not None  # set just above (LATE, or by _gone)
            transfer.interrupt(me.outcome.value)

    def _gone(self, me: ClientTimeline, tl: RoundTimeline, now: float) -> None:
        """The client left now (it became unavailable, or its battery made it leave): whatever it was doing is
        lost."""
        me.outcome = Outcome.LOST_DOWN if math.isnan(me.t_down_end) else Outcome.LOST_UP
        me.t_end = now
        why = self._leaving.get(me.client, UNAVAILABLE)
        me.battery_empty = why == BATTERY_EMPTY
        tl.events.append((now, me.client, why, 0))


_NAMES = {"down": "download", "up": "upload"}


class _Raced(Exception):
    """A client became unavailable before its steps ended: SimPy runs the round."""


_Steps = Generator[tuple[float, int], None, None]  # a client's steps on a _Queue: (delay, priority) of each


class _Queue:
    """SimPy's event queue without its events: entries ordered by (time, priority, insertion), as
    `simpy.Environment.schedule` orders them, each the next step of a client's generator."""

    def __init__(self, now: float):
        self.now = now
        self._heap: list[tuple[float, int, int, _Steps]] = []
        self._order = itertools.count()

    def start(self, steps: _Steps) -> None:
        """A process's Initialize: urgent, now."""
        heappush(self._heap, (self.now, URGENT, next(self._order), steps))

    def run(self) -> None:
        """Until no entry is left; `now` is then the time of the last one."""
        heap, order = self._heap, self._order
        while heap:
            self.now, _, _, steps = heappop(heap)
            after = next(steps, None)
            if after is not None:
                heappush(heap, (self.now + after[0], after[1], next(order), steps))

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
transfer in flight leaves the link. `selectable` decides who is offered to the policy.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import simpy

from emulator.links import ClientResources, Network, Resources
from nodes.rng import stream
from nodes.schema import OnUnavailable

NAN = float("nan")


class Outcome(StrEnum):
    """How a client's round ended; a str, so tables store and tests compare the plain value."""

    ARRIVED = "arrived"
    LATE = "late"  # the deadline cut its round short
    LOST_DOWN = "lost_down"
    LOST_UP = "lost_up"
    FAILED = "failed"  # its worker reported no update


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
    bytes_down: int = 0
    bytes_up: int = 0  # bytes of an upload that was started

    @property
    def trained(self) -> bool:
        """The client received the model, so it ran (and paid privacy for) its local steps."""
        return self.outcome in (Outcome.ARRIVED, Outcome.LATE, Outcome.LOST_UP, Outcome.FAILED) and not math.isnan(
            self.t_down_end
        )


@dataclass
class RoundTimeline:
    round: int
    t_start: float
    deadline: float
    t_end: float = NAN
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
    ):
        self.env = simpy.Environment(initial_time=start)
        self.resources = resources
        self.network = Network(self.env, resources, server_down_bps, server_up_bps)
        self.seed = seed
        self.on_unavailable = on_unavailable
        self._always = isinstance(resources, Resources) and resources.availability.always
        self._left_out: list[int] = []  # unavailable clients `selectable` left out, recorded by the next round

    @property
    def now(self) -> float:
        return self.env.now

    def selectable(self, candidates: Sequence[int], until: float = math.inf) -> Sequence[int]:
        """The candidates to offer the policy for the next round. on_unavailable=drop: all of them (the
        unavailable drop out of their round). exclude: those available now; when none is, virtual time
        first moves on to the first moment one is, if that comes before `until` (else: none)."""
        if self.on_unavailable == OnUnavailable.DROP:
            return list(candidates)
        if self._always:  # every client available whenever asked: no time to move, no one left out
            return candidates
        back = min((self.resources[c].availability.next_available(self.now) for c in candidates), default=math.inf)
        if self.now < back <= until and back < math.inf:  # no candidate ever back (none at all): time stays
            self.env.run(until=back)
        available = [c for c in candidates if self.resources[c].available(self.now)]
        kept = set(available)  # once: a set per candidate made this quadratic (python -m bench --only scale)
        self._left_out = [c for c in candidates if c not in kept]
        return available

    def simulate_round(self, rnd: int, jobs: list[Job], deadline: float) -> RoundTimeline:
        env = self.env
        tl = RoundTimeline(round=rnd, t_start=env.now, deadline=deadline)
        tl.events.append((env.now, -1, "round_start", 0))
        tl.events.extend((env.now, c, "unavailable", 0) for c in self._left_out)
        self._left_out = []
        clients = []
        for job in sorted(jobs, key=lambda j: j.client):
            tl.clients[job.client] = ClientTimeline(client=job.client)
            # One deadline event per client: at the deadline the late are cut in client order.
            cutoff = env.timeout(deadline - env.now) if math.isfinite(deadline) else env.event()
            clients.append(env.process(self._client(rnd, job, tl, cutoff)))
        env.run(until=simpy.AllOf(env, clients))
        arrived = [c.t_up_end for c in tl.clients.values() if c.outcome is Outcome.ARRIVED]
        if arrived and len(arrived) == len(jobs):
            tl.t_end = max(arrived)
        elif math.isfinite(deadline):
            if env.now < deadline:
                env.run(until=deadline)
            tl.t_end = deadline
            tl.events.append((deadline, -1, "deadline", 0))
        else:
            tl.t_end = env.now
        tl.events.append((tl.t_end, -1, "round_end", 0))
        return tl

    def simulate_client(self, rnd: int, job: Job, start: float, cutoff: float) -> RoundTimeline:
        """Buffered mode (emulator.buffered): one client's download, compute and upload from `start`,
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
        rng = stream(self.seed, "loss", rnd, c) if res.loss.draws else None  # a stream only for a model that draws
        me.t_down_start = env.now
        gone_at = res.availability.next_unavailable(env.now)
        if gone_at == env.now:
            return self._gone(me, tl)
        me.bytes_down = job.bytes_down
        gone = env.timeout(gone_at - env.now) if math.isfinite(gone_at) else env.event()
        download = self._transfer(c, "down", job.bytes_down, tl)
        if download not in (yield download | cutoff | gone):
            return self._cut(me, tl, cutoff, download)
        me.t_down_end = env.now
        if self._lost(c, "down", me.t_down_start, job.bytes_down, rng, tl):
            me.outcome = Outcome.LOST_DOWN
            return
        if job.failed:
            me.outcome = Outcome.FAILED
            tl.events.append((env.now, c, "failed", 0))
            return
        compute = env.timeout(res.compute_time(job.steps, env.now))
        if compute not in (yield compute | cutoff | gone):
            return self._cut(me, tl, cutoff)
        me.t_compute_end, me.bytes_up = env.now, job.bytes_up
        upload = self._transfer(c, "up", job.bytes_up, tl)
        if upload not in (yield upload | cutoff | gone):
            return self._cut(me, tl, cutoff, upload)
        if self._lost(c, "up", me.t_compute_end, job.bytes_up, rng, tl):
            me.outcome = Outcome.LOST_UP
            return
        me.t_up_end = env.now
        me.outcome = Outcome.ARRIVED

    def _transfer(self, c: int, direction: str, nbytes: int, tl: RoundTimeline) -> simpy.Process:
        """One message over client c's link, as a process that ends when the last bit is in."""
        tl.events.append((self.env.now, c, f"{_NAMES[direction]}_start", nbytes))
        return self.env.process(self.network.transfer(c, direction, nbytes))

    def _lost(
        self, c: int, direction: str, start: float, nbytes: int, rng: np.random.Generator | None, tl: RoundTimeline
    ) -> bool:
        """Whether the message that went from `start` until now was lost on the way."""
        lost = self.resources[c].loss.lost(direction, start, self.env.now, rng)
        tl.events.append((self.env.now, c, f"{_NAMES[direction]}_{'lost' if lost else 'end'}", nbytes))
        return lost

    def _cut(
        self, me: ClientTimeline, tl: RoundTimeline, cutoff: simpy.Event, transfer: simpy.Process | None = None
    ) -> None:
        """The deadline (the client is late) or the client's unavailability (it drops) came first;
        a transfer in flight leaves the link. At the same instant, the deadline counts."""
        if cutoff.processed:
            me.outcome = Outcome.LATE
            tl.events.append((self.env.now, me.client, "late", 0))
        else:
            self._gone(me, tl)
        if transfer is not None and transfer.is_alive:
            assert me.outcome is not None  # set just above (LATE, or by _gone)
            transfer.interrupt(me.outcome.value)

    def _gone(self, me: ClientTimeline, tl: RoundTimeline) -> None:
        """The client became unavailable: whatever it was doing is lost."""
        me.outcome = Outcome.LOST_DOWN if math.isnan(me.t_down_end) else Outcome.LOST_UP
        tl.events.append((self.env.now, me.client, "unavailable", 0))


_NAMES = {"down": "download", "up": "upload"}

"""Virtual time of a round: one SimPy process per selected client.

Training has already happened for real when a round is simulated (its results only
decide *what* is uploaded, never *when*), so the clock replays each client's
download -> compute -> upload with the real message sizes and decides, in virtual time,
who arrives, who is lost and who is late.

Round end: when every selected client has delivered, at the last arrival; otherwise the
server cannot know the missing ones will never come, so it waits for the deadline (with
no deadline, until the last client resolved).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import simpy

from emulator.links import ClientResources, Network
from nodes.rng import stream

NAN = float("nan")


@dataclass
class Job:
    """What the clock needs to know about one client's round."""
    client: int
    bytes_down: int
    steps: int
    bytes_up: int        # size of the real update message (0 when the worker failed)
    failed: bool = False


@dataclass
class ClientTimeline:
    client: int
    outcome: str = "pending"   # arrived | late | lost_down | lost_up | failed
    t_down_start: float = NAN
    t_down_end: float = NAN
    t_compute_end: float = NAN
    t_up_end: float = NAN
    bytes_down: int = 0
    bytes_up: int = 0          # bytes of an upload that was started

    @property
    def trained(self) -> bool:
        """The client received the model, so it ran (and paid privacy for) its local steps."""
        return self.outcome in ("arrived", "late", "lost_up", "failed") and not math.isnan(self.t_down_end)


@dataclass
class RoundTimeline:
    round: int
    t_start: float
    deadline: float
    t_end: float = NAN
    clients: dict[int, ClientTimeline] = field(default_factory=dict)
    events: list[tuple[float, int, str, int]] = field(default_factory=list)   # (t, client, kind, nbytes)


class Clock:
    def __init__(self, resources: list[ClientResources], seed: int, server_down_bps: float = 0.0,
                 server_up_bps: float = 0.0, start: float = 0.0):
        self.env = simpy.Environment(initial_time=start)
        self.resources = resources
        self.network = Network(self.env, resources, server_down_bps, server_up_bps)
        self.seed = seed

    @property
    def now(self) -> float:
        return self.env.now

    def simulate_round(self, rnd: int, jobs: list[Job], deadline: float) -> RoundTimeline:
        env = self.env
        tl = RoundTimeline(round=rnd, t_start=env.now, deadline=deadline)
        tl.events.append((env.now, -1, "round_start", 0))
        transfers: dict[int, simpy.Process] = {}
        procs = {}
        for job in sorted(jobs, key=lambda j: j.client):
            tl.clients[job.client] = ClientTimeline(client=job.client)
            procs[job.client] = env.process(self._client(rnd, job, tl, transfers))
        everyone = simpy.AllOf(env, list(procs.values()))
        stops = [everyone] + ([env.timeout(deadline - env.now)] if math.isfinite(deadline) else [])
        env.run(until=simpy.AnyOf(env, stops))
        # (A triggered AnyOf detaches its nested AllOf, so liveness is read off the processes.)
        if any(p.is_alive for p in procs.values()):   # the deadline cut the round: the busy are late
            for c, p in procs.items():
                if p.is_alive:
                    tl.clients[c].outcome = "late"
                    tl.events.append((env.now, c, "late", 0))
                    (transfers[c] if c in transfers and transfers[c].is_alive else p).interrupt("deadline")
            env.run(until=simpy.AllOf(env, list(procs.values())))
        arrived = [c.t_up_end for c in tl.clients.values() if c.outcome == "arrived"]
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

    def _client(self, rnd: int, job: Job, tl: RoundTimeline, transfers: dict):
        env, c = self.env, job.client
        me, res = tl.clients[c], self.resources[c]
        rng = stream(self.seed, "loss", rnd, c)
        ev = tl.events
        try:
            me.t_down_start, me.bytes_down = env.now, job.bytes_down
            got = yield from self._transfer(c, "down", job.bytes_down, rng, tl, transfers)
            if got == "late":
                return
            me.t_down_end = env.now
            if got == "lost":
                me.outcome = "lost_down"
                return
            if job.failed:
                me.outcome = "failed"
                ev.append((env.now, c, "failed", 0))
                return
            yield env.timeout(res.compute_time(job.steps, env.now))
            me.t_compute_end, me.bytes_up = env.now, job.bytes_up
            got = yield from self._transfer(c, "up", job.bytes_up, rng, tl, transfers)
            if got == "late":
                return
            if got == "lost":
                me.outcome = "lost_up"
                return
            me.t_up_end = env.now
            me.outcome = "arrived"
        except simpy.Interrupt:
            return

    def _transfer(self, c: int, direction: str, nbytes: int, rng, tl: RoundTimeline, transfers: dict):
        """One message over client c's link; returns "ok", "lost", or "late" (cut by the deadline)."""
        name = {"down": "download", "up": "upload"}[direction]
        start = self.env.now
        tl.events.append((start, c, f"{name}_start", nbytes))
        transfers[c] = self.env.process(self.network.transfer(c, direction, nbytes))
        yield transfers[c]
        if tl.clients[c].outcome == "late":
            return "late"
        lost = self.resources[c].loss.lost(direction, start, self.env.now, rng)
        tl.events.append((self.env.now, c, f"{name}_lost" if lost else f"{name}_end", nbytes))
        return "lost" if lost else "ok"

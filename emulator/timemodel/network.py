"""The SimPy network that moves bytes in virtual time.

Without a server capacity a transfer is latency plus the exact integral of the client's own
(possibly scheduled) rate. With a capacity C for a direction, the transfers in flight in that
direction are fluid flows that share C by max-min fairness; a `_SharedLink` coordinator process
re-splits the capacity whenever a flow starts, finishes or leaves, or an active client's rate
changes. That is exact for piecewise-constant client rates (schedules, CSV traces); a Mahimahi
packet trace takes part as its fluid equivalent, an approximation (emulator.timemodel.traces says how
far it moves a transfer's end).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import simpy

from emulator.timemodel.bandwidth import Bandwidth, check_direction
from emulator.timemodel.resources import ClientResources
from emulator.timemodel.traces import TracedBandwidth


def max_min_shares(capacity: float, demands: Sequence[float]) -> list[float]:
    """Water-filling: each flow gets min(its demand, fair share of what is left)."""
    shares = [0.0] * len(demands)
    left, waiting = capacity, len(demands)
    for k in sorted(range(len(demands)), key=lambda k: demands[k]):
        fair = left / waiting
        shares[k] = min(demands[k], fair)
        left -= shares[k]
        waiting -= 1
    return shares


class _Flow:
    """One transfer in flight on a shared link."""

    __slots__ = ("bandwidth", "bits", "client_id", "done", "rate", "remaining")

    def __init__(self, env: simpy.Environment, client_id: int, bandwidth: Bandwidth | TracedBandwidth, bits: float):
        self.client_id = client_id
        self.bandwidth = bandwidth
        self.bits = bits
        self.remaining = bits
        self.rate = 0.0
        self.done = env.event()


def _finish(flow: _Flow, now: float) -> float:
    """When the flow ends at its current rate (never while a trace holds its rate at 0)."""
    return now + flow.remaining / flow.rate if flow.rate > 0 else math.inf


class _SharedLink:
    """One direction of the server link: capacity split max-min fairly among active flows.

    A fluid processor-sharing simulation. The coordinator process sleeps until the next
    completion or client rate change, or until a flow joins or leaves (`_wake`); on
    every wake it charges each flow rate * elapsed bits, finishes the flows that are
    done and re-splits the capacity.
    """

    _FINISHED = 1e-9  # relative remaining below which a flow counts as delivered (float dust)

    def __init__(self, env: simpy.Environment, capacity: float):
        self.env = env
        self.capacity = float(capacity)
        self.flows: list[_Flow] = []
        self.since = env.now  # when the flows' remaining bits were last charged
        self._wake = env.event()
        env.process(self._coordinate())

    def join(self, flow: _Flow) -> None:
        self.flows.append(flow)
        self._nudge()

    def leave(self, flow: _Flow) -> None:
        if flow in self.flows:
            self.flows.remove(flow)
            self._nudge()

    def _nudge(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    def _coordinate(self) -> Generator[simpy.Event, Any, None]:
        while True:
            self._settle()
            delay = self._next_event() - self.env.now
            self._wake = self.env.event()
            if math.isinf(delay):
                yield self._wake
            else:
                yield self.env.timeout(max(delay, 0.0)) | self._wake

    def _settle(self) -> None:
        now = self.env.now
        elapsed = now - self.since
        self.since = now
        for flow in self.flows:
            flow.remaining -= flow.rate * elapsed
        while True:
            shares = max_min_shares(self.capacity, [f.bandwidth.rate(now) for f in self.flows])
            for flow, share in zip(self.flows, shares):
                flow.rate = share
            finished = [f for f in self.flows if f.remaining <= self._FINISHED * f.bits or _finish(f, now) <= now]
            if not finished:
                return
            for flow in finished:
                flow.remaining = 0.0
                self.flows.remove(flow)
                flow.done.succeed()

    def _next_event(self) -> float:
        now = self.env.now
        return min((min(_finish(f, now), f.bandwidth.next_change(now)) for f in self.flows), default=math.inf)

    def rates(self) -> dict[int, float]:
        return {f.client_id: f.rate for f in self.flows}


class Network:
    """Transfers in virtual time. `server_*_bps` = 0 means that direction is unlimited."""

    def __init__(
        self,
        env: simpy.Environment,
        clients: Sequence[ClientResources] | Mapping[int, ClientResources],
        server_down_bps: float = 0.0,
        server_up_bps: float = 0.0,
    ):
        self.env = env
        self.clients = clients  # by client id: the run's Resources, or one client's alone (Clock.simulate_client)
        self.shared = {
            direction: _SharedLink(env, capacity)
            for direction, capacity in (("down", server_down_bps), ("up", server_up_bps))
            if capacity > 0
        }

    def transfer(self, client_id: int, direction: str, nbytes: int) -> Generator[simpy.Event, Any, bool]:
        """Process body: `delivered = yield env.process(net.transfer(i, "down", n))`.

        Waits the client's latency, then sends 8*nbytes bits. Returns True once the last
        bit is delivered; returns False if interrupted first (e.g. the round deadline
        passed), having left the shared link so the other flows speed up at once.
        Each call is one flow: a client with two transfers in flight in one direction
        would get two fair shares (the round protocol never does that).
        """
        client = self.clients[client_id]
        bandwidth = client.bandwidth(direction)
        env = self.env
        try:
            yield env.timeout(client.latency_s)
        except simpy.Interrupt:
            return False
        if nbytes == 0:
            return True
        link = self.shared.get(direction)
        if link is None:
            seconds = bandwidth.transfer_seconds(nbytes, env.now)
            end = env.now + seconds
            try:
                yield env.timeout(seconds)
            except simpy.Interrupt:
                return env.now >= end
            return True
        flow = _Flow(env, client_id, bandwidth, 8.0 * nbytes)
        link.join(flow)
        try:
            yield flow.done
        except simpy.Interrupt:
            link.leave(flow)
            return flow.done.triggered
        return True

    def sent_bits(self, client_id: int, direction: str, started: float, nbytes: int) -> float:
        """Bits of client_id's transfer of `nbytes` in `direction`, started at `started` and in flight now,
        that have crossed the link: none during its latency; then its own link's integral, or on a shared
        link what its flow has been given."""
        client, now = self.clients[client_id], self.env.now
        begin = started + client.latency_s
        if now <= begin or not nbytes:
            return 0.0
        link = self.shared.get(direction)
        if link is None:
            sent = client.bandwidth(direction).mean_rate(begin, now) * (now - begin)
        else:
            flow = next((f for f in link.flows if f.client_id == client_id), None)
            if flow is None:  # delivered at this instant, its process not yet resumed
                return 8.0 * nbytes
            sent = flow.bits - flow.remaining + flow.rate * (now - link.since)
        return min(sent, 8.0 * nbytes)

    def rates(self, direction: str) -> dict[int, float]:
        """Current bits/s of each client with a transfer in flight on the shared link
        for `direction` ({} when that direction is unlimited)."""
        check_direction(direction)
        link = self.shared.get(direction)
        return link.rates() if link is not None else {}

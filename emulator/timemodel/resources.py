"""Per-client link and compute model, and the SimPy network that moves bytes in virtual time.

FedScale-style: one `ClientResources` per client holds its two `Bandwidth`s (down, up),
its latency, its seconds per local step and its `LinkLoss` process; the clock asks it
for durations. Time is data (virtual seconds, float); nothing here sleeps.
A direction may follow a trace file instead (`traces.TracedBandwidth`, same interface), the
compute speed a schedule or a trace (`traces.PiecewiseRate` of steps per second), and the
client's reachability an `availability.Availability`.

`Network` is the SimPy side. Without a server capacity a transfer is latency plus the
exact integral of the client's own (possibly scheduled) rate. With a capacity C for a
direction, the transfers in flight in that direction are fluid flows that share C by
max-min fairness; a `_SharedLink` coordinator process re-splits the capacity whenever a
flow starts, finishes or leaves, or an active client's rate changes. That is exact for
piecewise-constant client rates (schedules, CSV traces); a Mahimahi packet trace takes part
as its fluid equivalent, an approximation (emulator.timemodel.traces says how far it moves a transfer's end).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, reduce
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from emulator.timemodel.availability import ALWAYS, Availabilities, Availability, build_availability
from emulator.timemodel.by_index import ByIndex
from emulator.timemodel.traces import PiecewiseRate, Shifted, TracedBandwidth, read_link_trace, read_step_trace, sha256
from nodes.contracts.rng import stream
from nodes.contracts.schema import (
    AvailabilityConfig,
    AvailabilityModel,
    ComputeConfig,
    Dist,
    DistKind,
    DropoutConfig,
    DropoutDirection,
    DropoutModel,
    LinksConfig,
    LinkTraceConfig,
    Scenario,
    SchedulePoint,
    TraceAssign,
    TraceOffset,
)

DIRECTIONS = ("down", "up")


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction = {direction!r}: expected 'down' | 'up'")


# --- per-client quantities ---------------------------------------------------------------


def draw(dist: Dist, n: int, rng: np.random.Generator) -> np.ndarray:
    """n per-client values of `dist` (float64). constant and list consume no randomness;
    lognormal and uniform draw all n values in one call."""
    if dist.kind == DistKind.CONSTANT:
        return np.full(n, float(dist.value))
    if dist.kind == DistKind.LOGNORMAL:
        return rng.lognormal(mean=math.log(dist.median), sigma=dist.sigma, size=n)
    if dist.kind == DistKind.UNIFORM:
        return rng.uniform(dist.low, dist.high, size=n)
    if dist.kind == DistKind.LIST:
        if not dist.values:
            raise ValueError("Dist.values = []: expected a non-empty list when kind=list")
        return np.resize(np.asarray(dist.values, dtype=float), n)
    raise ValueError(f"Dist.kind = {dist.kind!r}: expected constant | lognormal | uniform | list")


# --- bandwidth ---------------------------------------------------------------------------


class Bandwidth:
    """One direction of one client's link: `bps` times a piecewise-constant factor.

    The factor is 1 before the first schedule point and `factor` from each point's `t` on
    (several points at the same t: the last one wins).
    """

    def __init__(self, bps: float, schedule: Iterable[SchedulePoint] = ()):
        if not bps > 0:
            raise ValueError(f"bps = {bps!r}: expected a bandwidth > 0 bits/s")
        by_time: dict[float, float] = {}
        for point in sorted(schedule, key=lambda p: p.t):
            if not point.factor > 0:
                raise ValueError(f"schedule factor = {point.factor!r} at t={point.t}: expected a factor > 0")
            by_time[float(point.t)] = float(point.factor)
        self.bps = float(bps)
        self._change_times: list[float] = []  # times at which the rate really changes
        self._rates: list[float] = [self.bps]  # _rates[k] holds on [_change_times[k-1], _change_times[k])
        factor = 1.0
        for t, f in by_time.items():
            if f != factor:
                self._change_times.append(t)
                self._rates.append(self.bps * f)
                factor = f

    def rate(self, t: float) -> float:
        """Bits/s at virtual time t."""
        return self._rates[bisect_right(self._change_times, t)]

    def next_change(self, t: float) -> float:
        """The first time > t at which the rate changes (inf if it never does)."""
        k = bisect_right(self._change_times, t)
        return self._change_times[k] if k < len(self._change_times) else math.inf

    def transfer_seconds(self, nbytes: int, t0: float) -> float:
        """Seconds to send 8*nbytes bits starting at t0 on this link alone (exact integral)."""
        if nbytes < 0:
            raise ValueError(f"nbytes = {nbytes!r}: expected a byte count >= 0")
        bits = 8.0 * nbytes
        if bits == 0:
            return 0.0
        t = t0
        k = bisect_right(self._change_times, t0)
        while k < len(self._change_times):
            rate, end = self._rates[k], self._change_times[k]
            if rate * (end - t) >= bits:
                break
            bits -= rate * (end - t)
            t = end
            k += 1
        return (t - t0) + bits / self._rates[k]

    def mean_rate(self, t0: float, t1: float) -> float:
        """Bits/s delivered on average over [t0, t1] (t0 < t1): what a client measures of its link."""
        bits, t = 0.0, t0
        while t < t1:
            end = min(self.next_change(t), t1)
            bits += self.rate(t) * (end - t)
            t = end
        return bits / (t1 - t0)

    def __repr__(self) -> str:
        changes = list(zip(self._change_times, self._rates[1:]))
        return f"Bandwidth({self.bps:g} bps, changes={changes})"


# --- losses ------------------------------------------------------------------------------


class LinkLoss:
    """One client's dropout process; the Gilbert-Elliott state persists across rounds.

    Each call to `lost` is one transfer. The loss model runs on every transfer whatever
    its direction (the Gilbert-Elliott chain is the state of the client's link and
    steps once per transfer, transition first, then a loss draw with the new state's
    probability); `cfg.direction` then decides whether this transfer can be lost at all,
    by the model or by an outage window. Draws per call are fixed: none 0,
    bernoulli 1, gilbert_elliott 2 — never dependent on direction or outcome.
    """

    def __init__(self, cfg: DropoutConfig, client_id: int):
        self.cfg = cfg  # its model and direction are admitted choices (emulator.config validates them)
        self.client_id = client_id
        self.directions = set(DIRECTIONS) if cfg.direction == DropoutDirection.BOTH else {cfg.direction}
        self.outages = [(float(o.start), float(o.end)) for o in cfg.outages if not o.clients or client_id in o.clients]
        self.bad = False  # Gilbert-Elliott state; starts good
        # whether a transfer consumes randomness: without, `lost` takes None for its generator
        self.draws = cfg.model in (DropoutModel.BERNOULLI, DropoutModel.GILBERT_ELLIOTT)

    def lost(self, direction: str, t_start: float, t_end: float, rng: np.random.Generator | None) -> bool:
        """Whether the transfer occupying [t_start, t_end] in `direction` is lost."""
        _check_direction(direction)
        by_model = self._step(rng)
        if direction not in self.directions:
            return False
        return by_model or self.in_outage(t_start, t_end)

    def in_outage(self, t_start: float, t_end: float) -> bool:
        """The link is down on [start, end) of each window. A transfer on [t_start, t_end]
        hits a window if it overlaps it for a positive time; a zero-length transfer
        if start <= t_start < end."""
        return any(t_start < end and (t_end > start or start <= t_start) for start, end in self.outages)

    def _step(self, rng: np.random.Generator | None) -> bool:
        cfg = self.cfg
        if not self.draws:
            return False
        assert rng is not None, "a loss model that draws needs the transfer's generator"
        if cfg.model == DropoutModel.BERNOULLI:
            return bool(rng.random() < cfg.p)
        u_transition, u_loss = rng.random(2)  # gilbert_elliott
        if self.bad:
            self.bad = not u_transition < cfg.p_bad_to_good
        else:
            self.bad = bool(u_transition < cfg.p_good_to_bad)
        return bool(u_loss < (cfg.loss_bad if self.bad else cfg.loss_good))


# --- one client --------------------------------------------------------------------------


@dataclass
class ClientResources:
    """FedScale-style per-client metadata: what its link and device can do, and when it is there.

    `down.bps`, `up.bps` and `step_s` are the nominal values (a trace's mean rate; the drawn
    seconds per step); `compute_rate` (steps per second over virtual time, None = always
    1/step_s) and the bandwidths' traces say how they vary."""

    client_id: int
    down: Bandwidth | TracedBandwidth
    up: Bandwidth | TracedBandwidth
    latency_s: float
    step_s: float
    loss: LinkLoss
    compute_rate: PiecewiseRate | Shifted | None = None
    availability: Availability = field(default=ALWAYS)

    @property
    def trace(self) -> str:
        """Names of the client's link trace files, down then up ("" when it follows none)."""
        return ",".join(b.name for b in (self.down, self.up) if isinstance(b, TracedBandwidth))

    def bandwidth(self, direction: str) -> Bandwidth | TracedBandwidth:
        _check_direction(direction)
        return self.down if direction == "down" else self.up

    def download_time(self, nbytes: int, t: float) -> float:
        """Latency, then the bytes on the client's own (unshared) downlink from t + latency."""
        return self.latency_s + self.down.transfer_seconds(nbytes, t + self.latency_s)

    def upload_time(self, nbytes: int, t: float) -> float:
        return self.latency_s + self.up.transfer_seconds(nbytes, t + self.latency_s)

    def compute_time(self, steps: int, t: float) -> float:
        """Seconds for `steps` local steps started at t: the exact integral of the step rate."""
        if self.compute_rate is None:
            return steps * self.step_s
        return self.compute_rate.seconds(steps, t)

    def available(self, t: float) -> bool:
        return self.availability.available(t)

    def step_seconds_at(self, t: float) -> float:
        """Seconds per local step at the device's speed at time t (inf while it computes nothing)."""
        if self.compute_rate is None:
            return self.step_s
        c = self.compute_rate
        rate = c.rate.rate(t + c.offset_s) if isinstance(c, Shifted) else c.rate(t)
        return 1.0 / rate if rate > 0 else math.inf


def build_resources(
    links: LinksConfig, compute: ComputeConfig, availability: AvailabilityConfig, n_clients: int, seed: int
) -> Resources:
    """Every client's `ClientResources`, each made when first asked for (`Resources`). All quantities
    come from stream(seed, "links"), one `draw` per quantity for all clients, in the order down_bps,
    up_bps, latency_s, step_s (drawn whether or not a trace replaces them); trace files and offsets from
    each client's own stream(seed, "trace", i), availability from stream(seed, "availability", i)."""
    rng = stream(seed, "links")
    down = draw(links.down_bps, n_clients, rng)
    up = draw(links.up_bps, n_clients, rng)
    latency = draw(links.latency_s, n_clients, rng)
    step = draw(compute.step_s, n_clients, rng)
    return Resources(links, compute, build_availability(availability, n_clients, seed), seed, (down, up, latency, step))


class Resources(ByIndex[ClientResources]):
    """The clients' resources, columnar: the drawn quantities as arrays of n, and a client's
    `ClientResources` (its link objects, trace picks, availability and loss state) made on first access
    and kept, so that a run holds objects only for the clients it has selected. Iteration makes the
    others afresh without keeping them: what it yields is for reading (a state it changes is lost)."""

    def __init__(
        self,
        links: LinksConfig,
        compute: ComputeConfig,
        availability: Availabilities,
        seed: int,
        drawn: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    ):
        self.links, self.compute, self.availability, self.seed = links, compute, availability, seed
        self.down, self.up, self.latency, self.step = drawn
        self.made: dict[int, ClientResources] = {}

    def __len__(self) -> int:
        return len(self.down)

    def _at(self, i: int) -> ClientResources:
        made = self.made.get(i)
        if made is None:
            made = self.made[i] = self._make(i)
        return made

    def __iter__(self) -> Iterator[ClientResources]:
        return (self.made.get(i) or self._make(i) for i in range(len(self)))

    def _make(self, i: int) -> ClientResources:
        picks, links, step = TracePicks(self.seed, i), self.links, float(self.step[i])
        return ClientResources(
            client_id=i,
            down=picks.link(links.trace, "down") or Bandwidth(float(self.down[i]), links.schedule),
            up=picks.link(links.trace, "up") or Bandwidth(float(self.up[i]), links.schedule),
            latency_s=float(self.latency[i]),
            step_s=step,
            loss=LinkLoss(links.dropout, i),
            compute_rate=picks.compute(self.compute, step),
            availability=self.availability[i],
        )


TRACE_LISTS = ("links.trace.down", "links.trace.up", "compute.trace.files")  # scenario keys of trace file lists


def trace_files(cfg: Scenario) -> list[tuple[str, str]]:
    """(key, path) of every trace and availability file the scenario names."""
    files: list[tuple[str, str]] = []
    for key in TRACE_LISTS:
        paths: list[str] = reduce(getattr, key.split("."), cfg)  # type: ignore[arg-type]  # a dotted key's list
        files += [(f"{key}[{i}]", path) for i, path in enumerate(paths)]
    if cfg.availability.model == AvailabilityModel.CSV:
        files.append(("availability.file", cfg.availability.file))
    return files


def trace_digests(cfg: Scenario) -> dict[str, dict[str, str]]:
    """run.json's record of the files: key -> path and SHA-256."""
    return {key: {"path": path, "sha256": sha256(path)} for key, path in trace_files(cfg)}


class TracePicks:
    """Which trace file, and where in it, a client follows in each use (down, up, compute).

    Its stream(seed, "trace", client) gives a fixed six uniforms, (file, offset) per use, drawn
    whatever the scenario uses: a client's picks depend on its seed and id alone."""

    USES = ("down", "up", "compute")

    def __init__(self, seed: int, client: int):
        self.seed, self.client = seed, client

    @cached_property
    def draws(self) -> dict[str, np.ndarray]:
        """Drawn when a trace is first picked: a client that follows none costs no stream."""
        return dict(zip(self.USES, stream(self.seed, "trace", self.client).random((3, 2)), strict=True))

    def _file(self, files: list[str], assign: str, use: str) -> str:
        if assign == TraceAssign.RANDOM:
            return files[int(self.draws[use][0] * len(files))]
        return files[0] if assign == TraceAssign.SAME else files[self.client % len(files)]

    def _offset(self, period: float, offset: str, use: str) -> float:
        return float(self.draws[use][1] * period) if offset == TraceOffset.RANDOM else 0.0

    def link(self, how: LinkTraceConfig, use: str) -> TracedBandwidth | None:
        """The client's `use` ("down" or "up") direction, None when that direction has no trace files."""
        files = getattr(how, use)
        if not files:
            return None
        path = self._file(files, how.assign, use)
        trace = read_link_trace(path)
        return TracedBandwidth(trace, self._offset(trace.period, how.offset, use), name=Path(path).name)

    def compute(self, cfg: ComputeConfig, step_s: float) -> PiecewiseRate | Shifted | None:
        """Steps per second over virtual time: the client's trace from its offset, or 1/(step_s * factor)
        of the schedule, or None for a constant step_s."""
        if cfg.trace.files:
            trace = read_step_trace(self._file(cfg.trace.files, cfg.trace.assign, "compute"))
            return Shifted(trace, self._offset(trace.period, cfg.trace.offset, "compute"))
        if not cfg.schedule or step_s == 0:
            return None
        factors = _factors(cfg.schedule)
        return PiecewiseRate([t for t, _ in factors], [1.0 / (step_s * f) for _, f in factors])


def _factors(schedule: Iterable[SchedulePoint]) -> list[tuple[float, float]]:
    """(t, factor) from t = 0: 1 before the first point; of points at the same t the last wins."""
    by_time = {0.0: 1.0}
    for point in sorted(schedule, key=lambda p: p.t):
        by_time[float(point.t)] = float(point.factor)
    return sorted(by_time.items())


# --- the SimPy network -------------------------------------------------------------------


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
        self._since = env.now
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
        elapsed = now - self._since
        self._since = now
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

    def rates(self, direction: str) -> dict[int, float]:
        """Current bits/s of each client with a transfer in flight on the shared link
        for `direction` ({} when that direction is unlimited)."""
        _check_direction(direction)
        link = self.shared.get(direction)
        return link.rates() if link is not None else {}

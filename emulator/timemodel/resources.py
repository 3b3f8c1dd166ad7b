"""Per-client link and compute model: what the clock asks for durations.

FedScale-style: one `ClientResources` per client holds its two `Bandwidth`s (down, up),
its latency, its seconds per local step and its `LinkLoss` process; the clock asks it
for durations. Time is data (virtual seconds, float); nothing here sleeps.
A direction may follow a trace file instead (`traces.TracedBandwidth`, same interface), the
compute speed a schedule or a trace (`traces.PiecewiseRate` of steps per second), and the
client's reachability an `availability.Availability`. `network.Network` moves their bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from emulator.timemodel.availability import ALWAYS, Availabilities, Availability, build_availability
from emulator.timemodel.bandwidth import Bandwidth, check_direction
from emulator.timemodel.by_index import ByIndex
from emulator.timemodel.loss import LinkLoss, loss_options
from emulator.timemodel.traces import PiecewiseRate, Shifted, TracedBandwidth, read_link_trace, read_step_trace, sha256
from nodes.contracts.rng import stream
from nodes.contracts.schema import (
    AvailabilityConfig,
    AvailabilityModel,
    ComputeConfig,
    Dist,
    DistKind,
    LinksConfig,
    LinkTraceConfig,
    SchedulePoint,
    TraceAssign,
    TraceOffset,
)

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
        check_direction(direction)
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
        self.loss_options = loss_options(links.dropout)  # parsed once, for every client's LinkLoss
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

    @property
    def links_traced(self) -> bool:
        """Whether links follow trace files: a client's link is then its trace's, not the drawn arrays'."""
        return bool(self.links.trace.down or self.links.trace.up)

    def slowest_round(self, task_bytes: int, steps: int, update_bytes: int) -> float:
        """The most seconds over the clients of a download of task_bytes, `steps` steps and an upload of
        update_bytes, each started at 0 on the client's own link: on the drawn arrays when every link is
        constant (no trace, no schedule), in ClientResources' arithmetic, else client by client."""
        links, compute = self.links, self.compute
        if self.links_traced or links.schedule or compute.trace.files or compute.schedule:
            return max(
                r.download_time(task_bytes, 0.0) + r.compute_time(steps, 0.0) + r.upload_time(update_bytes, 0.0)
                for r in self
            )
        down = self.latency + 8.0 * task_bytes / self.down  # latency + Bandwidth.transfer_seconds
        up = self.latency + 8.0 * update_bytes / self.up
        return float(np.max(down + steps * self.step + up))

    def _make(self, i: int) -> ClientResources:
        picks, links, step = TracePicks(self.seed, i), self.links, float(self.step[i])
        return ClientResources(
            client_id=i,
            down=picks.link(links.trace, "down") or Bandwidth(float(self.down[i]), links.schedule),
            up=picks.link(links.trace, "up") or Bandwidth(float(self.up[i]), links.schedule),
            latency_s=float(self.latency[i]),
            step_s=step,
            loss=LinkLoss(links.dropout, i, self.loss_options),
            compute_rate=picks.compute(self.compute, step),
            availability=self.availability[i],
        )


TRACE_LISTS = ("links.trace.down", "links.trace.up", "compute.trace.files")  # scenario keys of trace file lists


def trace_files(links: LinksConfig, compute: ComputeConfig, availability: AvailabilityConfig) -> list[tuple[str, str]]:
    """(key, path) of every trace and availability file these sections name."""
    lists = (links.trace.down, links.trace.up, compute.trace.files)  # TRACE_LISTS's
    files = [(f"{key}[{i}]", path) for key, paths in zip(TRACE_LISTS, lists) for i, path in enumerate(paths)]
    if availability.model == AvailabilityModel.CSV:
        files.append(("availability.file", availability.file))
    return files


def trace_digests(
    links: LinksConfig, compute: ComputeConfig, availability: AvailabilityConfig
) -> dict[str, dict[str, str]]:
    """run.json's record of the files: key -> path and SHA-256."""
    return {key: {"path": path, "sha256": sha256(path)} for key, path in trace_files(links, compute, availability)}


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

"""Batteries: each client's capacity and charge at t = 0, drawn once; its charge after each task; the
moment a task would empty it, on the clock's own timeline.

A battery drains by its tasks' joules (emulator.energy.task) and charges at `recharge_w` while its client
is unavailable (plugged in), up to its capacity; between tasks nothing else draws on it. At a task's
start the clock asks `leaves_at`: a client below the floor drops then (on_low = drop), and one whose
task would empty its battery leaves at that moment, as if it became unavailable: its update is lost.
The moment is found on the task's planned timeline on its own links (a shared server link would move
it: that combination is refused), where the joules drawn by t never decrease.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from emulator.energy.radio import RadioPower
from emulator.energy.task import TaskEnergy
from emulator.timemodel.availability import Availability
from emulator.timemodel.bandwidth import Bandwidth
from emulator.timemodel.by_index import Without, positions
from emulator.timemodel.clock import BATTERY_EMPTY, LOW_BATTERY, Job, RoundTimeline
from emulator.timemodel.resources import ClientResources, Resources, draw
from emulator.timemodel.traces import TracedBandwidth
from nodes.contracts.rng import stream
from nodes.contracts.schema import BatteryConfig, Dist, DistKind, OnLowBattery

JOULES_PER_WH = 3600.0


class Batteries:
    """The clients' batteries: capacities and initial charges as drawn from stream(seed, "battery") (a
    constant holds no array), and the (time, joules) after each client's last task, for the clients that
    have had one."""

    def __init__(
        self,
        cfg: BatteryConfig,
        n_clients: int,
        seed: int,
        resources: Resources | Sequence[ClientResources],
        radio: RadioPower,
        compute_w: Callable[[int], float],
    ):
        rng = stream(seed, "battery")
        self.capacity_j = per_client(cfg.capacity_wh, n_clients, rng, JOULES_PER_WH)
        self.initial = per_client(cfg.initial, n_clients, rng)
        self.floor, self.drops, self.recharge_w = cfg.floor, cfg.on_low == OnLowBattery.DROP, cfg.recharge_w
        self.n, self.resources, self.radio, self.compute_w = n_clients, resources, radio, compute_w
        self.after: dict[int, tuple[float, float]] = {}
        low = np.flatnonzero(np.broadcast_to(self.initial, (n_clients,)) < cfg.floor)
        self._initially_low = low.tolist() if len(low) < n_clients or n_clients == 0 else range(n_clients)

    def capacity(self, c: int) -> float:
        return _value(self.capacity_j, c)

    def table_columns(self, ids: Sequence[int]) -> dict[str, np.ndarray]:
        """The clients table's battery columns for these clients: capacity and charge at t = 0, joules."""
        at = np.asarray(ids, dtype=np.int64)
        capacity = np.broadcast_to(self.capacity_j, (self.n,))[at]
        initial = np.broadcast_to(self.initial, (self.n,))[at]
        return {"battery_capacity_j": capacity, "battery_initial_j": initial * capacity}

    def level(self, c: int, t: float) -> float:
        """Client c's charge at t, joules: after its last task (or at 0), plus what it charged since while
        it was unavailable."""
        since, joules = self.after.get(c, (0.0, _value(self.initial, c) * self.capacity(c)))
        if self.recharge_w > 0 and t > since:
            charged = self.recharge_w * unavailable_seconds(self.resources[c].availability, since, t)
            joules = min(self.capacity(c), joules + charged)
        return joules

    def low(self, c: int, t: float) -> bool:
        return self.level(c, t) < self.floor * self.capacity(c)

    def offered(self, candidates: Sequence[int], t: float) -> Sequence[int]:
        """The candidates but those below the floor at t (on_low = skip), without a list of the rest: the
        clients that have had a task, and those that started below the floor, are the ones asked."""
        if self.drops:
            return candidates
        asked = sorted({*self.after, *self._initially_low}) if self.after else self._initially_low
        low = [c for c in asked if self.low(c, t)]
        if not low:
            return candidates
        at = positions(candidates, low)
        left_out = [int(p) for p, c in zip(at, low) if 0 <= p < len(candidates) and candidates[int(p)] == c]
        return Without(candidates, left_out)

    def leaves_at(self, res: ClientResources, job: Job, t0: float) -> tuple[float, str]:
        """When client res.client_id leaves the task it starts at t0, for its battery, and the event's kind:
        at once below the floor (on_low = drop), when its planned task would empty it, else never (inf)."""
        c = res.client_id
        if self.drops and self.low(c, t0):
            return t0, LOW_BATTERY
        return empty_at(self.level(c, t0), res, job, t0, self.radio, self.compute_w(c)), BATTERY_EMPTY

    def settle(
        self, energy: dict[int, TaskEnergy], tl: RoundTimeline
    ) -> tuple[dict[int, TaskEnergy], dict[int, tuple[float, float]]]:
        """Each task's joules, its last tail cut where the battery emptied during it (a battery gives no more
        than its charge), and its battery's (charge at the task's start, charge at its end), joules."""
        capped, charges = {}, {}
        for c, e in energy.items():
            start = self.level(c, tl.clients[c].t_down_start)
            excess = e.total_j - start
            capped[c] = replace(e, tail_j=max(0.0, e.tail_j - excess)) if excess > 0 else e
            charges[c] = (start, max(0.0, start - capped[c].total_j))
        return capped, charges

    def spend(self, charges: dict[int, tuple[float, float]], tl: RoundTimeline) -> None:
        """A committed round's tasks leave their batteries at their end charges."""
        for c, (_, end) in charges.items():
            self.after[c] = (tl.clients[c].t_end, end)


def empty_at(joules: float, res: ClientResources, job: Job, t0: float, radio: RadioPower, compute_w: float) -> float:
    """When a task started at t0 with `joules` in its battery would have drawn them all (inf: it never would),
    along its planned download, training and upload on its own links: the joules drawn by t are
    task_energy's for the task cut at t, without its last tail."""
    latency = res.latency_s
    down_end = t0 + res.download_time(job.bytes_down, t0)

    def downloading(t: float) -> float:
        return radio.transfer_j("down", t - t0, _crossed(res.down, t0 + latency, t, job.bytes_down))

    if downloading(down_end) >= joules:
        return _first_reaching(downloading, t0, down_end, joules)
    if job.failed:
        return math.inf
    drawn = radio.transfer_j("down", down_end - t0, 8.0 * job.bytes_down)
    compute_end = down_end + res.compute_time(job.steps, down_end)

    def training(t: float) -> float:
        return drawn + compute_w * (t - down_end) + radio.tail_j(t - down_end)

    if training(compute_end) >= joules:
        return _first_reaching(training, down_end, compute_end, joules)
    drawn = training(compute_end)
    up_end = compute_end + res.upload_time(job.bytes_up, compute_end)

    def uploading(t: float) -> float:
        return drawn + radio.transfer_j("up", t - compute_end, _crossed(res.up, compute_end + latency, t, job.bytes_up))

    if uploading(up_end) >= joules:
        return _first_reaching(uploading, compute_end, up_end, joules)
    return math.inf


def unavailable_seconds(availability: Availability, t0: float, t1: float) -> float:
    """Seconds of [t0, t1] in which the client is unavailable, window by window."""
    total, t = 0.0, t0
    while t < t1:
        if availability.available(t):
            t = min(availability.next_unavailable(t), t1)
        else:
            back = min(availability.next_available(t), t1)
            total, t = total + back - t, back
    return total


def _crossed(link: Bandwidth | TracedBandwidth, begin: float, t: float, nbytes: int) -> float:
    """Bits of a transfer of nbytes whose bits start at `begin` that have crossed its own link by t."""
    if t <= begin or not nbytes:
        return 0.0
    return min(8.0 * nbytes, link.mean_rate(begin, t) * (t - begin))


def _first_reaching(drawn: Callable[[float], float], lo: float, hi: float, joules: float) -> float:
    """The first t in [lo, hi] with drawn(t) >= joules (drawn never decreases, drawn(hi) >= joules), to the
    float: bisection until lo and hi are adjacent."""
    if drawn(lo) >= joules:
        return lo
    while True:
        mid = lo + (hi - lo) / 2
        if mid <= lo or mid >= hi:
            return hi
        if drawn(mid) >= joules:
            hi = mid
        else:
            lo = mid


def per_client(dist: Dist, n: int, rng: np.random.Generator, unit: float = 1.0) -> float | np.ndarray:
    """n clients' values of `dist` times `unit`: one float for a constant (no array, no draw), else `draw`'s."""
    if dist.kind == DistKind.CONSTANT:
        return float(dist.value) * unit
    return draw(dist, n, rng) * unit


def _value(values: float | np.ndarray, c: int) -> float:
    return values if isinstance(values, float) else float(values[c])

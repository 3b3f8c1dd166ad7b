"""What the keys of the time model mean together: links (their distributions, dropouts and
outages), compute speed, traces (every file read and parsed), availability and energy."""

from __future__ import annotations

import math
from collections.abc import Callable

from emulator.config.errors import PROBLEM_CHARS, ConfigError, check, clip
from emulator.config.server_scenario import value_at
from emulator.timemodel.availability import read_windows
from emulator.timemodel.loss import LossModelLoadError, loss_options
from emulator.timemodel.resources import TRACE_LISTS, trace_files
from emulator.timemodel.traces import TraceError, read_link_trace, read_step_trace
from nodes.contracts import schema
from nodes.contracts.schema import (
    AvailabilityModel,
    Dist,
    DistKind,
    DropoutDirection,
    OnLowBattery,
    OnUnavailable,
    Radio,
    RoundMode,
    TraceAssign,
    TraceOffset,
)


def validate_time_model(c: schema.Scenario) -> None:
    """Links, compute, traces, availability and energy, in that order (the first failure is the one reported)."""
    _validate_links(c)
    _check_dist(c.compute.step_s, "compute.step_s", 0, "seconds")
    _validate_traces(c)
    _validate_availability(c)
    _validate_energy(c)


def _validate_energy(c: schema.Scenario) -> None:
    """energy.*, and budget.energy_j and batteries only where energy is modelled, in rounds (sync mode)."""
    e = c.energy
    check(Radio.admits(e.radio), "energy.radio", e.radio, Radio.describe())
    _check_dist(e.compute_w, "energy.compute_w", 0, "watts")
    if e.battery.enabled:
        _validate_battery(c)
    if math.isfinite(c.budget.energy_j):
        check(e.radio != Radio.NONE, "budget.energy_j", c.budget.energy_j, "inf while energy.radio = none")
        check(
            c.round.mode == RoundMode.SYNC,
            "budget.energy_j",
            c.budget.energy_j,
            f"inf under round.mode = {c.round.mode} (an energy budget is checked round by round, in sync mode)",
        )


def _check_dist(d: Dist, key: str, minimum: float, unit: str) -> None:
    """The values d's kind uses are at least `minimum` (their Range already bounds them)."""
    check(DistKind.admits(d.kind), f"{key}.kind", d.kind, DistKind.describe())
    at_least = f"a number >= {minimum:g} ({unit})"
    if d.kind == DistKind.CONSTANT:
        check(d.value >= minimum, f"{key}.value", d.value, at_least)
    elif d.kind == DistKind.LOGNORMAL:
        check(
            d.median > 0 and d.median >= minimum,
            f"{key}.median",
            d.median,
            at_least if minimum else f"a number > 0 ({unit})",
        )
    elif d.kind == DistKind.UNIFORM:
        check(d.low >= minimum, f"{key}.low", d.low, at_least)
        check(d.high >= d.low, f"{key}.high", d.high, f"a number >= low ({d.low})")
    else:
        check(len(d.values) > 0, f"{key}.values", d.values, f"a non-empty list of numbers >= {minimum:g} ({unit})")
        for i, v in enumerate(d.values):
            check(v >= minimum, f"{key}.values[{i}]", v, at_least)


def _validate_links(c: schema.Scenario) -> None:
    L = c.links
    _check_dist(L.down_bps, "links.down_bps", 1, "bits/s")
    _check_dist(L.up_bps, "links.up_bps", 1, "bits/s")
    _check_dist(L.latency_s, "links.latency_s", 0, "seconds")
    for k in ("server_down_bps", "server_up_bps"):
        v = getattr(L, k)
        check(v == 0 or v >= 1, f"links.{k}", v, "0 (unlimited) or a capacity >= 1 bit/s")
    d = L.dropout
    try:
        loss_options(d)  # the model, a user's imported now, and its links.dropout.args
    except LossModelLoadError as e:
        raise ConfigError(str(e)) from None
    check(DropoutDirection.admits(d.direction), "links.dropout.direction", d.direction, DropoutDirection.describe())
    for i, o in enumerate(d.outages):
        check(o.end > o.start, f"links.dropout.outages[{i}].end", o.end, f"a time > start ({o.start})")
        bad = [k for k in o.clients if not 0 <= k < c.clients.n]
        check(not bad, f"links.dropout.outages[{i}].clients", o.clients, f"client ids in [0, {c.clients.n})")


def _validate_traces(c: schema.Scenario) -> None:
    """Assignment rules known, no schedule beside a trace, and every file readable and well-formed."""
    for key, how in (("links.trace", c.links.trace), ("compute.trace", c.compute.trace)):
        check(TraceAssign.admits(how.assign), f"{key}.assign", how.assign, TraceAssign.describe())
        check(TraceOffset.admits(how.offset), f"{key}.offset", how.offset, TraceOffset.describe())
    for key in TRACE_LISTS:
        files = value_at(c, key.split("."))
        assign = value_at(c, key.split(".")[:-1]).assign
        check(assign != TraceAssign.SAME or len(files) <= 1, key, files, "a single file when assign=same")
    traced = c.links.trace.down or c.links.trace.up
    check(
        not (traced and c.links.schedule),
        "links.schedule",
        c.links.schedule,
        "no schedule beside links.trace (a trace has its own time variation)",
    )
    check(
        not (c.compute.trace.files and c.compute.schedule),
        "compute.schedule",
        c.compute.schedule,
        "no schedule beside compute.trace.files (a trace has its own time variation)",
    )
    for key, path in trace_files(c.links, c.compute, c.availability):
        if key.startswith("links."):
            _parsed(key, path, read_link_trace, "a Mahimahi trace or a .csv of t_s,bps")
        elif key.startswith("compute."):
            _parsed(key, path, read_step_trace, "a .csv of t_s,step_s")


def _parsed(key: str, path: str, read: Callable[[str], object], expected: str) -> None:
    """`read(path)` succeeds, or else a ConfigError naming the key, the file and what is wrong with it."""
    try:
        read(path)
    except TraceError as e:
        raise ConfigError(
            f"{clip(key)} = {clip(repr(path))}: expected {expected}: {clip(str(e), PROBLEM_CHARS)}"
        ) from None


def _validate_availability(c: schema.Scenario) -> None:
    a = c.availability
    check(AvailabilityModel.admits(a.model), "availability.model", a.model, AvailabilityModel.describe())
    check(
        OnUnavailable.admits(a.on_unavailable),
        "availability.on_unavailable",
        a.on_unavailable,
        OnUnavailable.describe(),
    )
    if a.model == AvailabilityModel.CSV:
        check(bool(a.file), "availability.file", a.file, "a CSV file of client,t_start,t_end when model=csv")
        _parsed(
            "availability.file",
            a.file,
            lambda p: read_windows(p, c.clients.n, a.repeat_s),
            f"a .csv of client,t_start,t_end rows (client ids in [0, {c.clients.n})"
            + (f", every t_end <= availability.repeat_s = {a.repeat_s:g})" if a.repeat_s else ")"),
        )


def _validate_battery(c: schema.Scenario) -> None:
    """energy.battery.*: a radio model to drain it, a fraction of the capacity to start from, and the client's
    own links (a task's end on a shared server link depends on the others', so its battery's could not be
    known as it starts)."""
    b, key = c.energy.battery, "energy.battery.enabled"
    check(c.energy.radio != Radio.NONE, key, b.enabled, "false while energy.radio = none")
    check(OnLowBattery.admits(b.on_low), "energy.battery.on_low", b.on_low, OnLowBattery.describe())
    _check_dist(b.capacity_wh, "energy.battery.capacity_wh", 1e-6, "watt-hours")
    d = b.initial
    check(d.kind != DistKind.LOGNORMAL, "energy.battery.initial.kind", d.kind, "constant | uniform | list (a fraction)")
    _check_dist(d, "energy.battery.initial", 0, "a fraction of the capacity")
    for name, v in {"value": d.value, "high": d.high, **{f"values[{i}]": x for i, x in enumerate(d.values)}}.items():
        check(v <= 1, f"energy.battery.initial.{name}", v, "a fraction of the capacity, <= 1")
    shared = c.links.server_down_bps > 0 or c.links.server_up_bps > 0
    check(not shared, key, b.enabled, "false while links.server_down_bps or links.server_up_bps is set")
    check(c.round.mode == RoundMode.SYNC, key, b.enabled, f"false under round.mode = {c.round.mode} (sync only)")

"""The scenario's time model: per-client links and compute (`Dist`, schedules, outages, losses, traces),
availability, and the energy that the clients' radios and processors draw, with their admitted ranges."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nodes.contracts.schema.settings import (
    CLIENT_ID,
    MAX_SECONDS,
    PROBABILITY,
    QUANTITY,
    TIME,
    Choice,
    Range,
    setting,
)

# --- allowed values: one Choice per text key with a fixed set, read by validation and code alike


class DistKind(Choice):
    CONSTANT = "constant"
    LOGNORMAL = "lognormal"
    UNIFORM = "uniform"
    LIST = "list"


class DropoutDirection(Choice):
    UP = "up"
    DOWN = "down"
    BOTH = "both"


class TraceAssign(Choice):
    SAME = "same"  # the first file for every client
    ROUND_ROBIN = "round_robin"  # client i gets file i mod len(files)
    RANDOM = "random"  # a file drawn per client from its own stream(seed, "trace", i)


class TraceOffset(Choice):
    ZERO = "zero"  # every client starts at the beginning of its trace
    RANDOM = "random"  # each client starts at a uniform point of its trace's period


class AvailabilityModel(Choice):
    ALWAYS = "always"
    CSV = "csv"
    DIURNAL = "diurnal"


class Radio(Choice):
    NONE = "none"  # energy is not modelled
    LTE = "lte"
    WIFI = "wifi"


class OnLowBattery(Choice):
    SKIP = "skip"  # a client below the floor is not offered to the policy
    DROP = "drop"  # it may be selected, and drops out of its round at its start


class OnUnavailable(Choice):
    EXCLUDE = "exclude"  # clients unavailable at the start of a round are not offered to the policy
    DROP = "drop"  # they may be selected, and drop out of the round at once


# --- per-client quantities -------------------------------------------------------------


@dataclass
class Dist:
    """A per-client quantity, drawn once per client from the client's own RNG stream."""

    kind: str = setting("constant", DistKind.describe())
    value: float = setting(0.0, "the value when kind=constant")
    median: float = setting(0.0, "median when kind=lognormal")
    sigma: float = setting(0.0, "log-space standard deviation when kind=lognormal")
    low: float = setting(0.0, "lower bound when kind=uniform")
    high: float = setting(0.0, "upper bound when kind=uniform")
    values: list[float] = setting(None, "one value per client when kind=list (cycled)", list)


def const(v: float) -> Callable[[], Dist]:
    return lambda: Dist(kind=DistKind.CONSTANT.value, value=v)


@dataclass
class SchedulePoint:
    t: float = setting(0.0, "virtual time (s) from which the factor applies")
    factor: float = setting(
        1.0,
        "multiplier from t on (piecewise constant): of the bandwidth in links.schedule, "
        "of the seconds per step in compute.schedule",
    )


@dataclass
class Outage:
    clients: list[int] = setting(None, "client ids the window applies to (empty = all)", list)
    start: float = setting(0.0, "outage start, virtual seconds")
    end: float = setting(0.0, "outage end, virtual seconds")


@dataclass
class DropoutConfig:
    model: str = setting("none", "the loss model of every transfer (emulator.timemodel.loss.LOSS_MODELS)")
    p: float = setting(0.0, "bernoulli: loss probability per transfer")
    p_good_to_bad: float = setting(0.1, "gilbert_elliott: P(good -> bad) per transfer")
    p_bad_to_good: float = setting(0.5, "gilbert_elliott: P(bad -> good) per transfer")
    loss_good: float = setting(0.0, "gilbert_elliott: loss probability in the good state")
    loss_bad: float = setting(1.0, "gilbert_elliott: loss probability in the bad state")
    direction: str = setting("both", f"which transfers can be lost: {DropoutDirection.describe()}")
    outages: list[Outage] = setting(None, "scheduled outage windows; a transfer overlapping one is lost", list)
    args: dict[str, Any] = setting(
        None, "options of a user's loss model (model=package.module:ClassName), checked by its Options dataclass", dict
    )


@dataclass
class LinkTraceConfig:
    down: list[str] = setting(
        None,
        "download bandwidth trace files: Mahimahi packet-delivery (one millisecond "
        "timestamp per 1500-byte opportunity) or .csv rows t_s,bps; relative paths are "
        "looked up next to the scenario file, then in scenarios/",
        list,
    )
    up: list[str] = setting(
        None,
        "upload bandwidth trace files (as down); a direction without files keeps links.up_bps / links.down_bps",
        list,
    )
    assign: str = setting("round_robin", f"which file a client gets: {TraceAssign.describe()}")
    offset: str = setting("zero", f"where in its trace a client is at t=0: {TraceOffset.describe()}")


@dataclass
class LinksConfig:
    down_bps: Dist = setting(None, "download bandwidth per client, bits/s", const(20e6))
    up_bps: Dist = setting(None, "upload bandwidth per client, bits/s", const(5e6))
    latency_s: Dist = setting(None, "one-way latency per transfer, seconds", const(0.05))
    schedule: list[SchedulePoint] = setting(
        None, "piecewise-constant bandwidth factor over virtual time (all clients)", list
    )
    server_down_bps: float = setting(
        0.0, "shared server egress capacity, bits/s, split fairly among concurrent downloads (0 = unlimited)"
    )
    server_up_bps: float = setting(
        0.0, "shared server ingress capacity, bits/s, split fairly among concurrent uploads (0 = unlimited)"
    )
    dropout: DropoutConfig = setting(None, "link losses", DropoutConfig)
    trace: LinkTraceConfig = setting(
        None,
        "per-client bandwidth traces, repeated when they end (instead of down_bps/up_bps and schedule)",
        LinkTraceConfig,
    )


@dataclass
class ComputeTraceConfig:
    files: list[str] = setting(
        None,
        "per-client compute traces, .csv rows t_s,step_s (seconds per step from t_s "
        "to the next row; the last row's t_s ends the trace, which repeats)",
        list,
    )
    assign: str = setting("round_robin", f"which file a client gets: {TraceAssign.describe()}")
    offset: str = setting("zero", f"where in its trace a client is at t=0: {TraceOffset.describe()}")


@dataclass
class ComputeConfig:
    step_s: Dist = setting(None, "virtual seconds per DP-SGD step per client", const(0.05))
    schedule: list[SchedulePoint] = setting(
        None, "piecewise-constant factor on every client's seconds per step over virtual time", list
    )
    trace: ComputeTraceConfig = setting(
        None, "per-client seconds-per-step traces (instead of step_s and schedule)", ComputeTraceConfig
    )


@dataclass
class AvailabilityConfig:
    model: str = setting("always", f"when clients can be reached: {AvailabilityModel.describe()}")
    file: str = setting(
        "",
        "model=csv: rows client,t_start,t_end, the intervals in which the client is available "
        "(a client without rows is always available); looked up like trace files",
    )
    on_unavailable: str = setting(
        "exclude",
        f"{OnUnavailable.describe()}: a client unavailable at a round's start "
        "is not offered to the policy (exclude) or drops out of the round (drop); "
        "one that becomes unavailable during its round drops either way",
    )
    repeat_s: float = setting(
        0.0,
        "model=csv: the file's windows repeat with this period, virtual seconds (each must end by it); "
        "0 = they happen once, and after its last window a client with rows stays unavailable",
    )
    period_s: float = setting(86400.0, "model=diurnal: period of the availability probability, virtual seconds")
    mean: float = setting(0.6, "model=diurnal: mean probability that a client is available")
    amplitude: float = setting(0.3, "model=diurnal: amplitude of the sinusoid around the mean")
    phase_spread_s: float = setting(
        0.0,
        "model=diurnal: each client's phase is uniform in [0, phase_spread_s) "
        "(0 = all in step; period_s = spread over the whole day)",
    )


@dataclass
class BatteryConfig:
    enabled: bool = setting(
        False,
        "model each client's battery: its tasks drain it, it recharges while the client is unavailable, and a "
        "client whose battery empties during a task fails then (docs/energy.md#batteries)",
    )
    capacity_wh: Dist = setting(
        None,
        "battery capacity per client, watt-hours (the default 15 Wh is a round figure for a phone, not a measurement)",
        const(15.0),
    )
    initial: Dist = setting(None, "each client's charge at time 0, a fraction of its capacity", const(1.0))
    floor: float = setting(0.2, "a client below this fraction of its capacity at a round's start takes no task")
    on_low: str = setting(
        "skip",
        f"{OnLowBattery.describe()}: a client below the floor is not offered to the policy (skip) or drops out of "
        "its round at its start (drop)",
    )
    recharge_w: float = setting(0.0, "watts a battery charges at while its client is unavailable; 0 = never")


@dataclass
class EnergyConfig:
    radio: str = setting(
        "none",
        f"{Radio.describe()}: the clients' radio power model, Huang et al. (MobiSys 2012), docs/energy.md; "
        "none = energy is not modelled",
    )
    compute_w: Dist = setting(
        None,
        "watts a client's device draws while it trains (the default 2 W is a round figure, not a measurement: "
        "set your devices')",
        const(2.0),
    )
    battery: BatteryConfig = setting(None, "the clients' batteries", BatteryConfig)


RANGES: dict[type, dict[str, Range]] = {
    Dist: dict(value=QUANTITY, median=QUANTITY, sigma=Range(0, 10), low=QUANTITY, high=QUANTITY, values=QUANTITY),
    SchedulePoint: dict(t=TIME, factor=Range(1e-6, 1e6)),
    Outage: dict(clients=CLIENT_ID, start=TIME, end=TIME),
    DropoutConfig: dict(
        p=PROBABILITY, p_good_to_bad=PROBABILITY, p_bad_to_good=PROBABILITY, loss_good=PROBABILITY, loss_bad=PROBABILITY
    ),
    LinksConfig: dict(server_down_bps=QUANTITY, server_up_bps=QUANTITY),
    BatteryConfig: dict(floor=PROBABILITY, recharge_w=QUANTITY),
    AvailabilityConfig: dict(
        repeat_s=TIME,
        period_s=Range(0, MAX_SECONDS, low_open=True),
        mean=PROBABILITY,
        amplitude=PROBABILITY,
        phase_spread_s=TIME,
    ),
}

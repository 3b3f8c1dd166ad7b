"""The scenario schema: typed dataclasses with defaults, the admitted Range of every number,
and the scenario as plain data (what run.json keeps and what the server sends its workers).

Every process reads it: the server loads and validates a scenario (emulator.config), a worker
rebuilds it from the task message. The sections of the server's policies are theirs
(emulator.policies); this is what every run has.

One module a part, each section with its admitted ranges: `settings` (setting, Choice, Range and
the bounds they share), `links` (the time model: links, compute, availability), `learning` (data,
model, clients, DP-SGD, impact factors), `run` (budgets, rounds, training, compression, evaluation,
devices, transport, output). Here: the `Scenario` they make up, every section's Range (RANGES), and
the scenario as plain data (to_dict, from_dict); every name of the parts is importable from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, is_dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar, cast, get_args, get_origin, get_type_hints, overload

from nodes.contracts.schema import learning, links, run
from nodes.contracts.schema.learning import (
    FIXED_IMPACT,
    ClientGroup,
    ClientsConfig,
    Conversion,
    DataConfig,
    DPConfig,
    EmptyBatch,
    ImpactConfig,
    ImpactKind,
    ImpactPhase,
    ModelConfig,
    Normalization,
    Partition,
    PerSample,
    QualityRule,
    Selection,
    Split,
)
from nodes.contracts.schema.links import (
    AvailabilityConfig,
    AvailabilityModel,
    BatteryConfig,
    ComputeConfig,
    ComputeTraceConfig,
    Dist,
    DistKind,
    DropoutConfig,
    DropoutDirection,
    EnergyConfig,
    LinksConfig,
    LinkTraceConfig,
    OnLowBattery,
    OnUnavailable,
    Outage,
    Radio,
    SchedulePoint,
    TraceAssign,
    TraceOffset,
    const,
)
from nodes.contracts.schema.run import (
    BUNDLE_AUTO,
    NO_COMPRESSION,
    AggregateConfig,
    BudgetConfig,
    BufferedConfig,
    CompressionConfig,
    Device,
    EvalConfig,
    GpuConfig,
    Launcher,
    OutputConfig,
    RayConfig,
    RoundConfig,
    RoundMode,
    Staleness,
    TrainConfig,
    TransportConfig,
    bundle_size,
)
from nodes.contracts.schema.settings import (
    CLIENT_ID,
    FINITE,
    MAX_CLIENTS,
    MAX_GPUS,
    MAX_PARAMETER,
    MAX_QUANTITY,
    MAX_ROUNDS,
    MAX_SAMPLES,
    MAX_SECONDS,
    MAX_STEPS,
    MAX_WORKERS,
    NON_NEGATIVE,
    OPEN_UNIT,
    POSITIVE,
    PROBABILITY,
    QUANTITY,
    ROUND,
    TIME,
    Choice,
    Range,
    setting,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")


@dataclass
class Scenario:
    """What every process of a run reads; the server's ServerScenario (emulator.config) adds one section
    of options per policy."""

    name: str = setting("default", "scenario name")
    seed: int = setting(0, "the one seed that drives everything")
    policy: str = setting("fedavg_dp", "server policy")
    workers: int = setting(0, "worker processes (0 = one per CPU core; on GPUs, gpu.workers_per_gpu per GPU)")
    device: str = setting(
        "auto", f"{Device.describe()} (auto: cuda when torch sees a GPU; local workers placed per gpu.*)"
    )
    gpu: GpuConfig = setting(None, "where local workers and the evaluator train when the device is cuda", GpuConfig)
    data: DataConfig = setting(None, "dataset and partition", DataConfig)
    model: ModelConfig = setting(None, "model", ModelConfig)
    clients: ClientsConfig = setting(None, "clients and selection", ClientsConfig)
    dp: DPConfig = setting(None, "client-side DP-SGD", DPConfig)
    links: LinksConfig = setting(None, "network links", LinksConfig)
    compute: ComputeConfig = setting(None, "client compute speed", ComputeConfig)
    availability: AvailabilityConfig = setting(None, "when clients can be reached", AvailabilityConfig)
    energy: EnergyConfig = setting(None, "the energy of the clients' tasks", EnergyConfig)
    impact: ImpactConfig = setting(None, "aggregation impact factors", ImpactConfig)
    budget: BudgetConfig = setting(None, "budgets; the run stops at the first exhausted", BudgetConfig)
    round: RoundConfig = setting(None, "round timing", RoundConfig)
    buffered: BufferedConfig = setting(None, "buffered and asynchronous aggregation (round.mode)", BufferedConfig)
    train: TrainConfig = setting(None, "how workers train a round's clients", TrainConfig)
    compression: CompressionConfig = setting(None, "compressed updates on the upload", CompressionConfig)
    aggregate: AggregateConfig = setting(None, "the server's checks of the updates it aggregates", AggregateConfig)
    eval: EvalConfig = setting(None, "the server's evaluation of the global model", EvalConfig)
    transport: TransportConfig = setting(None, "ZeroMQ transport", TransportConfig)
    output: OutputConfig = setting(None, "results", OutputConfig)


RANGES: dict[type, dict[str, Range]] = {
    **links.RANGES,
    **learning.RANGES,
    **run.RANGES,
    Scenario: dict(seed=Range(0, 2**64 - 1), workers=Range(0, MAX_WORKERS)),
}

# Lists whose entries must be listed in order of a field (ties keep the later-listed entry).
ORDERED_BY: dict[type, dict[str, str]] = {
    LinksConfig: dict(schedule="t"),
    ComputeConfig: dict(schedule="t"),
    ImpactConfig: dict(schedule="from_round"),
    DropoutConfig: dict(outages="start"),
}


def ranges_of(cls: type) -> dict[str, Range]:
    """The Ranges of a section's numbers: its entry in RANGES (the server's Scenario has its base's),
    or the section's own RANGES: a policy's options declare theirs beside their fields."""
    if "RANGES" in vars(cls):
        own: dict[str, Range] = vars(cls)["RANGES"]
        return own
    return next((RANGES[c] for c in cls.__mro__ if c in RANGES), {})


def declared_range(cls: type, name: str) -> Range:
    return ranges_of(cls).get(name, FINITE)


def numeric_type(hint: object) -> type | None:
    """int or float for a number or a list of numbers; None for anything else (bool is not a number here)."""
    if get_origin(hint) is list:
        hint = get_args(hint)[0]
    return hint if isinstance(hint, type) and hint in (int, float) else None


def list_entry_type(hint: object) -> type | None:
    """The dataclass of a list-of-dataclass field, else None."""
    if get_origin(hint) is list and is_dataclass(get_args(hint)[0]):
        entry: type = get_args(hint)[0]
        return entry
    return None


# `check(ok, key, value, expected)`: reports (raises on) a failed check of a scenario key's value.
Check = Callable[[bool, str, object, str], None]


def check_ranges(obj: DataclassInstance, prefix: str, check: Check) -> None:
    """Every number in `obj`, nested sections and list entries included, against its declared Range;
    `check(ok, key, value, expected)` reports a failure."""
    hints = get_type_hints(type(obj))
    for f in fields(obj):
        key, value, hint = prefix + f.name, getattr(obj, f.name), hints[f.name]
        if is_dataclass(value):
            check_ranges(cast("DataclassInstance", value), key + ".", check)  # a section: an instance
        elif list_entry_type(hint):
            _check_order(value, ORDERED_BY.get(type(obj), {}).get(f.name), key, check)
            for i, entry in enumerate(value):
                check_ranges(entry, f"{key}[{i}].", check)
        elif numeric_type(hint):
            rng, integer = declared_range(type(obj), f.name), numeric_type(hint) is int
            numbers = [(f"{key}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else [(key, value)]
            for k, v in numbers:
                check(rng.admits(v), k, v, rng.describe(integer))


def _check_order(entries: list[Any], by: str | None, key: str, check: Check) -> None:
    if not by:
        return
    for i in range(1, len(entries)):
        before, now = getattr(entries[i - 1], by), getattr(entries[i], by)
        check(now >= before, f"{key}[{i}].{by}", now, f"entries listed in order of {by} (>= {before} of entry {i - 1})")


def to_dict(c: DataclassInstance) -> dict[str, Any]:
    # What OmegaConf.to_container(OmegaConf.structured(c)) gives for a loaded scenario (a test checks
    # every shipped one), without building a DictConfig: the server takes it twice before round 0.
    return asdict(c)


@overload
def from_dict(d: dict[str, Any]) -> Scenario: ...
@overload
def from_dict(d: dict[str, Any], cls: type[T]) -> T: ...


def from_dict(d: dict[str, Any], cls: type = Scenario) -> Any:
    """`cls` from to_dict's plain data, as the server sends it to its workers: a worker's Scenario leaves
    the policies' sections out, a missing key takes its default. The data is a validated scenario's, so
    it is not checked again (run.json is, by emulator.config.from_dict); OmegaConf would build the same,
    and the workers need not import it (a test compares the two on every shipped scenario)."""
    hints = _field_types(cls)
    return cls(**{name: _plain_value(hints[name], v) for name, v in d.items() if name in hints})


@cache
def _field_types(cls: type) -> dict[str, Any]:
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls) if f.init}


def _plain_value(tp: Any, value: Any) -> Any:
    if is_dataclass(tp):
        return from_dict(value, cast(type, tp))
    if get_origin(tp) is list:
        (item,) = get_args(tp)
        return [_plain_value(item, v) for v in value]
    if get_origin(tp) is dict:
        return dict(value)
    return value


__all__ = [
    "BUNDLE_AUTO",
    "CLIENT_ID",
    "FINITE",
    "FIXED_IMPACT",
    "MAX_CLIENTS",
    "MAX_GPUS",
    "MAX_PARAMETER",
    "MAX_QUANTITY",
    "MAX_ROUNDS",
    "MAX_SAMPLES",
    "MAX_SECONDS",
    "MAX_STEPS",
    "MAX_WORKERS",
    "NON_NEGATIVE",
    "NO_COMPRESSION",
    "OPEN_UNIT",
    "ORDERED_BY",
    "POSITIVE",
    "PROBABILITY",
    "QUANTITY",
    "RANGES",
    "ROUND",
    "TIME",
    "AggregateConfig",
    "AvailabilityConfig",
    "AvailabilityModel",
    "BatteryConfig",
    "BudgetConfig",
    "BufferedConfig",
    "Check",
    "Choice",
    "ClientGroup",
    "ClientsConfig",
    "CompressionConfig",
    "ComputeConfig",
    "ComputeTraceConfig",
    "Conversion",
    "DPConfig",
    "DataConfig",
    "Device",
    "Dist",
    "DistKind",
    "DropoutConfig",
    "DropoutDirection",
    "EmptyBatch",
    "EnergyConfig",
    "EvalConfig",
    "GpuConfig",
    "ImpactConfig",
    "ImpactKind",
    "ImpactPhase",
    "Launcher",
    "LinkTraceConfig",
    "LinksConfig",
    "ModelConfig",
    "Normalization",
    "OnLowBattery",
    "OnUnavailable",
    "Outage",
    "OutputConfig",
    "Partition",
    "PerSample",
    "QualityRule",
    "Radio",
    "Range",
    "RayConfig",
    "RoundConfig",
    "RoundMode",
    "Scenario",
    "SchedulePoint",
    "Selection",
    "Split",
    "Staleness",
    "TraceAssign",
    "TraceOffset",
    "TrainConfig",
    "TransportConfig",
    "bundle_size",
    "check_ranges",
    "const",
    "declared_range",
    "from_dict",
    "list_entry_type",
    "numeric_type",
    "ranges_of",
    "setting",
    "to_dict",
]

"""The scenario a user writes: the schema (nodes.schema) plus a section per policy, loaded from
YAML plus dotted overrides, validated, and explained (--help).

OmegaConf does the merging and type checking (unknown keys, wrong types); `validate`
checks every number against its key's `Range` (one walker over the schema) and then
what the keys mean together. Scenario files are read bounded (size, nesting, alias expansion)
and strict (UTF-8, no duplicate keys). Every failure becomes one `ConfigError` naming the key,
the bad value and what was expected.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, is_dataclass, make_dataclass
from functools import reduce
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast, get_type_hints

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from emulator import untrusted_yaml
from emulator.availability import read_windows
from emulator.links import TRACE_LISTS, trace_files
from emulator.policies import POLICIES, PolicyLoadError, is_user_policy, load_policy, policy_class
from emulator.policies.options import parse_options
from emulator.privacy import PLD_INSTALL, pld_installed
from emulator.traces import TraceError, read_link_trace, read_step_trace
from nodes import schema
from nodes.keys import ADDRESS_FORMS, address_problem, exposure_problem
from nodes.schema import (
    FIXED_IMPACT,
    ORDERED_BY,
    AccountantKind,
    AvailabilityModel,
    Conversion,
    Device,
    Dist,
    DistKind,
    DropoutDirection,
    DropoutModel,
    EmptyBatch,
    ImpactKind,
    Launcher,
    OnUnavailable,
    PerSample,
    Selection,
    TraceAssign,
    TraceOffset,
    check_ranges,
    declared_range,
    list_entry_type,
    numeric_type,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")

# Shipped as package data, so a name resolves from a checkout and from an installed wheel alike.
SCENARIO_DIR = Path(str(resources.files("emulator") / "scenarios"))


class ConfigError(ValueError):
    """Bad scenario input; the message is one line naming the key."""


SHOWN_CHARS = 80  # of a key or value echoed in an error


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` cut to `limit` characters, so an error stays one readable line whatever the input."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _check(ok: bool, key: str, value: object, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{clip(key)} = {clip(repr(value))}: expected {expected}")


if TYPE_CHECKING:

    class ServerScenario(schema.Scenario):
        """`Scenario` below as the type checker sees it. The class is built at import time from the
        policy registry, so the sections named after the policies are not declared here (each policy
        reads its own); `policy_args`, which every build has, is."""

        policy_args: dict[str, Any]


# Every run's sections, then one per policy that has options, named after it (ali_dpfl.gamma=...), and
# the free-form options of a user's policy.
Scenario: type[ServerScenario] = make_dataclass(
    "Scenario",
    [
        (name, policy.Options, schema.setting(None, policy.options_help, policy.Options))
        for name, policy in POLICIES.items()
        if policy.Options
    ]
    + [
        (
            "policy_args",
            dict[str, Any],
            schema.setting(
                None,
                "options of a user policy (policy=package.module:ClassName), checked by its Options dataclass",
                dict,
            ),
        )
    ],
    bases=(schema.Scenario,),
    namespace={"__module__": __name__, "__doc__": "A scenario as its file is written."},
)


# --- loading ----------------------------------------------------------------------------

MAX_SCENARIO_BYTES = 2**20  # scenarios are a few KiB
PROBLEM_CHARS = 200


def resolve_scenario_path(name: str) -> Path:
    if not name:
        raise ConfigError("scenario= has no value: expected a path or a name from scenarios/")
    p = Path(name)
    for cand in (p, SCENARIO_DIR / p, SCENARIO_DIR / f"{name}.yaml"):
        try:
            if cand.is_file():
                return cand
        except OSError as e:  # e.g. a name too long for the file system
            raise ConfigError(f"scenario={clip(name)}: {e.strerror or e}") from None
    raise ConfigError(f"scenario={clip(name)}: file not found (looked in ./ and {SCENARIO_DIR}/)")


def read_scenario(name: str) -> dict[str, Any]:
    """The scenario file's keys: UTF-8 YAML of bounded size and shape, one plain mapping without
    duplicate keys (see untrusted_yaml)."""
    path, where = resolve_scenario_path(name), f"scenario={clip(name)}"
    text = _read_text(path, where)
    try:
        problem = untrusted_yaml.shape_problem(text)
        data = None if problem else yaml.load(text, Loader=untrusted_yaml.StrictLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(
            f"{where}: malformed YAML{line}: {clip(str(getattr(e, 'problem', None) or e), PROBLEM_CHARS)}"
        ) from None
    if problem:
        raise ConfigError(f"{where}: the YAML {clip(problem, PROBLEM_CHARS)}")
    if data is None:
        raise ConfigError(f"{where}: the file is empty; expected a mapping of keys")
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of keys at top level, got {type(data).__name__}")
    problem = untrusted_yaml.plain_problem(data)
    if problem:
        raise ConfigError(f"{where}: {clip(problem, PROBLEM_CHARS)}")
    return data


def _read_text(path: Path, where: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SCENARIO_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{where}: cannot read the file: {e.strerror or e}") from None
    if len(raw) > MAX_SCENARIO_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_SCENARIO_BYTES // 2**10} KiB; expected a scenario of a few KiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None


def split_args(args: list[str]) -> tuple[str | None, list[str]]:
    """The command line's `scenario=NAME` apart from its dotted overrides (their order kept)."""
    scenario, overrides = None, []
    for a in args:
        if a.startswith("scenario="):
            scenario = str(parse_override(a).value())
        else:
            overrides.append(a)
    return scenario, overrides


def _override_key(item: str) -> str:
    """The key of `key=value`, once the value is known not to nest or expand too far (what a parser
    would recurse into)."""
    if "=" not in item:
        raise ConfigError(f"{clip(item)}: expected key=value")
    key, value = item.split("=", 1)
    try:
        problem = untrusted_yaml.shape_problem(value)
    except yaml.YAMLError:
        problem = ""  # not YAML: OmegaConf reports it, or takes it as text
    if problem:
        raise ConfigError(f"{clip(key)}: the YAML value {clip(problem, PROBLEM_CHARS)}")
    return key


def load(scenario: str | None = None, overrides: Sequence[str] = ()) -> ServerScenario:
    """Schema defaults <- scenario YAML <- each dotted override in turn; trace files found (`find_files`),
    then `validate`."""
    cfg: DictConfig = OmegaConf.structured(Scenario)
    here = Path.cwd()
    if scenario is not None:
        data = read_scenario(scenario)
        here = resolve_scenario_path(scenario).resolve().parent
        _merge(cfg, lambda: data, f"scenario={clip(scenario)}")
    for item in overrides:
        _override(cfg, item)
    try:
        checked = cast("ServerScenario", OmegaConf.to_object(cfg))  # a structured config: an instance of its class
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_message(e)) from None
    find_files(checked, here)
    validate(checked)
    return checked


def _override(cfg: DictConfig, item: str) -> None:
    """Apply one override to cfg, read by Hydra's override grammar (so a point of a sweep means
    what Hydra made of it): `key=value` and `++key=value` set, `+key=value` adds a key not set yet
    (a user policy's policy_args), `~key` removes a policy_args key (a scenario key has a default:
    set it instead)."""
    o = parse_override(item)
    key = o.key_or_group
    if o.is_sweep_override():
        raise ConfigError(f"{clip(item)}: a sweep; add --multirun (-m) to run every value")
    if o.is_delete():
        section, _, name = key.rpartition(".")
        if section != "policy_args":
            raise ConfigError(f"~{clip(key)}: only a policy_args key can be removed (set a scenario key instead)")
        free = cast(DictConfig, OmegaConf.select(cfg, section))
        if name not in free:
            raise ConfigError(f"~{clip(key)}: not set, nothing to remove")
        del free[name]
        return
    if o.is_add() and OmegaConf.select(cfg, key, default=_UNSET) is not _UNSET:
        raise ConfigError(f"+{clip(key)}: already set; without the + it is overridden")
    nested = cast(dict[str, Any], reduce(lambda value, name: {name: value}, reversed(key.split(".")), o.value()))
    _merge(cfg, lambda: nested, clip(key))


_UNSET = object()
_PARSER = OverridesParser.create()


# transport.address=tcp://[::1]:5555 as typed: Hydra's grammar would read the brackets as a list
_IPV6_ADDRESS = re.compile(r"(\+{0,2}transport\.address)=(tcp://\[[^'\"\\,\s]*)")


def parse_override(item: str) -> Override:
    """One override in Hydra's grammar (a bracketed IPv6 transport.address taken as one value, quoted);
    a malformed one is one ConfigError naming it."""
    if ipv6 := _IPV6_ADDRESS.fullmatch(item):
        item = f"{ipv6[1]}='{ipv6[2]}'"
    if not item.startswith("~"):
        _override_key(item)  # a key=value whose value is known not to nest or expand too far
    try:
        return _PARSER.parse_override(item)
    except HydraException as e:  # OverrideParseException, or the grammar's own error as a HydraException
        lines = [line for line in str(e).splitlines() if line and not line.startswith(("See ", "Error parsing"))]
        hint = "; quote a value holding brackets: transport.address='tcp://[::1]:5555'" if "://[" in item else ""
        problem = clip(" ".join(lines), PROBLEM_CHARS)
        raise ConfigError(f"{clip(item)}: {problem} (Hydra's override grammar{hint})") from None


def find_files(c: schema.Scenario, here: Path) -> None:
    """Every trace and availability file as an absolute path: a relative one is looked up in `here`
    (the scenario file's directory, or the working directory without one), then in scenarios/.
    run.json keeps the absolute paths, so a resumed run reads the same files."""
    for key in TRACE_LISTS:
        files = _lookup(c, key.split("."))
        files[:] = [_find(f"{key}[{i}]", name, here) for i, name in enumerate(files)]
    if c.availability.file:
        c.availability.file = _find("availability.file", c.availability.file, here)


def _lookup(c: schema.Scenario, names: list[str]) -> Any:
    """The value at a dotted key's names (["links", "trace", "down"]): of its schema field's type."""
    return reduce(getattr, names, c)


def _find(key: str, name: str, here: Path) -> str:
    path = Path(name).expanduser()
    places = (path,) if path.is_absolute() else (here / path, SCENARIO_DIR / path)
    for cand in places:
        try:
            if cand.is_file():
                return str(cand.resolve())
        except OSError:  # e.g. a name too long for the file system: not found
            continue
    where = "" if path.is_absolute() else f" (looked in {clip(str(here))}/ and {SCENARIO_DIR}/)"
    raise ConfigError(f"{clip(key)} = {clip(repr(name))}: file not found{where}")


def _merge(cfg: DictConfig, layer: Callable[[], dict[str, Any]], source: str) -> None:
    """Merge the dict `layer()` into cfg, in place (OmegaConf.merge would deep-copy the whole
    scenario for each override: 0.06 s a copy); a failure names its key, or else `source`, and
    leaves cfg half-merged, which load discards."""
    try:
        data = layer()
        _check_list_entries(data)
        cfg.merge_with(data)
    except ConfigError:
        raise
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_message(e, fallback=source)) from None
    except Exception as e:  # OmegaConf lets assorted errors through on odd keys (`[=1`, `a.0.b=1`)
        raise ConfigError(f"{source}: {clip(str(e) or type(e).__name__, PROBLEM_CHARS)}") from None


def _check_list_entries(
    data: dict[str, Any], cls: DataclassInstance | type[DataclassInstance] = Scenario, prefix: str = ""
) -> None:
    """Type-check every entry of a list-of-sections on its own, so an error names it in full
    (`data.groups[1].clients`): OmegaConf reports a bad entry by its field name alone."""
    hints = get_type_hints(cls)
    for f in fields(cls):
        value, key, hint = data.get(f.name), prefix + f.name, hints[f.name]
        if is_dataclass(hint) and isinstance(value, dict):
            _check_list_entries(value, hint, key + ".")
        elif (entry := list_entry_type(hint)) and isinstance(value, list):
            for i, item in enumerate(value):
                try:
                    OmegaConf.merge(OmegaConf.structured(entry), item)
                except OmegaConfBaseException as e:
                    raise ConfigError(omegaconf_message(e, prefix=f"{key}[{i}].")) from None
                except (TypeError, ValueError):
                    raise ConfigError(
                        f"{key}[{i}] = {clip(repr(item))}: expected a section of "
                        f"{', '.join(g.name for g in fields(entry))}"
                    ) from None


def omegaconf_message(e: OmegaConfBaseException, prefix: str = "", fallback: str = "?") -> str:
    full_key = getattr(e, "full_key", None)
    key = clip(prefix + str(full_key)) if full_key else fallback
    msg = str(e).splitlines()[0]
    if "not in" in msg:
        return f"{key}: unknown key (see python -m emulator --help)"
    value = clip(repr(getattr(e, "value", None)))
    hint = ""
    if "could not be converted" in msg:
        want = msg.rsplit("to ", 1)[-1]
        hint = f"expected {want.lower()}"
    return f"{key} = {value}: {hint or clip(msg, PROBLEM_CHARS)}"


def _check_dist(d: Dist, key: str, minimum: float, unit: str) -> None:
    """The values d's kind uses are at least `minimum` (their Range already bounds them)."""
    _check(DistKind.admits(d.kind), f"{key}.kind", d.kind, DistKind.describe())
    at_least = f"a number >= {minimum:g} ({unit})"
    if d.kind == DistKind.CONSTANT:
        _check(d.value >= minimum, f"{key}.value", d.value, at_least)
    elif d.kind == DistKind.LOGNORMAL:
        _check(
            d.median > 0 and d.median >= minimum,
            f"{key}.median",
            d.median,
            at_least if minimum else f"a number > 0 ({unit})",
        )
    elif d.kind == DistKind.UNIFORM:
        _check(d.low >= minimum, f"{key}.low", d.low, at_least)
        _check(d.high >= d.low, f"{key}.high", d.high, f"a number >= low ({d.low})")
    else:
        _check(len(d.values) > 0, f"{key}.values", d.values, f"a non-empty list of numbers >= {minimum:g} ({unit})")
        for i, v in enumerate(d.values):
            _check(v >= minimum, f"{key}.values[{i}]", v, at_least)


def _check_factors(values: list[float], n: int, key: str) -> None:
    _check(len(values) == n, key, values, f"{n} values, one per client")
    _check(abs(sum(values) - 1.0) < 1e-6, key, values, f"impact factors summing to 1 (sum is {sum(values):.6g})")


NAME_MAX = 255  # bytes of one file name on Linux file systems
PATH_BYTES_MAX = 3500  # PATH_MAX (4096) less a run name and the files a run writes below it
PATH_KEYS = (
    "data.root",
    "data.cache_dir",
    "transport.keys_dir",
    "output.dir",
    "output.tensorboard",
)  # file system paths


def _path_ok(text: str) -> bool:
    """A path the file system can take: not too long, no component too long, no NUL."""
    return (
        "\0" not in text
        and len(text.encode()) <= PATH_BYTES_MAX
        and all(len(part.encode()) <= NAME_MAX for part in Path(text).parts)
    )


def _run_name_ok(name: str) -> bool:
    """A single directory name inside output.dir: nothing that could climb out of it."""
    return name == "" or (
        name not in (".", "..") and not any(c in name for c in "/\\\0") and len(name.encode()) <= NAME_MAX
    )


def validate(c: ServerScenario) -> None:
    """Ranges of every number first (one walker over the schema), then what the keys mean together."""
    # only the chosen policy's section is read, so only it is checked (a sweep over policies may
    # set every section)
    others = {name for name in POLICIES if name != c.policy}

    def check_chosen(ok: bool, key: str, value: object, expected: str) -> None:
        if key.split(".")[0] not in others:
            _check(ok, key, value, expected)

    check_ranges(c, "", check_chosen)
    _check(
        c.policy in POLICIES or is_user_policy(c.policy),
        "policy",
        c.policy,
        f"{' | '.join(sorted(POLICIES))} | package.module:ClassName (a user's Policy subclass)",
    )
    _check(Device.admits(c.device), "device", c.device, Device.describe())
    _check(Selection.admits(c.clients.select), "clients.select", c.clients.select, Selection.describe())
    _check(
        c.clients.per_round <= c.clients.n,
        "clients.per_round",
        c.clients.per_round,
        f"an integer in [0, clients.n={c.clients.n}]",
    )
    dp = c.dp
    _check(dp.clip > 0 or dp.sigma == 0, "dp.clip", dp.clip, "a clipping norm > 0 when dp.sigma > 0")
    _check(Conversion.admits(dp.conversion), "dp.conversion", dp.conversion, Conversion.describe())
    _validate_accountant(dp)
    _check(EmptyBatch.admits(dp.empty_batch), "dp.empty_batch", dp.empty_batch, EmptyBatch.describe())
    _check(PerSample.admits(dp.per_sample), "dp.per_sample", dp.per_sample, PerSample.describe())
    _check(
        dp.epsilon == math.inf or dp.sigma > 0, "dp.sigma", dp.sigma, "a noise multiplier > 0 when dp.epsilon is finite"
    )
    _validate_links(c)
    _check_dist(c.compute.step_s, "compute.step_s", 0, "seconds")
    _validate_traces(c)
    _validate_availability(c)
    _validate_impact(c)
    _validate_launcher(c)
    _validate_names(c)
    _validate_policies(c)
    _validate_eval(c)
    _validate_output(c)
    from nodes.data import validate_data

    validate_data(c.data, c.clients.n, _check)
    _validate_model(c)


def _validate_accountant(dp: schema.DPConfig) -> None:
    """dp.accountant, and dp.conversion: RDP's conversion to (epsilon, delta), which PRV and PLD do not
    have (they compute epsilon from the loss distribution itself): a classic conversion asked of them
    would go unheeded, so it is refused."""
    _check(AccountantKind.admits(dp.accountant), "dp.accountant", dp.accountant, AccountantKind.describe())
    _check(
        dp.accountant == AccountantKind.RDP or dp.conversion == Conversion.IMPROVED,
        "dp.conversion",
        dp.conversion,
        f"improved (the default) with dp.accountant={dp.accountant}: the conversion is dp.accountant=rdp's",
    )
    _check(
        dp.accountant != AccountantKind.PLD or pld_installed(),
        "dp.accountant",
        dp.accountant,
        f"rdp | prv: pld needs Google's dp-accounting package, not installed ({PLD_INSTALL})",
    )


def _validate_names(c: schema.Scenario) -> None:
    """The address, the run name and every path: well-formed, and nothing that leaves output.dir."""
    a = c.transport.address
    _check(a == "" or not address_problem(a), "transport.address", a, f"'' or {ADDRESS_FORMS}")
    _check(
        _run_name_ok(c.output.name),
        "output.name",
        c.output.name,
        f"a directory name of at most {NAME_MAX} bytes without '/', '\\' or '..' (empty = a timestamp)",
    )
    for key in PATH_KEYS:
        value = _lookup(c, key.split("."))
        _check(_path_ok(value), key, value, f"a path of at most {PATH_BYTES_MAX} bytes, {NAME_MAX} per name")
    problem = exposure_problem(a, c.transport.curve, c.transport.keys_dir, c.transport.launcher == Launcher.RAY)
    if problem:
        raise ConfigError(problem)


def _validate_launcher(c: schema.Scenario) -> None:
    """Who starts the workers, and with Ray what it needs (nodes.ray_workers; Ray is not imported)."""
    from nodes.ray_workers import launcher_problem

    problem = launcher_problem(c.transport)
    if problem:
        raise ConfigError(problem)


def _validate_model(c: schema.Scenario) -> None:
    """A known model, defined for the shape of the data's samples."""
    from nodes.data import sample_shape
    from nodes.model_catalog import MODEL_NAMES, designed_inputs

    _check(c.model.name in MODEL_NAMES, "model.name", c.model.name, " | ".join(sorted(MODEL_NAMES)))
    shape, wanted = sample_shape(c.data), designed_inputs(c.model.name)
    _check(
        wanted is None or shape in wanted,
        "model.name",
        c.model.name,
        f"a model for data.dataset={c.data.dataset}, whose samples have shape {shape} "
        f"({c.model.name} is defined for input {' or '.join(map(str, wanted or ()))})",
    )


def _validate_links(c: schema.Scenario) -> None:
    L = c.links
    _check_dist(L.down_bps, "links.down_bps", 1, "bits/s")
    _check_dist(L.up_bps, "links.up_bps", 1, "bits/s")
    _check_dist(L.latency_s, "links.latency_s", 0, "seconds")
    for k in ("server_down_bps", "server_up_bps"):
        v = getattr(L, k)
        _check(v == 0 or v >= 1, f"links.{k}", v, "0 (unlimited) or a capacity >= 1 bit/s")
    d = L.dropout
    _check(DropoutModel.admits(d.model), "links.dropout.model", d.model, DropoutModel.describe())
    _check(DropoutDirection.admits(d.direction), "links.dropout.direction", d.direction, DropoutDirection.describe())
    for i, o in enumerate(d.outages):
        _check(o.end > o.start, f"links.dropout.outages[{i}].end", o.end, f"a time > start ({o.start})")
        bad = [k for k in o.clients if not 0 <= k < c.clients.n]
        _check(not bad, f"links.dropout.outages[{i}].clients", o.clients, f"client ids in [0, {c.clients.n})")


def _validate_traces(c: schema.Scenario) -> None:
    """Assignment rules known, no schedule beside a trace, and every file readable and well-formed."""
    for key, how in (("links.trace", c.links.trace), ("compute.trace", c.compute.trace)):
        _check(TraceAssign.admits(how.assign), f"{key}.assign", how.assign, TraceAssign.describe())
        _check(TraceOffset.admits(how.offset), f"{key}.offset", how.offset, TraceOffset.describe())
    for key in TRACE_LISTS:
        files = _lookup(c, key.split("."))
        assign = _lookup(c, key.split(".")[:-1]).assign
        _check(assign != TraceAssign.SAME or len(files) <= 1, key, files, "a single file when assign=same")
    traced = c.links.trace.down or c.links.trace.up
    _check(
        not (traced and c.links.schedule),
        "links.schedule",
        c.links.schedule,
        "no schedule beside links.trace (a trace has its own time variation)",
    )
    _check(
        not (c.compute.trace.files and c.compute.schedule),
        "compute.schedule",
        c.compute.schedule,
        "no schedule beside compute.trace.files (a trace has its own time variation)",
    )
    for key, path in trace_files(c):
        if key.startswith("links."):
            _parsed(key, path, read_link_trace, "a Mahimahi trace or a .csv of t_s,bps")
        elif key.startswith("compute."):
            _parsed(key, path, read_step_trace, "a .csv of t_s,step_s")


def _parsed(key: str, path: str, read: Callable[[str], T], expected: str) -> T:
    try:
        return read(path)
    except TraceError as e:
        raise ConfigError(
            f"{clip(key)} = {clip(repr(path))}: expected {expected}: {clip(str(e), PROBLEM_CHARS)}"
        ) from None


def _validate_availability(c: schema.Scenario) -> None:
    a = c.availability
    _check(AvailabilityModel.admits(a.model), "availability.model", a.model, AvailabilityModel.describe())
    _check(
        OnUnavailable.admits(a.on_unavailable),
        "availability.on_unavailable",
        a.on_unavailable,
        OnUnavailable.describe(),
    )
    if a.model == AvailabilityModel.CSV:
        _check(bool(a.file), "availability.file", a.file, "a CSV file of client,t_start,t_end when model=csv")
        _parsed(
            "availability.file",
            a.file,
            lambda p: read_windows(p, c.clients.n, a.repeat_s),
            f"a .csv of client,t_start,t_end rows (client ids in [0, {c.clients.n})"
            + (f", every t_end <= availability.repeat_s = {a.repeat_s:g})" if a.repeat_s else ")"),
        )


def _validate_impact(c: schema.Scenario) -> None:
    imp = c.impact
    _check(ImpactKind.admits(imp.kind), "impact.kind", imp.kind, ImpactKind.describe())
    if imp.kind == ImpactKind.EXPLICIT:
        _check_factors(imp.values, c.clients.n, "impact.values")
    if imp.kind == ImpactKind.SCHEDULE:
        _check(len(imp.schedule) > 0, "impact.schedule", imp.schedule, "at least one phase")
        for i, ph in enumerate(imp.schedule):
            _check(ph.kind in FIXED_IMPACT, f"impact.schedule[{i}].kind", ph.kind, " | ".join(FIXED_IMPACT))
            if ph.kind == ImpactKind.EXPLICIT:
                _check_factors(ph.values, c.clients.n, f"impact.schedule[{i}].values")


def _validate_policies(c: ServerScenario) -> None:
    if not is_user_policy(c.policy):
        POLICIES[c.policy].check(c, _check)
        _check(
            not c.policy_args,
            "policy_args",
            c.policy_args,
            f"no keys: they are a user policy's (policy={c.policy} takes its own section)",
        )
        return
    try:
        user = load_policy(c.policy)
        parse_options(user.Options, c.policy_args)
    except PolicyLoadError as e:
        raise ConfigError(str(e)) from None
    user.check(c, _check)


def _validate_eval(c: ServerScenario) -> None:
    """A policy that reads the evaluation plans each round from the evaluation of the one before."""
    _check(
        c.eval.every == 1 or not policy_class(c.policy).reads_evaluation(),
        "eval.every",
        c.eval.every,
        f"1 with policy={c.policy}, which reads the server's evaluation of every round (it overrides observe)",
    )


def _validate_output(c: ServerScenario) -> None:
    """The TensorBoard logger's package is there when asked for, and every hook of the user's loads."""
    from importlib.util import find_spec

    from emulator.hooks import HookLoadError, load_hook

    _check(
        not c.output.tensorboard or find_spec("tensorboard") is not None,
        "output.tensorboard",
        c.output.tensorboard,
        "'' (none), or install its writer: pip install 'dpfl-emulator[tensorboard]'",
    )
    for spec in c.output.hooks:
        try:
            load_hook(spec)
        except HookLoadError as e:
            raise ConfigError(str(e)) from None


def chosen_sections(scenario: Mapping[str, Any]) -> dict[str, Any]:
    """A scenario as a dict without the sections of the built-in policies it did not choose: the
    composed Scenario (and so to_dict and older run.json files) holds every one, only one is read."""
    return {k: v for k, v in scenario.items() if not (k in POLICIES and k != scenario.get("policy"))}


def from_dict(d: dict[str, Any]) -> ServerScenario:
    """The scenario of run.json (schema.to_dict's)."""
    return schema.from_dict(d, Scenario)


def help_text() -> str:
    """One line per key: dotted name, default (of the default instance, so Dist defaults are real),
    meaning and, for numbers, the admitted range; list entries as key[i].field."""
    lines: list[str] = []

    def walk(obj: DataclassInstance | type[DataclassInstance], prefix: str) -> None:
        hints = get_type_hints(type(obj))
        for f in fields(obj):
            key, value, hint = prefix + f.name, getattr(obj, f.name), hints[f.name]
            meaning = f.metadata.get("help", "")
            if is_dataclass(value):
                lines.append(f"  {key}:  {meaning}")
                walk(value, key + ".")
                continue
            if numeric_type(hint):
                each = "each " if isinstance(value, list) else ""
                meaning += f"; {each}{declared_range(type(obj), f.name).describe(numeric_type(hint) is int)}"
            if key == "policy":  # the registry is emulator's; the schema below it cannot list it
                meaning += f": {' | '.join(POLICIES)} | package.module:ClassName (your own)"
            order = ORDERED_BY.get(type(obj), {}).get(f.name)
            if order:
                meaning += f"; listed in order of {order}"
            lines.append(f"  {key} = {value!r}  # {meaning}")
            if entry := list_entry_type(hint):
                walk(entry(), f"{key}[i].")

    walk(Scenario(), "")
    return "\n".join(lines)

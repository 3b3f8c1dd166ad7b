"""`validate`: every number against its key's Range (one walker over the schema), then what the
keys mean together, in a fixed order (the first failure is the one reported)."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

from emulator.config.errors import ConfigError, check
from emulator.config.server_scenario import ServerScenario, policy_options, policy_settings, value_at
from emulator.config.time_model_checks import validate_time_model
from emulator.policies import POLICIES, PolicyLoadError, is_user_policy, load_policy, policy_class
from emulator.privacy import ACCOUNTANTS, AccountantError, theorem
from emulator.privacy.numerical import NumericalTheorem
from emulator.privacy.rdp import RdpTheorem
from nodes.contracts import codecs, schema
from nodes.contracts.keys import ADDRESS_FORMS, address_problem, exposure_problem
from nodes.contracts.protocol import MAX_BUNDLE
from nodes.contracts.schema import (
    FIXED_IMPACT,
    NO_COMPRESSION,
    Conversion,
    Device,
    EmptyBatch,
    ImpactKind,
    Launcher,
    OnUnavailable,
    PerSample,
    RoundMode,
    Selection,
    Staleness,
    check_ranges,
)

NAME_MAX = 255  # bytes of one file name on Linux file systems
PATH_BYTES_MAX = 3500  # PATH_MAX (4096) less a run name and the files a run writes below it
PATH_KEYS = (
    "data.root",
    "data.cache_dir",
    "transport.keys_dir",
    "output.dir",
    "output.tensorboard",
)  # file system paths


def validate(c: ServerScenario) -> None:
    """Ranges of every number first (one walker over the schema), then what the keys mean together."""
    # only the chosen policy's section is read, so only it is checked (a sweep over policies may
    # set every section)
    others = {name for name in POLICIES if name != c.policy}

    def check_chosen(ok: bool, key: str, value: object, expected: str) -> None:
        if key.split(".")[0] not in others:
            check(ok, key, value, expected)

    check_ranges(c, "", check_chosen)
    check(
        c.policy in POLICIES or is_user_policy(c.policy),
        "policy",
        c.policy,
        f"{' | '.join(sorted(POLICIES))} | package.module:ClassName (a user's Policy subclass)",
    )
    check(Device.admits(c.device), "device", c.device, Device.describe())
    devices = c.gpu.devices
    check(
        len(set(devices)) == len(devices),
        "gpu.devices",
        devices,
        "each GPU index once (gpu.workers_per_gpu puts several workers on one)",
    )
    check(Selection.admits(c.clients.select), "clients.select", c.clients.select, Selection.describe())
    check(
        c.clients.per_round <= c.clients.n,
        "clients.per_round",
        c.clients.per_round,
        f"an integer in [0, clients.n={c.clients.n}]",
    )
    dp = c.dp
    check(dp.clip > 0 or dp.sigma == 0, "dp.clip", dp.clip, "a clipping norm > 0 when dp.sigma > 0")
    check(Conversion.admits(dp.conversion), "dp.conversion", dp.conversion, Conversion.describe())
    _validate_accountant(dp)
    check(EmptyBatch.admits(dp.empty_batch), "dp.empty_batch", dp.empty_batch, EmptyBatch.describe())
    check(PerSample.admits(dp.per_sample), "dp.per_sample", dp.per_sample, PerSample.describe())
    check(
        dp.epsilon == math.inf or dp.sigma > 0, "dp.sigma", dp.sigma, "a noise multiplier > 0 when dp.epsilon is finite"
    )
    check(
        c.train.bundle == schema.BUNDLE_AUTO or 1 <= (schema.bundle_size(c.train.bundle) or 0) <= MAX_BUNDLE,
        "train.bundle",
        c.train.bundle,
        f"{schema.BUNDLE_AUTO} | an integer in [1, {MAX_BUNDLE}]",
    )
    validate_time_model(c)
    _validate_compression(c.compression)
    _validate_impact(c)
    _validate_launcher(c)
    _validate_names(c)
    _validate_policies(c)
    _validate_history_length(c)
    _validate_partial_work(c)
    _validate_mode(c)
    _validate_eval(c)
    _validate_output(c)
    from nodes.data import DatasetLoadError, validate_data

    try:
        validate_data(c.data, c.clients.n, check)
    except DatasetLoadError as e:  # a user's class that cannot be imported or made
        raise ConfigError(str(e)) from None
    _validate_model(c)


def _validate_accountant(dp: schema.DPConfig) -> None:
    """dp.accountant: a built-in theorem, or a user's EpsilonTheorem subclass, imported and built here so
    that a bad reference is refused before a run; and dp.conversion, RDP's conversion to (epsilon, delta),
    which the others do not have (PRV and PLD compute epsilon from the loss distribution itself): a
    classic conversion asked of them would go unheeded, so it is refused."""
    check(ACCOUNTANTS.admits(dp.accountant), "dp.accountant", dp.accountant, ACCOUNTANTS.describe())
    try:
        cls = ACCOUNTANTS.get(dp.accountant)
    except AccountantError as e:
        raise ConfigError(str(e)) from None
    check(
        issubclass(cls, RdpTheorem) or dp.conversion == Conversion.IMPROVED,
        "dp.conversion",
        dp.conversion,
        f"improved (the default) with dp.accountant={dp.accountant}: the conversion is dp.accountant=rdp's",
    )
    try:
        theorem(dp.accountant, dp.conversion)  # built as the server will build it
    except AccountantError as e:
        raise ConfigError(str(e)) from None
    missing = cls.missing()
    if missing:  # what this machine has, then what it lacks
        usable = " | ".join(name for name in ACCOUNTANTS.names() if not ACCOUNTANTS.get(name).missing())
        check(False, "dp.accountant", dp.accountant, f"{usable}: {dp.accountant} {missing}")


def _validate_compression(comp: schema.CompressionConfig) -> None:
    """compression.kind a codec (a user's imported now, as the workers will at their setup), and error
    feedback only with one."""
    check(
        comp.kind == NO_COMPRESSION or codecs.CODECS.admits(comp.kind), "compression.kind", comp.kind, codecs.choices()
    )
    try:
        codecs.load_codec(comp.kind)
    except codecs.CodecLoadError as e:
        raise ConfigError(str(e)) from None
    check(
        comp.kind != NO_COMPRESSION or not comp.error_feedback,
        "compression.error_feedback",
        comp.error_feedback,
        "false with compression.kind=none (there is no compression error to feed back)",
    )


def _validate_impact(c: schema.Scenario) -> None:
    imp = c.impact
    check(ImpactKind.admits(imp.kind), "impact.kind", imp.kind, ImpactKind.describe())
    if imp.kind == ImpactKind.EXPLICIT:
        _check_factors(imp.values, c.clients.n, "impact.values")
    if imp.kind == ImpactKind.SCHEDULE:
        check(len(imp.schedule) > 0, "impact.schedule", imp.schedule, "at least one phase")
        for i, ph in enumerate(imp.schedule):
            check(ph.kind in FIXED_IMPACT, f"impact.schedule[{i}].kind", ph.kind, " | ".join(FIXED_IMPACT))
            if ph.kind == ImpactKind.EXPLICIT:
                _check_factors(ph.values, c.clients.n, f"impact.schedule[{i}].values")


def _check_factors(values: list[float], n: int, key: str) -> None:
    check(len(values) == n, key, values, f"{n} values, one per client")
    check(abs(sum(values) - 1.0) < 1e-6, key, values, f"impact factors summing to 1 (sum is {sum(values):.6g})")


def _validate_launcher(c: schema.Scenario) -> None:
    """Who starts the workers, and with Ray what it needs (nodes.transport.ray_workers; Ray is not imported)."""
    from nodes.transport.ray_workers import launcher_problem

    problem = launcher_problem(c.transport)
    if problem:
        raise ConfigError(problem)


def _validate_names(c: schema.Scenario) -> None:
    """The address, the run name and every path: well-formed, and nothing that leaves output.dir."""
    a = c.transport.address
    check(a == "" or not address_problem(a), "transport.address", a, f"'' or {ADDRESS_FORMS}")
    check(
        _run_name_ok(c.output.name),
        "output.name",
        c.output.name,
        f"a directory name of at most {NAME_MAX} bytes without '/', '\\' or '..' (empty = a timestamp)",
    )
    for key in PATH_KEYS:
        value = value_at(c, key.split("."))
        check(_path_ok(value), key, value, f"a path of at most {PATH_BYTES_MAX} bytes, {NAME_MAX} per name")
    problem = exposure_problem(a, c.transport.curve, c.transport.keys_dir, c.transport.launcher == Launcher.RAY)
    if problem:
        raise ConfigError(problem)


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


def _validate_policies(c: ServerScenario) -> None:
    if not is_user_policy(c.policy):
        cls = POLICIES[c.policy]
        cls.check(policy_options(cls, c), policy_settings(c), check)
        check(
            not c.policy_args,
            "policy_args",
            c.policy_args,
            f"no keys: they are a user policy's (policy={c.policy} takes its own section)",
        )
        return
    try:
        user = load_policy(c.policy)
        options = policy_options(user, c)
    except PolicyLoadError as e:
        raise ConfigError(str(e)) from None
    takes = len(inspect.signature(user.check).parameters)  # a classmethod's, without cls
    check(
        takes == 3,
        "policy",
        c.policy,
        "a check(cls, options, settings, check) classmethod: check(cls, cfg, check) is the old signature "
        "(docs/policies.md)",
    )
    user.check(options, policy_settings(c), check)


def _validate_history_length(c: ServerScenario) -> None:
    """dp.accountant = prv | pld with a policy that may give every round a sigma of its own (Policy.changes_sigma):
    budget.rounds distinct runs at most in a client's history, refused past the theorem's max_runs (where it would
    report RDP's epsilon), naming the accountants that compose that many."""
    cls = ACCOUNTANTS.get(c.dp.accountant)
    if not (issubclass(cls, NumericalTheorem) and policy_class(c.policy).changes_sigma):
        return
    runs = c.budget.rounds
    fits = [n for n in ACCOUNTANTS.names() if getattr(ACCOUNTANTS.get(n), "max_runs", runs) >= runs]
    check(
        runs <= cls.max_runs,
        "dp.accountant",
        c.dp.accountant,
        f"{' | '.join(fits)}: policy={c.policy} may give each round a sigma of its own, so a client's history may "
        f"hold budget.rounds = {runs} distinct (q, sigma) runs, past the {cls.max_runs} that {c.dp.accountant} "
        f"composes before it reports RDP's epsilon (about {cls.question_seconds(cls.max_runs):.2g} s a question of "
        "epsilon there; python -m bench.accountants); or budget.rounds at most that",
    )


def _validate_partial_work(c: ServerScenario) -> None:
    """round.partial_work fits steps before the deadline, into a DP-SGD policy that aggregates by FedAvg."""
    if not c.round.partial_work:
        return
    check(math.isfinite(c.round.deadline_s), "round.partial_work", True, "false without a round.deadline_s")
    supported = ", ".join(name for name, p in POLICIES.items() if p.partial_work)
    check(
        policy_class(c.policy).partial_work,
        "round.partial_work",
        True,
        f"false with policy={c.policy}: partial work applies to {supported} (or a user policy setting partial_work)",
    )


def _validate_mode(c: ServerScenario) -> None:
    """round.mode=buffered|async (emulator.run.buffered): a policy that supports it, and no key whose meaning
    is a synchronous round's."""
    mode, b = c.round.mode, c.buffered
    check(RoundMode.admits(mode), "round.mode", mode, RoundMode.describe())
    check(Staleness.admits(b.staleness), "buffered.staleness", b.staleness, Staleness.describe())
    if mode == RoundMode.SYNC:
        return
    supported = ", ".join(name for name, p in POLICIES.items() if p.buffered)
    check(
        policy_class(c.policy).buffered,
        "round.mode",
        mode,
        f"sync with policy={c.policy}: buffered and async modes apply to {supported} "
        "(or a user policy setting buffered = True)",
    )
    n = c.clients.n
    check(b.concurrency <= n, "buffered.concurrency", b.concurrency, f"an integer in [1, clients.n={n}]")
    check(b.k <= n, "buffered.k", b.k, f"an integer in [1, clients.n={n}] (a client adds one update to a version)")
    why = f"with round.mode={mode}"
    sel = c.clients.select
    check(sel != Selection.ALL, "clients.select", sel, f"uniform | round_robin {why} (it fills free slots)")
    check(not c.round.partial_work, "round.partial_work", True, f"false {why}")
    links = c.links
    for key, bps in (("server_down_bps", links.server_down_bps), ("server_up_bps", links.server_up_bps)):
        check(bps == 0, f"links.{key}", bps, f"0 (unlimited) {why}: a shared server link is a synchronous round's")
    on = c.availability.on_unavailable
    check(on == OnUnavailable.EXCLUDE, "availability.on_unavailable", on, f"exclude {why}")
    check(
        c.impact.kind == ImpactKind.DATA_SIZE,
        "impact.kind",
        c.impact.kind,
        f"data_size (the default) {why}: an update's weight is buffered.staleness's",
    )
    for i, rule in enumerate(c.data.quality):
        check(rule.from_round == 0, f"data.quality[{i}].from_round", rule.from_round, f"0 {why}")


def _validate_eval(c: ServerScenario) -> None:
    """A policy that reads the evaluation plans each round from the evaluation of the one before."""
    check(
        c.eval.every == 1 or not policy_class(c.policy).reads_evaluation(),
        "eval.every",
        c.eval.every,
        f"1 with policy={c.policy}, which reads the server's evaluation of every round (it overrides observe)",
    )


def _validate_output(c: ServerScenario) -> None:
    """The TensorBoard logger's package is there when asked for, and every hook of the user's loads."""
    from importlib.util import find_spec

    from emulator.hooks import HookLoadError, load_hook

    check(
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


def _validate_model(c: schema.Scenario) -> None:
    """A known model, defined for the shape of the data's samples."""
    from nodes.data import dataset_spec
    from nodes.training.model_catalog import MODEL_NAMES, designed_inputs

    check(c.model.name in MODEL_NAMES, "model.name", c.model.name, " | ".join(sorted(MODEL_NAMES)))
    shape, wanted = dataset_spec(c.data).sample_shape, designed_inputs(c.model.name)
    check(
        wanted is None or shape in wanted,
        "model.name",
        c.model.name,
        f"a model for data.dataset={c.data.dataset}, whose samples have shape {shape} "
        f"({c.model.name} is defined for input {' or '.join(map(str, wanted or ()))})",
    )

"""`load`: schema defaults <- scenario file <- each override in turn, merged by OmegaConf, which
checks every key and type; then the files it names found and the whole validated."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, is_dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, get_type_hints

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from emulator.config.errors import PROBLEM_CHARS, ConfigError, clip
from emulator.config.files import find_files, read_scenario, resolve_scenario_path
from emulator.config.overrides import parse_override
from emulator.config.server_scenario import ServerScenario
from emulator.config.validation import validate
from nodes.contracts.schema import list_entry_type

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def load(scenario: str | None = None, overrides: Sequence[str] = ()) -> ServerScenario:
    """Schema defaults <- scenario YAML <- each dotted override in turn; trace files found (`find_files`),
    then `validate`."""
    cfg: DictConfig = OmegaConf.structured(ServerScenario)
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


_UNSET = object()


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


def _merge(cfg: DictConfig, layer: Callable[[], dict[str, Any]], source: str) -> None:
    """Merge the dict `layer()` into cfg, in place (OmegaConf.merge would deep-copy the whole
    scenario for each override, start-up time: python -m bench --only startup); a failure names its
    key, or else `source`, and leaves cfg half-merged, which load discards."""
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
    data: dict[str, Any], cls: DataclassInstance | type[DataclassInstance] = ServerScenario, prefix: str = ""
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

"""Hydra as the command line: its argument parser (-m, --cfg, --info, -sc), its override grammar
(`key=v`, `+key=v`, `++key=v`, `~key`, comma lists, range(), choice(), glob()), its sweepers and its
launchers (basic, joblib, submitit, ray, ...).

The primary config is the scenario schema (emulator.config.ServerScenario) plus the `scenario` key,
so Hydra checks every override's key and type and tab-completes the keys. A scenario file is not a
config group (it may be any path, and is read bounded and strict: emulator.config.read_scenario),
so the scenario a job runs is `emulator.config.load(scenario, the job's overrides)`: schema defaults
<- scenario file <- overrides, validated. Hydra changes no directory and writes no outputs/,
.hydra/ or log files: a run writes runs/<name>/ as it always did.

Every import of Hydra's private modules (hydra._internal) is here, so a Hydra release that moves
them is met in one place.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from emulator.config import (
    SCENARIO_DIR,
    ConfigError,
    ServerScenario,
    clip,
    omegaconf_message,
    parse_override,
    read_scenario,
)
from emulator.policies import POLICIES

if TYPE_CHECKING:
    import argparse

    from hydra._internal.hydra import Hydra
    from hydra.core.override_parser.types import Override

APP = "emulator"  # the primary config's name in Hydra's ConfigStore

# Hydra's output directory is the working directory (so it creates nothing), no .hydra/ copy of
# the config, no logging set-up or log files, no chdir. A sweep sets hydra.sweep.dir to its own
# directory (emulator.cli.sweep), where Hydra keeps multirun.yaml and a launcher its logs (.submitit/).
HYDRA_SETTINGS = {
    "run": {"dir": "."},
    "sweep": {"dir": ".", "subdir": "."},
    "output_subdir": None,
    "job": {"chdir": False},
}


def _register(completion: bool, scenario: str | None) -> None:
    store = ConfigStore.instance()
    defaults: list[str | dict[str, str | None]] = ["_self_"]
    for group in CHOICES:
        store.repo.pop(group, None)  # a run reads policy and scenario as keys (completion below)
    if completion:  # their values listed as Hydra lists a config group's options
        for group, names in CHOICES.items():
            for name in names():
                store.store(group=group, name=name, node={group: name}, package="_global_")
            defaults.append({group: None})
    defaults += [{"override hydra/job_logging": "none"}, {"override hydra/hydra_logging": "none"}]
    node = OmegaConf.structured(ServerScenario)
    if scenario:  # so that Hydra, too, finds the policy_args a ~policy_args.k removes
        node.policy_args = read_scenario(scenario).get("policy_args") or {}
    OmegaConf.set_struct(node.policy_args, False)  # a user policy's options: free-form (policy_args.k=4)
    with open_dict(node):
        node.scenario = None  # a path or a shipped name: emulator.config.files.resolve_scenario_path
    store.store(name=APP, node=OmegaConf.merge({"defaults": defaults, "hydra": HYDRA_SETTINGS}, node))


# What tab completion offers for policy= and scenario= (a run takes any module:Class and any path)
CHOICES: dict[str, Callable[[], list[str]]] = {
    "policy": lambda: list(POLICIES),
    "scenario": lambda: sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")),
}


@contextmanager
def instance(completion: bool = False, scenario: str | None = None) -> Iterator[Hydra]:
    """A Hydra for this process's command (Hydra is a process-wide singleton: cleared after); for
    tab completion only, policy and scenario are config groups too (a run reads them as keys: a
    scenario may be any path, a policy any module:Class). `scenario`: the one every job reads."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra

    # hydra.main's own steps, minus its error printer (run_and_report): errors stay ours, one line
    version.setbase("1.3")
    GlobalHydra.instance().clear()
    _register(completion, scenario)
    try:
        yield Hydra.create_main_hydra2(task_name=APP, config_search_path=create_config_search_path(None))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(message(e)) from None
    finally:
        GlobalHydra.instance().clear()


def message(e: Exception) -> str:
    """Hydra's error as one line naming the key: OmegaConf's cause when there is one."""
    cause = e.__cause__
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        text = omegaconf_message(cause)
        hydra_key = str(getattr(cause, "full_key", "")).startswith("hydra.")
        return text.replace("python -m emulator --help", "--cfg hydra; +key=value adds one") if hydra_key else text
    lines = [line.strip() for line in str(e).splitlines() if line.strip() and not line.startswith("See https://")]
    return clip(" ".join(lines), 300)


def parse(items: Sequence[str]) -> list[Override]:
    """The command line's overrides in Hydra's grammar; a malformed one is one ConfigError naming it."""
    return [parse_override(item) for item in items]


def task_items(parsed: Sequence[Override]) -> list[str]:
    """The overrides of the scenario (every one but Hydra's own hydra.* and hydra/... overrides)."""
    return [o.input_line or "" for o in parsed if not o.is_hydra_override()]


def quoted(text: str) -> str:
    """`text` as a quoted value of Hydra's grammar (a run directory holds `=`, which unquoted
    would end the key): inside quotes only a quote, and the backslashes before one or before the
    end, are escaped."""
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m[1] * 2 + ("\\" + m[2] if m[2] else ""), text) + "'"


def args_parser() -> argparse.ArgumentParser:
    """Hydra's command-line parser: the overrides and its flags (-m, --cfg, --info, -sc, --hydra-help)."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def grid(overrides: Sequence[Override]) -> list[list[str]]:
    """Every point's overrides as Hydra's basic sweeper expands a grid: the product of the swept
    keys' values, in the order given."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    try:
        (points,) = BasicSweeper.split_arguments(list(overrides), max_batch_size=None)
    except HydraException as e:
        raise ConfigError(message(e)) from None
    return points

"""The scenario a user writes: the schema (nodes.contracts.schema) plus a section per policy (ServerScenario),
loaded from YAML plus dotted overrides, validated, and explained (--help).

OmegaConf does the merging and type checking (unknown keys, wrong types); `validate` checks every
number against its key's `Range` (one walker over the schema) and then what the keys mean together.
Scenario files are read bounded (size, nesting, alias expansion) and strict (UTF-8, no duplicate
keys). Every failure becomes one `ConfigError` naming the key, the bad value and what was expected.

One job a module: errors (ConfigError and its one line), server_scenario (the composed class and
what of it a policy is given),
files (the scenario file and the files it names), overrides (Hydra's override grammar), loading
(`load`: the merge), validation and time_model_checks (`validate`), help (`help_text`).
"""

from emulator.config.errors import ConfigError, check, clip
from emulator.config.files import SCENARIO_DIR, read_scenario
from emulator.config.help import help_text
from emulator.config.loading import load, omegaconf_message
from emulator.config.overrides import parse_override, split_args
from emulator.config.server_scenario import (
    ServerScenario,
    chosen_sections,
    from_dict,
    policy_options,
    policy_settings,
    round_settings,
)
from emulator.config.validation import validate

__all__ = [
    "SCENARIO_DIR",
    "ConfigError",
    "ServerScenario",
    "check",
    "chosen_sections",
    "clip",
    "from_dict",
    "help_text",
    "load",
    "omegaconf_message",
    "parse_override",
    "policy_options",
    "policy_settings",
    "read_scenario",
    "round_settings",
    "split_args",
    "validate",
]

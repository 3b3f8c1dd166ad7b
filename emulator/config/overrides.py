"""One command-line override read by Hydra's override grammar, so that a run, and each point of a
sweep, means what Hydra made of it."""

from __future__ import annotations

import re

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException

from emulator.config.errors import PROBLEM_CHARS, ConfigError, clip
from emulator.formats import untrusted_yaml

_PARSER = OverridesParser.create()

# transport.address=tcp://[::1]:5555 as typed: Hydra's grammar would read the brackets as a list
_IPV6_ADDRESS = re.compile(r"(\+{0,2}transport\.address)=(tcp://\[[^'\"\\,\s]*)")


def parse_override(item: str) -> Override:
    """One override in Hydra's grammar (a bracketed IPv6 transport.address taken as one value, quoted);
    a malformed one is one ConfigError naming it."""
    if ipv6 := _IPV6_ADDRESS.fullmatch(item):
        item = f"{ipv6[1]}='{ipv6[2]}'"
    if not item.startswith("~"):
        _check_shape(item)
    try:
        return _PARSER.parse_override(item)
    except HydraException as e:  # OverrideParseException, or the grammar's own error as a HydraException
        lines = [line for line in str(e).splitlines() if line and not line.startswith(("See ", "Error parsing"))]
        hint = "; quote a value holding brackets: transport.address='tcp://[::1]:5555'" if "://[" in item else ""
        problem = clip(" ".join(lines), PROBLEM_CHARS)
        raise ConfigError(f"{clip(item)}: {problem} (Hydra's override grammar{hint})") from None


def _check_shape(item: str) -> None:
    """A `key=value` whose value does not nest or expand too far (what the parser would recurse into)."""
    if "=" not in item:
        raise ConfigError(f"{clip(item)}: expected key=value")
    key, value = item.split("=", 1)
    try:
        problem = untrusted_yaml.shape_problem(value)
    except yaml.YAMLError:
        problem = ""  # not YAML: OmegaConf reports it, or takes it as text
    if problem:
        raise ConfigError(f"{clip(key)}: the YAML value {clip(problem, PROBLEM_CHARS)}")


def split_args(args: list[str]) -> tuple[str | None, list[str]]:
    """The command line's `scenario=NAME` apart from its dotted overrides (their order kept)."""
    scenario, overrides = None, []
    for a in args:
        if a.startswith("scenario="):
            scenario = str(parse_override(a).value())
        else:
            overrides.append(a)
    return scenario, overrides

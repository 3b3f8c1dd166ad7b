"""The files a scenario comes from: its own file, found by path or shipped name and read bounded
(size, nesting, alias expansion) and strict (UTF-8, no duplicate keys), and every trace and
availability file it names, found beside it or among the shipped scenarios."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from emulator.config.errors import PROBLEM_CHARS, ConfigError, clip
from emulator.config.server_scenario import value_at
from emulator.formats import untrusted_yaml
from emulator.timemodel.resources import TRACE_LISTS
from nodes.contracts import schema


def _shipped_scenarios() -> Path:
    """The shipped scenarios: the repository's scenarios/ in a checkout (an editable install too), the
    same files as package data under emulator/scenarios in an installed wheel (pyproject.toml)."""
    package = Path(str(resources.files("emulator")))
    packaged = package / "scenarios"
    return packaged if packaged.is_dir() else package.parent / "scenarios"


SCENARIO_DIR = _shipped_scenarios()

MAX_SCENARIO_BYTES = 2**20  # scenarios are a few KiB


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


def find_files(c: schema.Scenario, here: Path) -> None:
    """Every trace and availability file as an absolute path: a relative one is looked up in `here`
    (the scenario file's directory, or the working directory without one), then in scenarios/.
    run.json keeps the absolute paths, so a resumed run reads the same files."""
    for key in TRACE_LISTS:
        files = value_at(c, key.split("."))
        files[:] = [_find(f"{key}[{i}]", name, here) for i, name in enumerate(files)]
    if c.availability.file:
        c.availability.file = _find("availability.file", c.availability.file, here)


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

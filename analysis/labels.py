"""What a configuration is called in tables and figures: the name of its sweep or run (or, where
that name is a generated timestamp, the scenario's name) plus its swept keys.

Runs given the same label whose scenarios still differ (two timestamped runs of one scenario
with different overrides) get the keys they differ in appended, so that they are never averaged
as seeds of one configuration.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class Run(Protocol):
    """What labelling reads of an analysis.load.Run (not imported: load imports this module)."""

    root: Path
    keys: dict[str, str]
    manifest: dict
    config: str


# emulator.output.results.new_run_dir's and emulator.cli.sweep's default names: a time says nothing of the run
GENERATED_NAME = re.compile(r"(sweep-)?\d{8}-\d{6}(-\d{6})?")
NOT_CONFIGURATION = ("seed", "output.")  # keys that never make two runs different configurations


def _flat(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = str(v)
    return out


def _name(run: Run) -> str:
    if GENERATED_NAME.fullmatch(run.root.name):
        return str(run.manifest.get("scenario", {}).get("name") or run.root.name)
    return run.root.name


def label(run: Run, several_roots: bool, leave_out: tuple[str, ...] = ()) -> str:
    """The run's name (when runs come from several roots, or it has no keys) and its path keys,
    but seed and `leave_out`."""
    keys = ", ".join(f"{k}={v}" for k, v in run.keys.items() if k not in ("seed", *leave_out))
    return (f"{_name(run)}: {keys}" if several_roots else keys) if keys else _name(run)


def label_configs(runs: Sequence[Run]) -> None:
    """Set every run's `config` label."""
    several_roots = len({r.root for r in runs}) > 1
    for r in runs:
        r.config = label(r, several_roots)
    same_label: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        same_label[r.config].append(r)
    for group in same_label.values():
        scenarios = [
            {k: v for k, v in _flat(r.manifest.get("scenario", {})).items() if not k.startswith(NOT_CONFIGURATION)}
            for r in group
        ]
        differing = sorted({k for s in scenarios for k in s if any(t.get(k) != s.get(k) for t in scenarios)})
        for r, scenario in zip(group, scenarios, strict=True):
            if differing:
                r.config += " (" + ", ".join(f"{k}={scenario.get(k, '—')}" for k in differing) + ")"

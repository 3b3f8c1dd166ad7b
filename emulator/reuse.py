"""When an earlier run may stand for a new one: a sweep (or a reproduction) reuses a complete run,
or continues an interrupted one, only if it computes what the new one asks for, i.e. its resolved
scenario in run.json equals the new one's, bar where and how it ran. A key that a later version
added is absent from an older run.json; it matches when the new run leaves it at its default (a
new key's default is the behaviour before it existed). The code version is recorded (run.json
`git_commit`) but not compared: a fix that changes results needs a new output.name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from emulator.config import chosen_sections, load
from nodes.schema import Scenario, to_dict

# Where and how a run ran, not what it computed: the output location, the worker count (results
# never depend on it, tests/e2e/test_runtime.py), the transport's sockets, keys and timeouts, and
# whether the evaluation overlapped the next round (tests/e2e/test_evaluation_e2e.py).
RESULT_NEUTRAL = ("output", "workers", "transport", "eval.overlap")


def _comparable(scenario: Mapping[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in chosen_sections(scenario).items() if k not in RESULT_NEUTRAL}
    for key in RESULT_NEUTRAL:
        section, _, name = key.partition(".")
        if name and isinstance(kept.get(section), dict):
            kept[section] = {k: v for k, v in kept[section].items() if k != name}
    return kept


def _differences(old: Any, new: Any, default: Any, key: str = "") -> list[str]:
    if old is _ABSENT and isinstance(new, dict):  # a whole section added since: each key at its default
        old = {}
    if isinstance(old, dict) and isinstance(new, dict):
        default = default if isinstance(default, dict) else {}
        return [
            d
            for k in sorted(old.keys() | new.keys())
            for d in _differences(old.get(k, _ABSENT), new.get(k), default.get(k), _join(key, k))
        ]
    if old == new or (old is _ABSENT and new == default):
        return []
    return [f"{key or 'scenario'} {_show(old)} -> {_show(new)}"]


_ABSENT = object()  # a key the older run.json does not have


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _show(value: Any) -> str:
    return "(absent)" if value is _ABSENT or value is None else json.dumps(value)


def manifest(run_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def config_changes(run_dir: Path, cfg: Scenario) -> list[str]:
    """The scenario keys whose values in run_dir's run.json differ from cfg's, as 'key old -> new'
    (every key when there is no readable run.json)."""
    doc = manifest(run_dir)
    if doc is None or not isinstance(doc.get("scenario"), dict):
        return ["run.json (missing or unreadable)"]
    # as run.json holds them (JSON types)
    wanted, default = (json.loads(json.dumps(to_dict(c))) for c in (cfg, load(None, [f"policy={cfg.policy}"])))
    return _differences(_comparable(doc["scenario"]), _comparable(wanted), _comparable(default))


def why_not_reused(run_dir: Path, cfg: Scenario) -> str:
    """'' when the run in run_dir is complete and computed what cfg asks for; else why not, in a few words."""
    doc = manifest(run_dir)
    if doc is None:
        return "no run yet"
    if doc.get("status") != "complete":
        return f"run.json status {doc.get('status')!r}"
    changes = config_changes(run_dir, cfg)
    if changes:
        more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
        return "config changed: " + ", ".join(changes[:3]) + more
    return ""

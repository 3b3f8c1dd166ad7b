"""When an earlier run may stand for a new one: a sweep (or a reproduction) reuses a complete run,
or continues an interrupted one, only if it computes what the new one asks for, i.e. its resolved
scenario in run.json equals the new one's, bar where and how it ran. A key that a later version
added is absent from an older run.json; it matches when the new run leaves it at its default (a
new key's default is the behaviour before it existed). The code version is recorded (run.json
`git_commit`) but not compared: a fix that changes results needs a new output.name.

`prepare` is what a sweep or a reproduction does with a point's directory: reuse, resume, or
start over with the earlier run moved aside (kept: it may be hours of compute).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from emulator.config import chosen_sections, load
from emulator.run.bundles import with_bundle
from emulator.run.devices import placement
from nodes.contracts.schema import Scenario, bundle_size, to_dict

# Where and how a run ran, not what it computed: the output location, the worker count (results
# never depend on it, tests/e2e/test_runtime.py), the transport's sockets, keys and timeouts, and
# whether the evaluation overlapped the next round (tests/e2e/test_evaluation_e2e.py).
RESULT_NEUTRAL = ("output", "workers", "transport", "eval.overlap")


def _comparable(scenario: Mapping[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in chosen_sections(scenario).items() if k not in RESULT_NEUTRAL}
    if isinstance(kept.get("train"), dict):  # K as text; a run.json from before the key trained one at a time
        kept["train"] = {**kept["train"], "bundle": str(kept["train"].get("bundle", 1))}
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
    return _changes(manifest(run_dir), cfg)


def _changes(doc: dict[str, Any] | None, cfg: Scenario) -> list[str]:
    """config_changes, of a run.json already read (None: none readable)."""
    if doc is None or not isinstance(doc.get("scenario"), dict):
        return ["run.json (missing or unreadable)"]
    # as run.json holds them (JSON types), train.bundle = auto resolved as a run of cfg here would
    resolved = with_bundle(cfg, placement(cfg))[0] if bundle_size(cfg.train.bundle) is None else cfg
    wanted, default = (json.loads(json.dumps(to_dict(c))) for c in (resolved, load(None, [f"policy={cfg.policy}"])))
    return _differences(_comparable(doc["scenario"]), _comparable(wanted), _comparable(default))


NO_RUN = "no run yet"
# Where `prepare` moves an earlier run, under the sweep's directory: hidden, so that analysis of the
# sweep (analysis.load.discover skips hidden directories) reads the current runs only.
REPLACED_DIR = ".replaced"


def why_not_reused(run_dir: Path, cfg: Scenario) -> str:
    """'' when the run in run_dir is complete and computed what cfg asks for; else why not, in a few words."""
    return _verdict(run_dir, cfg)[0]


def _verdict(run_dir: Path, cfg: Scenario) -> tuple[str, list[str]]:
    """(why_not_reused, config_changes), from one read of run.json and one comparison (each loads the
    default scenario)."""
    doc = manifest(run_dir)
    changes = _changes(doc, cfg)
    if doc is None:
        return NO_RUN, changes
    if doc.get("status") != "complete":
        return f"run.json status {doc.get('status')!r}", changes
    if changes:
        more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
        return "config changed: " + ", ".join(changes[:3]) + more, changes
    return "", changes


def prepare(run_dir: Path, cfg: Scenario, root: Path) -> tuple[str, str]:
    """What to do for a run of cfg in run_dir, and why: ("reuse", "") for a complete run that computed
    what cfg asks; ("resume", why) for an interrupted one that does, with a checkpoint to continue
    from (python -m emulator resume); else ("start", why), any earlier run there first moved to
    root/.replaced/<time>/<its path under root>: kept, not deleted, for it may be hours of compute and
    the reason it no longer matches may be ours."""
    why, changes = _verdict(run_dir, cfg)
    if not why:
        return "reuse", ""
    if (run_dir / "checkpoint.npz").exists() and not changes:
        return "resume", why
    if (run_dir / "run.json").exists():
        kept = root / REPLACED_DIR / time.strftime("%Y%m%dT%H%M%S") / run_dir.relative_to(root)
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(run_dir, kept)
        why = f"{why}; the earlier run is now {kept}"
    shutil.rmtree(run_dir, ignore_errors=True)  # an attempt killed before it wrote run.json
    return "start", why

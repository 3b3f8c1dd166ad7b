"""What the server needs to continue a run after its last completed round, in one file.

`checkpoint.npz` holds the global model's tensors and, under STATE_KEY, a JSON document with
the rest (round, virtual time, bytes spent, link states, policy and privacy state). It is
written to a temporary name and renamed, so a kill leaves the previous checkpoint intact; the
one before it is kept as `checkpoint.prev.npz`, so that a damaged file (a disk error, a bad
copy) costs one round instead of the run. RNG streams are keyed by (purpose, round, client),
so there is no generator state to save.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

FILE = "checkpoint.npz"
PREVIOUS = "checkpoint.prev.npz"
STATE_KEY = "__state__"

log = logging.getLogger("dpfl")


class CheckpointError(ValueError):
    """Checkpoints exist but none can be read."""


def save(run_dir: Path, weights: dict[str, np.ndarray], state: str) -> int:
    """Write the checkpoint atomically, keeping the one before; returns its size in bytes. `state`
    is the JSON document that `snapshot` made of the rest of the state."""
    if STATE_KEY in weights:
        raise ValueError(f"a model tensor may not be named {STATE_KEY}")
    blob = np.frombuffer(state.encode(), dtype=np.uint8)
    tmp = run_dir / (FILE + ".tmp")
    with open(tmp, "wb") as f:
        # Any: numpy's stub would match the names against savez's own keyword allow_pickle: bool
        arrays: dict[str, Any] = {**weights, STATE_KEY: blob}
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    if (run_dir / FILE).exists():  # a kill between these renames leaves PREVIOUS only: load() takes it
        os.replace(run_dir / FILE, run_dir / PREVIOUS)
    os.replace(tmp, run_dir / FILE)
    return (run_dir / FILE).stat().st_size


def snapshot(state: dict[str, Any]) -> str:
    """`state` as a checkpoint holds it, taken now: its JSON document (encoded once, for `save`)."""
    return json.dumps(state, sort_keys=True, allow_nan=True)


def load(run_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """(weights, state) of the newest readable checkpoint, with a warning if that is not the
    newest one; None if the run never wrote one."""
    paths = [run_dir / name for name in (FILE, PREVIOUS) if (run_dir / name).is_file()]
    problems = [] if (run_dir / FILE).is_file() or not paths else [f"{FILE}: missing"]
    for path in paths:
        try:
            weights, state = _read(path)
        except Exception as e:  # a damaged file raises anything: zipfile, zlib, numpy, json errors
            problems.append(f"{path.name}: {type(e).__name__}: {e}")
            continue
        if problems:
            log.warning(
                "%s is unreadable (%s); continuing from %s (round %s)",
                FILE,
                "; ".join(problems),
                path.name,
                state.get("next_round"),
            )
        return weights, state
    if problems:
        raise CheckpointError(f"{run_dir}: no readable checkpoint ({'; '.join(problems)})".replace("\n", " "))
    return None


def _read(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with np.load(path, allow_pickle=False) as z:
        weights = {k: z[k] for k in z.files if k != STATE_KEY}
        state = json.loads(z[STATE_KEY].tobytes().decode())
    if not isinstance(state, dict):
        raise ValueError(f"{STATE_KEY} is not a JSON object")
    return weights, state

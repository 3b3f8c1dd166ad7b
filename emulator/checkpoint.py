"""What the server needs to continue a run after its last completed round, in one file.

`checkpoint.npz` holds the global model's tensors and, under STATE_KEY, a JSON document with
the rest (round, virtual time, bytes spent, link states, policy and privacy state). It is
written to a temporary name and renamed, so a kill leaves the previous checkpoint intact.
RNG streams are keyed by (purpose, round, client), so there is no generator state to save.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

FILE = "checkpoint.npz"
STATE_KEY = "__state__"


def save(run_dir: Path, weights: dict[str, np.ndarray], state: dict) -> int:
    """Write the checkpoint atomically; returns its size in bytes."""
    if STATE_KEY in weights:
        raise ValueError(f"a model tensor may not be named {STATE_KEY}")
    blob = np.frombuffer(json.dumps(state, sort_keys=True, allow_nan=True).encode(), dtype=np.uint8)
    tmp = run_dir / (FILE + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **weights, **{STATE_KEY: blob})
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, run_dir / FILE)
    return (run_dir / FILE).stat().st_size


def load(run_dir: Path) -> tuple[dict[str, np.ndarray], dict]:
    path = run_dir / FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no checkpoint (the run completed no round, or is not a run directory)")
    with np.load(path, allow_pickle=False) as z:
        weights = {k: z[k] for k in z.files if k != STATE_KEY}
        state = json.loads(z[STATE_KEY].tobytes().decode())
    return weights, state

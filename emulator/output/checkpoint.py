"""What the server needs to continue a run after its last completed round, in one file.

`checkpoint.npz` holds the global model's tensors and, under STATE_KEY, a JSON document with
the rest (round, virtual time, bytes spent, link states, policy and privacy state). It is
written to a temporary name and renamed, so a kill leaves the previous checkpoint intact; the
one before it is kept as `checkpoint.prev.npz`, so that a damaged file (a disk error, a bad
copy) costs one round instead of the run. RNG streams are keyed by (purpose, round, client),
so there is no generator state to save.

A checkpoint is input too: `resume` uses one only if `validate` finds it fits the run (its format
version, every key of the state document in its range, the model's tensors, every tensor finite and
below MAX_ABS, the rounds on disk, the policy's state), else falls back to the one before it, else
refuses.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from emulator.config import clip
from emulator.formats import encoded_json
from emulator.rounds.flights import valid_state
from nodes.contracts.tasks import MAX_ABS

FILE = "checkpoint.npz"
PREVIOUS = "checkpoint.prev.npz"
STATE_KEY = "__state__"
VERSION_KEY = "format_version"
FORMAT_VERSION = 3  # raise it when the state or tensors change: resume refuses older ones by name, not misreads them


log = logging.getLogger("dpfl")


class CheckpointError(ValueError):
    """Checkpoints exist but none can be used."""


class InvalidCheckpoint(ValueError):
    """A readable checkpoint that does not fit the run: the message names the key and what was expected."""


@dataclass(frozen=True)
class Expected:
    """What a checkpoint of one run must hold: from its scenario (run.json) and its tables."""

    rounds: int  # budget.rounds
    clients: int  # clients.n
    shapes: Mapping[str, tuple[int, ...]]  # the model's parameters, each float32
    rounds_on_disk: AbstractSet[int]  # the rounds with a row in the rounds table
    load_policy: Callable[[Any], object]  # a fresh policy's load_state_dict: raises on a state it cannot take


@dataclass(frozen=True)
class Key:
    """One key of the state document: whether a value fits the run, and what is expected if not."""

    ok: Callable[[Any, Expected], bool]
    expected: str  # formatted with Expected's fields


def _integer(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON's true is a Python int


# The state document besides VERSION_KEY: every key, its type and range against the run.
STATE_SCHEMA: dict[str, Key] = {
    "next_round": Key(lambda v, e: _integer(v) and 1 <= v <= e.rounds, "an integer in [1, {rounds}] (budget.rounds)"),
    "now": Key(
        lambda v, e: isinstance(v, float) and math.isfinite(v) and v >= 0, "a finite float >= 0 (virtual seconds)"
    ),
    "bytes_spent": Key(lambda v, e: _integer(v) and v >= 0, "an integer >= 0"),
    "links_bad": Key(
        lambda v, e: isinstance(v, list) and all(_integer(c) and 0 <= c < e.clients for c in v) and v == sorted(set(v)),
        "a sorted list of distinct client ids below {clients} (clients.n)",
    ),
    "policy": Key(lambda v, e: isinstance(v, dict), "a JSON object (the policy's state_dict)"),
}


def _residuals(v: object, e: Expected) -> bool:
    """client id -> tensor name -> base64 of the tensor's float32 bytes, every tensor of the model."""
    if not isinstance(v, dict):
        return False
    for client, tensors in v.items():
        if not (client.isdigit() and int(client) < e.clients and isinstance(tensors, dict)):
            return False
        if set(tensors) != set(e.shapes) or not all(isinstance(b, str) for b in tensors.values()):
            return False
        for name, b in tensors.items():
            try:
                if len(base64.b64decode(b, validate=True)) != 4 * math.prod(e.shapes[name]):
                    return False
            except binascii.Error:
                return False
    return True


# Keys only some runs' state documents hold: compression's error-feedback residuals (emulator.aggregate.compression)
# and buffered mode's dispatches and clients in flight (emulator.rounds.flights).
OPTIONAL_STATE: dict[str, Key] = {
    "residuals": Key(
        _residuals, "a map of client id (below {clients}) to every model tensor's float32 bytes in base64"
    ),
    "buffered": Key(
        lambda v, e: valid_state(v, e.clients, e.shapes),
        "buffered mode's state (emulator.rounds.flights): each client in flight (below {clients}) once",
    ),
}


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
    """`state` as a checkpoint holds it, taken now: its JSON document (encoded once, for `save`),
    stamped with the format version; an EncodedMap in it as its kept text."""
    return encoded_json.dumps({**state, VERSION_KEY: FORMAT_VERSION})


def validate(weights: Mapping[str, np.ndarray], state: Mapping[str, Any], expected: Expected) -> None:
    """Raise InvalidCheckpoint, naming the key or tensor, unless the checkpoint fits the run."""
    version = state.get(VERSION_KEY)
    if not (_integer(version) and version == FORMAT_VERSION):
        found = _shown(version) if VERSION_KEY in state else "none"
        raise InvalidCheckpoint(
            f"{VERSION_KEY} = {found}, expected {FORMAT_VERSION} (written by another version of dpfl-emulator)"
        )
    keys = set(state) - {VERSION_KEY} - set(OPTIONAL_STATE)
    if keys != set(STATE_SCHEMA):
        raise InvalidCheckpoint(_differ("state keys", keys, set(STATE_SCHEMA)))
    for key, spec in {**STATE_SCHEMA, **OPTIONAL_STATE}.items():
        if key in state and not spec.ok(state[key], expected):
            raise InvalidCheckpoint(f"{key} = {_shown(state[key])}, expected {spec.expected.format(**vars(expected))}")
    next_round = state["next_round"]
    lacking = [r for r in range(next_round) if r not in expected.rounds_on_disk]
    if lacking:  # a round's rows are written before its checkpoint
        raise InvalidCheckpoint(
            f"next_round = {next_round}, but the rounds table lacks {len(lacking)} of rounds 0-{next_round - 1} "
            f"(the first: {lacking[0]}); expected each on disk"
        )
    if set(weights) != set(expected.shapes):
        raise InvalidCheckpoint(_differ("tensors", set(weights), set(expected.shapes)))
    for name, shape in expected.shapes.items():
        w = weights[name]
        if w.shape != shape or w.dtype != np.float32:
            raise InvalidCheckpoint(f"tensor {clip(name)}: {w.dtype} {w.shape}, expected float32 {shape}")
    for where, tensor in _tensors(weights, state):
        problem = _implausible(tensor)
        if problem:
            raise InvalidCheckpoint(f"{where}: {problem}")
    try:
        expected.load_policy(state["policy"])
    except Exception as e:  # a policy's own load_state_dict may raise anything on a state it cannot take
        raise InvalidCheckpoint(f"policy: {type(e).__name__}: {clip(str(e), 300)}") from None


def _tensors(weights: Mapping[str, np.ndarray], state: Mapping[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """Every tensor of a checkpoint whose schema `validate` has checked, named as its message names it: the
    model's, each client's error-feedback residual and each buffered flight's reply (float32 in base64)."""
    for name, w in weights.items():
        yield f"tensor {clip(name)}", w
    for client, tensors in state.get("residuals", {}).items():
        for name, b in tensors.items():
            yield f"residuals.{client}.{clip(name)}", _float32s(b)
    for i, flight in enumerate(state.get("buffered", {}).get("flights", [])):
        for name, b in flight["tensors"].items():
            yield f"buffered.flights[{i}].tensors.{clip(name)}", _float32s(b)


def _float32s(b: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b, validate=True), dtype="<f4")


def _implausible(a: np.ndarray) -> str:
    """'' for finite values below MAX_ABS in magnitude; else what is wrong, in words."""
    if not np.isfinite(a).all():
        bad = a[~np.isfinite(a)]
        return f"non-finite values ({bad.size} of {a.size}, the first {bad[0]}), expected finite"
    if a.size and np.abs(a).max() >= MAX_ABS:
        return f"a value of magnitude {float(np.abs(a).max()):.3g}, expected below 2^64 (checkpoint.MAX_ABS)"
    return ""


def load(run_dir: Path, expected: Expected) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """(weights, state) of the newest checkpoint that can be read and fits the run (`validate`),
    with a warning saying what was wrong with any newer one; None if the run never wrote one."""
    paths = [run_dir / name for name in (FILE, PREVIOUS) if (run_dir / name).is_file()]
    problems = [] if (run_dir / FILE).is_file() or not paths else [f"{FILE}: missing"]
    for path in paths:
        try:
            weights, state = _read(path)
        except Exception as e:  # a damaged file raises anything: zipfile, zlib, numpy, json errors
            problems.append(f"{path.name}: {type(e).__name__}: {e}")
            continue
        try:
            validate(weights, state, expected)
        except InvalidCheckpoint as e:
            problems.append(f"{path.name}: {e}")
            continue
        if problems:
            log.warning(
                "%s cannot be used (%s); continuing from %s (round %s)",
                FILE,
                "; ".join(problems),
                path.name,
                state.get("next_round"),
            )
        return weights, state
    if problems:
        raise CheckpointError(f"{run_dir}: no usable checkpoint ({'; '.join(problems)})".replace("\n", " "))
    return None


def _shown(value: object) -> str:
    return clip(repr(value))


def _differ(what: str, got: AbstractSet[str], expected: AbstractSet[str]) -> str:
    """'what: missing [...], unexpected [...]; expected [...]', naming only what differs."""
    differ = [(label, keys) for label, keys in (("missing", expected - got), ("unexpected", got - expected)) if keys]
    return f"{what}: {', '.join(f'{label} {_names(keys)}' for label, keys in differ)}; expected {_names(expected)}"


def _names(names: AbstractSet[str]) -> str:
    return clip(repr(sorted(names)), 300)


def _read(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with np.load(path, allow_pickle=False) as z:
        weights = {k: z[k] for k in z.files if k != STATE_KEY}
        state = json.loads(z[STATE_KEY].tobytes().decode())
    if not isinstance(state, dict):
        raise ValueError(f"{STATE_KEY} is not a JSON object")
    return weights, state

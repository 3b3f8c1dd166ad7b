"""Wire format: msgpack maps with a protocol version; tensors as raw little-endian buffers.

Nothing that crosses a socket is ever unpickled. `decode` enforces the size limit, the
envelope (map, version, type) and a per-type field table (every field present, of its
type, nothing else), so that a message that decodes can be used without further checks.
Anything else raises `ProtocolError`, whose `reason` is one of REASONS (the server counts
rejections by reason): whatever the bytes, `decode` raises nothing else.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

VERSION = 1
DTYPES = ("float32", "float64", "float16", "int64", "int32", "uint8")
MAX_NAME = 255  # a ZeroMQ identity is at most 255 bytes
UPDATE_METRICS = ("steps", "train_loss", "update_norm")  # what the server reads from every update
MAX_RANK = 8  # numpy refuses more than 64 dimensions; no model here has more than 4
MAX_SPAN = 2**40  # product of a shape's non-zero dimensions (numpy refuses an empty tensor that "spans" 2^63)

# Why decode rejects a message: the keys of the server's per-reason counters.
REASONS = (
    "oversized",
    "undecodable",
    "not_a_map",
    "version",
    "unknown_type",
    "missing_field",
    "unknown_field",
    "field_type",
    "bad_tensor",
    "non_finite",
    "invalid",
)


class ProtocolError(ValueError):
    """A message that does not decode or does not match the field table."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


# --- field types -------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    expected: str  # for the error message
    valid: Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return type(v) is int  # msgpack yields exact types; bool is not an int here


def _is_number(v: Any) -> bool:
    return type(v) in (int, float)


def _is_str_map(v: Any, value_ok: Callable[[Any], bool]) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and value_ok(x) for k, x in v.items())


def _is_metrics(v: Any) -> bool:
    return (
        _is_str_map(v, _is_number) and all(k in v for k in UPDATE_METRICS) and _is_int(v["steps"]) and v["steps"] >= 0
    )


def _is_tensors(v: Any) -> bool:
    check_tensors(v)  # raises its own, more precise ProtocolError
    return True


COUNT = Field("an integer >= 0", lambda v: _is_int(v) and v >= 0)
NAME = Field(f"a string of 1 to {MAX_NAME} characters", lambda v: isinstance(v, str) and 0 < len(v) <= MAX_NAME)
TEXT = Field("a string", lambda v: isinstance(v, str))
SECONDS = Field("a number > 0", lambda v: _is_number(v) and v > 0)
MAP = Field("a map with string keys", lambda v: _is_str_map(v, lambda _: True))
PARAMS = Field(
    "a map of string to number, string or bool", lambda v: _is_str_map(v, lambda x: type(x) in (int, float, str, bool))
)
METRICS = Field(f"a map of string to number with {', '.join(UPDATE_METRICS)} (steps an integer >= 0)", _is_metrics)
TENSORS = Field("a list of [name, dtype, shape, data] tensors", _is_tensors)

# type -> its fields, all required. Deliberately small: a message either matches or is rejected.
FIELDS: dict[str, dict[str, Field]] = {
    "hello": {"worker": NAME, "pid": COUNT},
    "setup": {"scenario": MAP, "wire_log": TEXT, "heartbeat_s": SECONDS},
    "ready": {"worker": NAME},
    "heartbeat": {},
    "task": {"round": COUNT, "client": COUNT, "params": PARAMS, "model": TENSORS},
    "update": {"round": COUNT, "client": COUNT, "model": TENSORS, "metrics": METRICS},
    "error": {"round": COUNT, "client": COUNT, "message": TEXT},
    "shutdown": {},
}


# --- tensors -----------------------------------------------------------------------------


def pack_tensors(state: dict[str, np.ndarray]) -> list[list[Any]]:
    """Ordered [name, dtype, shape, bytes] quadruples (order = the model's parameter order)."""
    out: list[list[Any]] = []
    for name, a in state.items():
        a = np.ascontiguousarray(a)
        out.append([name, a.dtype.name, list(a.shape), a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()])
    return out


def unpack_tensors(items: Any) -> dict[str, np.ndarray]:
    """The tensors as numpy arrays; a header numpy could not build is a ProtocolError, checked
    in Python ints first, so that numpy never sees a hostile shape."""
    if not isinstance(items, list):
        raise ProtocolError("bad_tensor", "model: expected a list of tensors")
    state: dict[str, np.ndarray] = {}
    for item in items:
        if not (isinstance(item, list) and len(item) == 4):
            raise ProtocolError("bad_tensor", "model: expected [name, dtype, shape, data] per tensor")
        name, dtype, shape, data = item
        if not isinstance(name, str) or name in state:
            raise ProtocolError("bad_tensor", f"model: bad or duplicate tensor name {_short(name)}")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ProtocolError("bad_tensor", f"model.{name}: dtype {_short(dtype)} not in {DTYPES}")
        # the rank first: the element count of a long shape of huge dimensions is a quadratic product
        if not (isinstance(shape, list) and len(shape) <= MAX_RANK and all(_is_int(d) and d >= 0 for d in shape)):
            raise ProtocolError(
                "bad_tensor", f"model.{name}: bad shape {_short(shape)} (expected at most {MAX_RANK} integers >= 0)"
            )
        if not isinstance(data, bytes):
            raise ProtocolError("bad_tensor", f"model.{name}: data must be raw bytes")
        dt = np.dtype(dtype).newbyteorder("<")
        if _product(shape) * dt.itemsize != len(data):
            raise ProtocolError("bad_tensor", f"model.{name}: {len(data)} bytes do not match shape {shape} of {dtype}")
        if _product(d for d in shape if d) > MAX_SPAN:
            raise ProtocolError("bad_tensor", f"model.{name}: shape {shape} has dimensions over {MAX_SPAN}")
        state[name] = np.frombuffer(data, dtype=dt).reshape(shape).astype(dtype, copy=False)
    return state


def check_tensors(items: Any) -> None:
    """Tensors that unpack and hold only finite values: NaN or Inf would poison an average."""
    for name, a in unpack_tensors(items).items():
        if not np.isfinite(a).all():
            raise ProtocolError("non_finite", f"model.{name}: non-finite values")


def _product(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:  # Python ints: a hostile shape cannot overflow into a match
        n *= d
    return n


# --- messages ----------------------------------------------------------------------------


def encode(kind: str, **fields: Any) -> bytes:
    assert kind in FIELDS, kind
    frame: bytes = msgpack.packb({"v": VERSION, "type": kind, **fields}, use_bin_type=True)  # msgpack is untyped
    return frame


def decode(frame: bytes, max_bytes: int) -> dict[str, Any]:
    if len(frame) > max_bytes:
        raise ProtocolError("oversized", f"message of {len(frame)} bytes exceeds the limit of {max_bytes}")
    try:
        msg = msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=1 << 20,
            max_array_len=1 << 20,
            max_map_len=1 << 16,
            max_ext_len=0,
        )
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise ProtocolError("undecodable", f"undecodable message: {type(e).__name__}: {e}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("not_a_map", "message is not a map")
    version = msg.get("v")
    if not (_is_int(version) and version == VERSION):
        raise ProtocolError("version", f"protocol version {_short(version)}, expected {VERSION}")
    kind = msg.get("type")
    if not (isinstance(kind, str) and kind in FIELDS):
        raise ProtocolError("unknown_type", f"unknown message type {_short(kind)}")
    try:
        _check_fields(kind, msg)
    except ProtocolError:
        raise
    except Exception as e:  # a check that a hostile value broke: still the peer's fault, never ours
        raise ProtocolError("invalid", f"{kind} message failed its checks: {type(e).__name__}: {_short(e)}") from None
    return msg


def _check_fields(kind: str, msg: dict[str, Any]) -> None:
    table = FIELDS[kind]
    missing = [k for k in table if k not in msg]
    if missing:
        raise ProtocolError("missing_field", f"{kind} message lacks {missing}")
    extra = [k for k in msg if k not in table and k not in ("v", "type")]
    if extra:
        raise ProtocolError("unknown_field", f"{kind} message has unknown fields {_short(extra)}")
    for name, field in table.items():
        if not field.valid(msg[name]):
            raise ProtocolError("field_type", f"{kind}.{name} = {_short(msg[name])}: expected {field.expected}")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 60, 60, 40


def _short(v: Any, limit: int = 80) -> str:
    """repr for error messages: hostile values can be megabytes long, or nested too deep for repr."""
    text = _REPR.repr(v)
    return text if len(text) <= limit else text[:limit] + "..."

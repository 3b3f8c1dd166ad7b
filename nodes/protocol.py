"""Wire format: msgpack maps with a protocol version; tensors as raw little-endian buffers.

Nothing that crosses a socket is ever unpickled. `decode` enforces size limits and the
message's shape, and raises `ProtocolError` for anything malformed.
"""
from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

VERSION = 1
DTYPES = ("float32", "float64", "float16", "int64", "int32", "uint8")

# type -> required keys. The schema is deliberately small: a message either matches or is rejected.
SCHEMA: dict[str, tuple[str, ...]] = {
    "hello": ("worker", "pid"),
    "setup": ("scenario",),
    "ready": ("worker",),
    "task": ("round", "client", "params", "model"),
    "update": ("round", "client", "model", "metrics"),
    "error": ("round", "client", "message"),
    "shutdown": (),
}


class ProtocolError(ValueError):
    """A message that does not decode or does not match SCHEMA."""


def pack_tensors(state: dict[str, np.ndarray]) -> list:
    """Ordered [name, dtype, shape, bytes] quadruples (order = the model's parameter order)."""
    out = []
    for name, a in state.items():
        a = np.ascontiguousarray(a)
        out.append([name, a.dtype.name, list(a.shape), a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()])
    return out


def unpack_tensors(items: Any) -> dict[str, np.ndarray]:
    if not isinstance(items, list):
        raise ProtocolError("model: expected a list of tensors")
    state: dict[str, np.ndarray] = {}
    for item in items:
        if not (isinstance(item, list) and len(item) == 4):
            raise ProtocolError("model: expected [name, dtype, shape, data] per tensor")
        name, dtype, shape, data = item
        if not isinstance(name, str) or name in state:
            raise ProtocolError(f"model: bad or duplicate tensor name {name!r}")
        if dtype not in DTYPES:
            raise ProtocolError(f"model.{name}: dtype {dtype!r} not in {DTYPES}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise ProtocolError(f"model.{name}: bad shape {shape!r}")
        if not isinstance(data, bytes):
            raise ProtocolError(f"model.{name}: data must be raw bytes")
        dt = np.dtype(dtype).newbyteorder("<")
        if int(np.prod(shape, dtype=np.int64)) * dt.itemsize != len(data):
            raise ProtocolError(f"model.{name}: {len(data)} bytes do not match shape {shape} of {dtype}")
        state[name] = np.frombuffer(data, dtype=dt).reshape(shape).astype(dtype, copy=False)
    return state


def encode(kind: str, **fields: Any) -> bytes:
    assert kind in SCHEMA, kind
    return msgpack.packb({"v": VERSION, "type": kind, **fields}, use_bin_type=True)


def decode(frame: bytes, max_bytes: int) -> dict:
    if len(frame) > max_bytes:
        raise ProtocolError(f"message of {len(frame)} bytes exceeds the limit of {max_bytes}")
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=True,
                              max_bin_len=max_bytes, max_str_len=1 << 20, max_array_len=1 << 20,
                              max_map_len=1 << 16, max_ext_len=0)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"undecodable message: {type(e).__name__}: {e}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("message is not a map")
    if msg.get("v") != VERSION:
        raise ProtocolError(f"protocol version {msg.get('v')!r}, expected {VERSION}")
    kind = msg.get("type")
    if kind not in SCHEMA:
        raise ProtocolError(f"unknown message type {kind!r}")
    missing = [k for k in SCHEMA[kind] if k not in msg]
    if missing:
        raise ProtocolError(f"{kind} message lacks {missing}")
    return msg

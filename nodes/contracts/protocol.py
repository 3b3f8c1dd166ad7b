"""Wire format: a message is ZeroMQ frames, a msgpack header map with a protocol version and
then one raw little-endian frame per tensor, so that tensors cross the socket uncopied.

Nothing that crosses a socket is ever unpickled. `decode` enforces the size limit (all frames
together), the envelope (map, version, type), a per-type field table (every field present, of its
type, nothing else) and the frames: exactly one per tensor the header names, each as long as its
header says, so that a message that decodes can be used without further checks. Its tensors are
read-only numpy arrays over the received frames. Anything else raises `ProtocolError`, whose
`reason` is one of REASONS (the server counts rejections by reason): whatever the frames, `decode`
raises nothing else. A `compressed` update (nodes.contracts.codecs) is decoded to its dense `update` here,
so a malformed one is rejected like any other bad message.

A worker (or the evaluator) answers a server message it cannot take with `rejected` at once, never in
silence: why, and what `peek` could read of the message (its type, round, client, request), so that
the server can tell which of its own messages it was and check that message itself (`own_problem`).
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgpack
import numpy as np

from nodes.contracts.codecs import CODECS, CompressionError, decompress, known
from nodes.contracts.schema import CompressionConfig

VERSION = 3  # 1 carried the tensors as bin fields inside the one msgpack map; 2 had no model in ready
DTYPES = ("float32", "float64", "float16", "int64", "int32", "uint32", "uint8")
DTYPE_NAMES = {np.dtype(name).newbyteorder("<"): name for name in DTYPES}  # dtype.name is a slow Python property
MAX_NAME = 255  # a ZeroMQ identity is at most 255 bytes
UPDATE_METRICS = ("steps", "train_loss", "update_norm")  # what the server reads from every update
MAX_RANK = 8  # numpy refuses more than 64 dimensions; no model here has more than 4
MAX_SPAN = 2**40  # product of a shape's non-zero dimensions (numpy refuses an empty tensor that "spans" 2^63)
MAX_TENSORS = 4096  # per message: a frame each (the models here have at most a few dozen)
MAX_FRAMES = 1 + MAX_TENSORS  # the header and the tensors: a receiver drops the frames after these

# Why decode rejects a message: the keys of the server's per-reason counters, and a `rejected` reply's reasons.
REASONS = (
    "oversized",
    "frames",
    "undecodable",
    "not_a_map",
    "version",
    "unknown_type",
    "missing_field",
    "unknown_field",
    "field_type",
    "bad_tensor",
    "non_finite",
    "bad_compressed",
    "invalid",
)

Buffer = bytes | memoryview  # a frame: what a socket sends without a copy, or a received frame's view


class ProtocolError(ValueError):
    """A message that does not decode or does not match the field table."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class Message:
    """An encoded message, ready for send_multipart. Its len() is its size on the wire, the sum of
    its frames' bytes: what the link model charges for it."""

    frames: tuple[Buffer, ...]

    def __len__(self) -> int:
        return sum(memoryview(f).nbytes for f in self.frames)


# --- field types -------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    expected: str  # for the error message
    valid: Callable[[Any], bool]
    tensors: bool = False  # {name: array} in code; [name, dtype, shape] headers plus a frame each on the wire


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


def _is_codec(v: Any) -> bool:
    """A compressed update's codec: {kind, bits, fraction} of a compression section that compresses, with
    a codec this process knows (codecs.known: a name on the wire never imports a module)."""
    return (
        isinstance(v, dict)
        and set(v) == {"kind", "bits", "fraction"}
        and isinstance(v["kind"], str)
        and known(v["kind"])
        and _is_int(v["bits"])
        and 2 <= v["bits"] <= 16
        and type(v["fraction"]) is float
        and 0 < v["fraction"] <= 1
    )


def _is_shapes(v: Any) -> bool:
    """[name, shape] per tensor of the dense update: as tensor headers, of float32."""
    _check_headers([[name, "float32", shape] for name, shape in v] if isinstance(v, list) else v)
    return True


def _is_headers(v: Any) -> bool:
    _check_headers(v)  # raises its own, more precise ProtocolError
    return True


COUNT = Field("an integer >= 0", lambda v: _is_int(v) and v >= 0)
MAYBE_COUNT = Field("an integer >= 0 or nil", lambda v: v is None or COUNT.valid(v))
NAME = Field(f"a string of 1 to {MAX_NAME} characters", lambda v: isinstance(v, str) and 0 < len(v) <= MAX_NAME)
TEXT = Field("a string", lambda v: isinstance(v, str))
SECONDS = Field("a number > 0", lambda v: _is_number(v) and v > 0)
NUMBER = Field("a number", _is_number)
MAP = Field("a map with string keys", lambda v: _is_str_map(v, lambda _: True))
PARAMS = Field(
    "a map of string to number, string or bool", lambda v: _is_str_map(v, lambda x: type(x) in (int, float, str, bool))
)
MAX_BUNDLE = 10**6  # clients in one bundle (train.bundle's bound)
CLIENTS = Field(
    f"a list of 1 to {MAX_BUNDLE} integers >= 0",
    lambda v: isinstance(v, list) and 0 < len(v) <= MAX_BUNDLE and all(COUNT.valid(c) for c in v),
)
PARAMS_LIST = Field(
    f"a list of {PARAMS.expected} maps", lambda v: isinstance(v, list) and all(PARAMS.valid(p) for p in v)
)
METRICS = Field(f"a map of string to number with {', '.join(UPDATE_METRICS)} (steps an integer >= 0)", _is_metrics)
TENSORS = Field(f"a list of at most {MAX_TENSORS} [name, dtype, shape] tensor headers", _is_headers, tensors=True)
CODEC = Field(
    f"a map of kind (a codec this process has loaded: {CODECS.describe()}), bits (2 to 16) and fraction (in (0, 1])",
    _is_codec,
)
SHAPES = Field(f"a list of at most {MAX_TENSORS} [name, shape] pairs", _is_shapes)


class MessageType(StrEnum):
    """A message's `type`, which says what it is and which fields it must have (FIELDS)."""

    HELLO = "hello"
    SETUP = "setup"
    READY = "ready"
    HEARTBEAT = "heartbeat"
    TASK = "task"
    UPDATE = "update"
    BUNDLE = "bundle"
    TASK_RESIDUAL = "task_residual"
    COMPRESSED = "compressed"
    ERROR = "error"
    REJECTED = "rejected"
    EVALUATOR_SETUP = "evaluator_setup"
    EVALUATE = "evaluate"
    EVALUATION = "evaluation"
    SHUTDOWN = "shutdown"


# type -> its fields, all required. Deliberately small: a message either matches or is rejected.
FIELDS: dict[str, dict[str, Field]] = {
    MessageType.HELLO: {"worker": NAME, "pid": COUNT},
    MessageType.SETUP: {"scenario": MAP, "wire_log": TEXT, "heartbeat_s": SECONDS},
    MessageType.READY: {"worker": NAME, "model": TENSORS},  # the initial model as this worker built it
    MessageType.HEARTBEAT: {},
    MessageType.TASK: {"round": COUNT, "client": COUNT, "params": PARAMS, "model": TENSORS},
    MessageType.UPDATE: {"round": COUNT, "client": COUNT, "model": TENSORS, "metrics": METRICS},
    # train.bundle > 1 (nodes/transport/dispatch.py): the tasks of several clients, the global model once; one
    # reply (update, compressed or error) per client, in the bundle's order
    MessageType.BUNDLE: {"round": COUNT, "clients": CLIENTS, "params": PARAMS_LIST, "model": TENSORS},
    # compression (nodes.contracts.codecs): the task with the client's error-feedback residual, which the
    # server keeps ({} = zero), and the update's parts (the dense update's shapes) with its next residual
    MessageType.TASK_RESIDUAL: {
        "round": COUNT,
        "client": COUNT,
        "params": PARAMS,
        "model": TENSORS,
        "residual": TENSORS,
    },
    MessageType.COMPRESSED: {
        "round": COUNT,
        "client": COUNT,
        "codec": CODEC,
        "shapes": SHAPES,
        "parts": TENSORS,
        "residual": TENSORS,
        "metrics": METRICS,
    },
    MessageType.ERROR: {"round": COUNT, "client": COUNT, "message": TEXT},
    # a worker's or the evaluator's answer to a server message it could not take: why (`reason`, a REASONS
    # key or a worker's own, and `detail`) and what `peek` read of the message: its type (of_type, "" if
    # unread), round, client (a bundle's first) and request (nil where unread)
    MessageType.REJECTED: {
        "reason": TEXT,
        "detail": TEXT,
        "of_type": TEXT,
        "round": MAYBE_COUNT,
        "client": MAYBE_COUNT,
        "request": MAYBE_COUNT,
    },
    # the server and its evaluator process (nodes/transport/evaluator.py): one request at a time, numbered
    # its set-up: a worker's, and the test set where the server has drawn it ({} = the evaluator builds it)
    MessageType.EVALUATOR_SETUP: {"scenario": MAP, "heartbeat_s": SECONDS, "test": TENSORS},
    MessageType.EVALUATE: {"request": COUNT, "model": TENSORS},
    MessageType.EVALUATION: {"request": COUNT, "loss": NUMBER, "accuracy": NUMBER, "error": TEXT},  # error: "" if none
    MessageType.SHUTDOWN: {},
}


def _tensor_fields(kind: str) -> list[str]:
    return [name for name, field in FIELDS[kind].items() if field.tensors]


# --- tensors -----------------------------------------------------------------------------


def _pack(state: Mapping[str, np.ndarray], frames: list[Buffer]) -> list[list[Any]]:
    """[name, dtype, shape] headers in the model's parameter order; each tensor's bytes appended
    to `frames` as a view of the array (a copy only for an array that is not C-contiguous
    little-endian)."""
    headers: list[list[Any]] = []
    for name, a in state.items():
        little = DTYPE_NAMES.get(a.dtype)  # the dtype's name if it is a little-endian one of DTYPES
        data = a if little and a.flags.c_contiguous else np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        headers.append([name, little or a.dtype.name, list(a.shape)])
        frames.append(data.reshape(-1).view(np.uint8).data)
    return headers


def _check_headers(items: Any) -> None:
    """Tensor headers numpy can build, checked in Python ints, so that numpy never sees a hostile shape."""
    if not (isinstance(items, list) and len(items) <= MAX_TENSORS):
        raise ProtocolError("bad_tensor", f"model: expected a list of at most {MAX_TENSORS} tensors")
    names: set[str] = set()
    for item in items:
        if not (isinstance(item, list) and len(item) == 3):
            raise ProtocolError("bad_tensor", "model: expected [name, dtype, shape] per tensor")
        name, dtype, shape = item
        if not isinstance(name, str) or name in names:
            raise ProtocolError("bad_tensor", f"model: bad or duplicate tensor name {_short(name)}")
        names.add(name)
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ProtocolError("bad_tensor", f"model.{name}: dtype {_short(dtype)} not in {DTYPES}")
        # the rank first: the element count of a long shape of huge dimensions is a quadratic product
        if not (isinstance(shape, list) and len(shape) <= MAX_RANK and all(_is_int(d) and d >= 0 for d in shape)):
            raise ProtocolError(
                "bad_tensor", f"model.{name}: bad shape {_short(shape)} (expected at most {MAX_RANK} integers >= 0)"
            )
        if _product(d for d in shape if d) > MAX_SPAN:
            raise ProtocolError("bad_tensor", f"model.{name}: shape {shape} has dimensions over {MAX_SPAN}")


def _unpack(headers: list[list[Any]], frames: Sequence[memoryview]) -> dict[str, np.ndarray]:
    """Checked headers and as many frames -> read-only arrays over the frames, all finite:
    NaN or Inf would poison an average."""
    state: dict[str, np.ndarray] = {}
    for (name, dtype, shape), data in zip(headers, frames, strict=True):
        dt = np.dtype(dtype).newbyteorder("<")
        if _product(shape) * dt.itemsize != data.nbytes:
            raise ProtocolError(
                "bad_tensor", f"model.{name}: a frame of {data.nbytes} bytes does not match shape {shape} of {dtype}"
            )
        a = np.frombuffer(data, dtype=dt).reshape(shape).astype(dtype, copy=False)
        if not np.isfinite(a).all():
            raise ProtocolError("non_finite", f"model.{name}: non-finite values")
        state[name] = a
    return state


def _product(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:  # Python ints: a hostile shape cannot overflow into a match
        n *= d
    return n


# --- messages ----------------------------------------------------------------------------


def encode(kind: str, **fields: Any) -> Message:
    """A `kind` message; its tensor fields (model) are given as {name: array} in the model's order.
    The frames are views of the arrays: an array written before the message is sent changes it."""
    assert kind in FIELDS, kind
    header = dict(fields)
    frames: list[Buffer] = []
    for name in _tensor_fields(kind):  # in the table's order, which decode follows
        header[name] = _pack(fields[name], frames)
    head: bytes = msgpack.packb({"v": VERSION, "type": str(kind), **header}, use_bin_type=True)  # msgpack is untyped
    return Message((head, *frames))


def decode(frames: Sequence[Buffer], max_bytes: int) -> dict[str, Any]:
    """A message's frames (header first) -> its fields, tensor fields as {name: read-only array}."""
    # in bytes whatever the buffer's item type; read-only: a received frame's memory is ZeroMQ's
    views = [memoryview(f).cast("B").toreadonly() for f in frames]
    size = sum(v.nbytes for v in views)
    if size > max_bytes:
        raise ProtocolError("oversized", f"message of {size} bytes exceeds the limit of {max_bytes}")
    if not 0 < len(views) <= MAX_FRAMES:
        raise ProtocolError("frames", f"{len(views)} frames, expected 1 to {MAX_FRAMES}")
    try:
        msg = _header(views[0], max_bytes)
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
        _attach_tensors(kind, msg, views[1:])
        if kind == MessageType.COMPRESSED:
            msg["update"] = _decompressed(msg, max_bytes)
    except ProtocolError:
        raise
    except Exception as e:  # a check that a hostile value broke: still the peer's fault, never ours
        raise ProtocolError("invalid", f"{kind} message failed its checks: {type(e).__name__}: {_short(e)}") from None
    return msg


def _header(frame: memoryview, max_bytes: int) -> Any:
    """A message's msgpack header, each of its containers bounded; raises whatever msgpack raises."""
    return msgpack.unpackb(
        frame,
        raw=False,
        strict_map_key=True,
        max_bin_len=max_bytes,
        max_str_len=1 << 20,
        max_array_len=1 << 20,
        max_map_len=1 << 16,
        max_ext_len=0,
    )


def peek(frames: Sequence[Buffer], max_bytes: int) -> dict[str, Any]:
    """What can be read of a message `decode` rejected: a `rejected` reply's of_type, round, client and request,
    each where the header holds it with its field's type ("" or None where not). Raises nothing, whatever the
    frames."""
    seen: dict[str, Any] = {"of_type": "", "round": None, "client": None, "request": None}
    try:
        head = memoryview(frames[0]).cast("B")
        if head.nbytes > max_bytes:
            return seen
        msg = _header(head, max_bytes)
    except Exception:  # no frame, or a header msgpack cannot read: nothing is known of it
        return seen
    if not isinstance(msg, dict):
        return seen
    if NAME.valid(msg.get("type")):
        seen["of_type"] = msg["type"]
    clients = msg.get("clients")
    if "client" not in msg and isinstance(clients, list) and clients:  # a bundle: its first client's
        msg["client"] = clients[0]
    for key in ("round", "client", "request"):
        if COUNT.valid(msg.get(key)):
            seen[key] = msg[key]
    return seen


def own_problem(message: Message, max_bytes: int) -> str:
    """'' if `message`, one this process encoded, decodes under `max_bytes`, as its receiver checks it;
    else why not (decode's words): how a sender finds out whether a rejection of it was its own fault."""
    try:
        decode(message.frames, max_bytes)
    except ProtocolError as e:
        return str(e)
    return ""


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
    if kind == MessageType.BUNDLE and len(msg["params"]) != len(msg["clients"]):
        raise ProtocolError("field_type", f"bundle.params: {len(msg['params'])} maps, expected one per client")


def _attach_tensors(kind: str, msg: dict[str, Any], frames: Sequence[memoryview]) -> None:
    """The frames after the header, one per tensor the (checked) header names, in its order."""
    fields = _tensor_fields(kind)
    named = sum(len(msg[name]) for name in fields)
    if named != len(frames):
        raise ProtocolError("frames", f"{kind} message names {named} tensors but has {len(frames)} tensor frames")
    for name in fields:
        n = len(msg[name])
        msg[name], frames = _unpack(msg[name], frames[:n]), frames[n:]


def _decompressed(msg: dict[str, Any], max_bytes: int) -> dict[str, np.ndarray]:
    """A compressed message's dense update (float32), which its parts must encode exactly, and no
    larger than the uncompressed update could be (`max_bytes`)."""
    dense = 4 * sum(_product(shape) for _, shape in msg["shapes"])
    if dense > max_bytes:
        raise ProtocolError("oversized", f"compressed update of {dense} bytes decoded exceeds the limit of {max_bytes}")
    codec = CompressionConfig(kind=msg["codec"]["kind"], bits=msg["codec"]["bits"], fraction=msg["codec"]["fraction"])
    try:
        return decompress(codec, {name: tuple(shape) for name, shape in msg["shapes"]}, msg["parts"])
    except CompressionError as e:
        raise ProtocolError("bad_compressed", f"compressed update: {_short(str(e), 200)}") from None


def kind_of(message: Message) -> str:
    """The type of a message this process encoded (its own header: trusted, not checked)."""
    kind: str = msgpack.unpackb(message.frames[0], raw=False)["type"]
    return kind


def bundle(tasks: Sequence[Message]) -> Message:
    """One `bundle` message of this process's own `task` messages of one round, which share the model
    (task_frame's views of one global model): its tensor frames once, the clients and params in order."""
    heads = [msgpack.unpackb(t.frames[0], raw=False) for t in tasks]
    assert all(h["type"] == MessageType.TASK and h["round"] == heads[0]["round"] for h in heads), "tasks of one round"
    header = {
        "v": VERSION,
        "type": MessageType.BUNDLE,
        "round": heads[0]["round"],
        "clients": [h["client"] for h in heads],
        "params": [h["params"] for h in heads],
        "model": heads[0]["model"],
    }
    head: bytes = msgpack.packb(header, use_bin_type=True)
    return Message((head, *tasks[0].frames[1:]))


def codec_fields(codec: CompressionConfig) -> dict[str, Any]:
    """A compression section's codec field of a `compressed` message."""
    return {"kind": str(codec.kind), "bits": codec.bits, "fraction": float(codec.fraction)}


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 60, 60, 40


def _short(v: Any, limit: int = 80) -> str:
    """repr for error messages: hostile values can be megabytes long, or nested too deep for repr."""
    text = _REPR.repr(v)
    return text if len(text) <= limit else text[:limit] + "..."

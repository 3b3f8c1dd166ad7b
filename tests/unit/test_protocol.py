import math

import msgpack
import numpy as np
import pytest

from nodes import protocol
from nodes.protocol import ProtocolError, decode, encode, pack_tensors, unpack_tensors

LIMIT = 1 << 20
V = protocol.VERSION
MODEL = pack_tensors({"w": np.ones((2, 3), np.float32)})
METRICS = {"steps": 2, "train_loss": 0.5, "update_norm": 1.0}
VALID = {
    "hello": {"worker": "w", "pid": 7},
    "setup": {"scenario": {"seed": 0}, "wire_log": "", "heartbeat_s": 2.0},
    "ready": {"worker": "w"},
    "heartbeat": {},
    "task": {
        "round": 0,
        "client": 1,
        "params": {"steps": 2, "lr": 0.1, "output_noise": "none", "report": False},
        "model": MODEL,
    },
    "update": {"round": 0, "client": 1, "model": MODEL, "metrics": METRICS},
    "error": {"round": 0, "client": 1, "message": "boom"},
    "shutdown": {},
}


def raw(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def test_every_message_type_round_trips():
    assert set(VALID) == set(protocol.FIELDS)
    for kind, fields in VALID.items():
        msg = decode(encode(kind, **fields), LIMIT)
        assert msg == {"v": V, "type": kind, **fields}


def test_tensors_round_trip_bit_exact_and_ordered():
    state = {"w": np.arange(12, dtype=np.float32).reshape(3, 4) / 7, "b": np.array([1, -2], dtype=np.int64)}
    msg = decode(encode("task", round=3, client=1, params={}, model=pack_tensors(state)), LIMIT)
    back = unpack_tensors(msg["model"])
    assert list(back) == ["w", "b"]
    for k in state:
        assert back[k].dtype == state[k].dtype and np.array_equal(back[k], state[k])
    assert msg["v"] == protocol.VERSION and msg["round"] == 3


def test_message_size_is_the_encoded_length_and_limit_is_enforced():
    frame = encode("task", round=0, client=0, params={}, model=pack_tensors({"w": np.zeros(1000, np.float32)}))
    assert len(frame) > 4000
    with pytest.raises(ProtocolError, match="exceeds the limit") as e:
        decode(frame, 4000)
    assert e.value.reason == "oversized"


@pytest.mark.parametrize(
    "frame, reason, why",
    [
        (b"\xc1\xff garbage", "undecodable", "undecodable"),
        (b"", "undecodable", "undecodable"),
        (encode("hello", worker="w", pid=1)[:-3], "undecodable", "undecodable"),
        (b"\x91" * 5000 + b"\x01", "undecodable", "undecodable"),  # nested deeper than msgpack's stack
        (raw({1: 2}), "undecodable", "undecodable"),  # non-string map keys
        (raw([1, 2, 3]), "not_a_map", "not a map"),
        (raw(None), "not_a_map", "not a map"),
        (raw({"v": 99, "type": "hello", "worker": "w", "pid": 1}), "version", "protocol version"),
        (raw({"v": True, "type": "hello", "worker": "w", "pid": 1}), "version", "protocol version"),
        (raw({"v": 1.0, "type": "hello", "worker": "w", "pid": 1}), "version", "protocol version"),
        (raw({"type": "hello", "worker": "w", "pid": 1}), "version", "protocol version"),
        (raw({"v": V, "type": "launch_missiles"}), "unknown_type", "unknown message type"),
        (raw({"v": V, "type": ["update"]}), "unknown_type", "unknown message type"),  # unhashable
        (raw({"v": V}), "unknown_type", "unknown message type"),
        (raw({"v": V, "type": "update", "round": 1}), "missing_field", "lacks"),
        (raw({"v": V, "type": "heartbeat", "admin": True}), "unknown_field", "unknown fields"),
    ],
)
def test_malformed_messages_are_rejected_with_their_reason(frame, reason, why):
    with pytest.raises(ProtocolError, match=why) as e:
        decode(frame, LIMIT)
    assert e.value.reason == reason and reason in protocol.REASONS


@pytest.mark.parametrize(
    "kind, field, value",
    [
        ("update", "round", "x"),
        ("update", "round", -1),
        ("update", "round", True),
        ("update", "round", 1.0),
        ("update", "client", [1]),
        ("update", "client", None),
        ("update", "metrics", [1, 2]),
        ("update", "metrics", "fine"),
        ("update", "metrics", {"steps": 2, "train_loss": 0.5}),  # update_norm missing
        ("update", "metrics", {**METRICS, "steps": 2.0}),
        ("update", "metrics", {**METRICS, "train_loss": "low"}),
        ("update", "metrics", {**METRICS, "extra": [1]}),
        ("update", "metrics", {**METRICS, "steps": -1}),
        ("task", "params", [1]),
        ("task", "params", {"lr": [0.1]}),
        ("task", "params", {"lr": None}),
        ("hello", "worker", 5),
        ("hello", "worker", ""),
        ("hello", "worker", "x" * 256),
        ("hello", "pid", "1"),
        ("error", "message", 5),
        ("setup", "scenario", "x"),
        ("setup", "heartbeat_s", 0),
        ("setup", "wire_log", None),
    ],
)
def test_fields_of_the_wrong_type_are_rejected(kind, field, value):
    frame = raw({"v": V, "type": kind, **{**VALID[kind], field: value}})
    with pytest.raises(ProtocolError, match=f"{kind}.{field} = ") as e:
        decode(frame, LIMIT)
    assert e.value.reason == "field_type"


@pytest.mark.parametrize(
    "items, why",
    [
        ("not a list", "expected a list"),
        ([["w", "float32", [2], b"\x00" * 4]], "do not match shape"),
        ([["w", "float32", [2**62, 2**62], b"\x00" * 4]], "do not match shape"),
        ([["w", "object", [1], b"\x00" * 8]], "dtype"),
        ([["w", ["float32"], [1], b"\x00" * 4]], "dtype"),
        ([["w", "float32", [-1], b""]], "bad shape"),
        ([["w", "float32", [1.0], b"\x00" * 4]], "bad shape"),
        ([["w", "float32", [1], "text"]], "raw bytes"),
        ([["w", "float32", [1]]], "per tensor"),
        ([["w", "float32", [1], b"\x00" * 4], ["w", "float32", [1], b"\x00" * 4]], "duplicate"),
    ],
)
def test_bad_tensors_are_rejected(items, why):
    with pytest.raises(ProtocolError, match=why) as e:
        unpack_tensors(items)
    assert e.value.reason == "bad_tensor"
    with pytest.raises(ProtocolError, match=why):
        decode(raw({"v": V, "type": "update", **{**VALID["update"], "model": items}}), LIMIT)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_tensors_are_rejected(dtype, bad):
    a = np.zeros(5, dtype)
    a[3] = bad
    frame = encode("update", round=0, client=0, model=pack_tensors({"w": a}), metrics=METRICS)
    with pytest.raises(ProtocolError, match="non-finite") as e:
        decode(frame, LIMIT)
    assert e.value.reason == "non_finite"


def test_a_nan_training_loss_is_a_valid_metric():
    msg = decode(encode("update", round=0, client=0, model=MODEL, metrics={**METRICS, "train_loss": math.nan}), LIMIT)
    assert math.isnan(msg["metrics"]["train_loss"])


def test_error_messages_stay_short_whatever_the_value():
    with pytest.raises(ProtocolError) as e:
        decode(raw({"v": V, "type": "hello", "worker": "w", "pid": "9" * 100_000}), LIMIT)
    assert len(str(e.value)) < 300

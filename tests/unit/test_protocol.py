import math

import msgpack
import numpy as np
import pytest

from nodes.contracts import protocol
from nodes.contracts.protocol import MAX_FRAMES, MAX_TENSORS, Message, ProtocolError, decode, encode

LIMIT = 1 << 20
V = protocol.VERSION
MODEL = {"w": np.ones((2, 3), np.float32)}
METRICS = {"steps": 2, "train_loss": 0.5, "update_norm": 1.0}
VALID = {
    "hello": {"worker": "w", "pid": 7},
    "setup": {"scenario": {"seed": 0}, "wire_log": "", "heartbeat_s": 2.0},
    "ready": {"worker": "w", "model": MODEL},
    "heartbeat": {},
    "task": {
        "round": 0,
        "client": 1,
        "params": {"steps": 2, "lr": 0.1, "output_noise": "none", "report": False},
        "model": MODEL,
    },
    "update": {"round": 0, "client": 1, "model": MODEL, "metrics": METRICS},
    "bundle": {"round": 0, "clients": [1, 4], "params": [{"steps": 2}, {"steps": 3}], "model": MODEL},
    "task_residual": {"round": 0, "client": 1, "params": {"steps": 2}, "model": MODEL, "residual": MODEL},
    "compressed": {  # MODEL as signs and a scale (nodes.contracts.codecs)
        "round": 0,
        "client": 1,
        "codec": {"kind": "sign", "bits": 8, "fraction": 0.01},
        "shapes": [["w", [2, 3]]],
        "parts": {"w:scale": np.ones(1, np.float32), "w:bits": np.zeros(1, np.uint8)},
        "residual": {},
        "metrics": METRICS,
    },
    "error": {"round": 0, "client": 1, "message": "boom"},
    "rejected": {
        "reason": "non_finite",
        "detail": "model.w: non-finite values",
        "of_type": "task",
        "round": 0,
        "client": 1,
        "request": None,
    },
    "evaluator_setup": {
        "scenario": {"seed": 0},
        "heartbeat_s": 60.0,
        "test": {"x": np.ones((2, 3), np.float32), "y": np.zeros(2, np.int64)},
    },
    "evaluate": {"request": 3, "model": MODEL},
    "evaluation": {"request": 3, "loss": 0.25, "accuracy": 0.5, "error": ""},
    "shutdown": {},
}
W_HEADER = [["w", "float32", [2, 3]]]  # MODEL's header
W_DATA = np.ones(6, np.float32).tobytes()


def raw(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def update(model=W_HEADER, *data) -> list[bytes]:
    """An update message's frames: the header naming `model`, then `data` (W_DATA by default)."""
    return [raw({"v": V, "type": "update", **{**VALID["update"], "model": model}}), *(data or [W_DATA])]


def test_every_message_type_round_trips():
    assert set(VALID) == set(protocol.FIELDS)
    for kind, fields in VALID.items():
        message = encode(kind, **fields)
        msg = decode(message.frames, LIMIT)
        tensors = [k for k in fields if protocol.FIELDS[kind][k].tensors]
        assert len(message.frames) == 1 + sum(len(fields[k]) for k in tensors)
        for k in tensors:
            assert msg.pop(k).keys() == fields[k].keys()
        if kind == "compressed":
            np.testing.assert_array_equal(msg.pop("update")["w"], MODEL["w"])
        assert msg == {"v": V, "type": kind, **{k: v for k, v in fields.items() if k not in tensors}}


def test_tensors_round_trip_bit_exact_and_ordered_one_frame_each():
    state = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
        "b": np.array([1, -2], dtype=np.int64),
        "step": np.array(5, dtype=np.int32),  # rank 0 stays rank 0
        "empty": np.zeros((0, 3), np.float16),
    }
    message = encode("task", round=3, client=1, params={}, model=state)
    assert [memoryview(f).nbytes for f in message.frames[1:]] == [a.nbytes for a in state.values()]
    back = decode(message.frames, LIMIT)["model"]
    assert list(back) == list(state)
    for k in state:
        assert back[k].dtype == state[k].dtype and back[k].shape == state[k].shape
        assert np.array_equal(back[k], state[k])


def test_frames_are_views_of_the_arrays_and_decoded_tensors_read_only_views_of_the_frames():
    w = np.arange(6, dtype=np.float32)
    message = encode("update", round=0, client=0, model={"w": w}, metrics=METRICS)
    assert np.shares_memory(np.frombuffer(message.frames[1], np.uint8), w)  # sent without a copy
    received = bytearray(memoryview(message.frames[1]))  # a writable buffer, as ZeroMQ's frames are
    back = decode([message.frames[0], received], LIMIT)["model"]["w"]
    assert np.shares_memory(back, np.frombuffer(received, np.uint8))  # received without a copy
    with pytest.raises(ValueError, match="read-only"):
        back[0] = 1.0  # nobody writes into a frame's memory


@pytest.mark.parametrize("dtype", [">f4", "<f4", ">i8"])
def test_big_endian_and_strided_arrays_travel_as_little_endian_c_order(dtype):
    a = np.arange(6, dtype=dtype).reshape(2, 3).T  # not contiguous, and of either byte order
    message = encode("update", round=0, client=0, model={"w": a}, metrics=METRICS)
    assert bytes(message.frames[1]) == np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes()
    back = decode(message.frames, LIMIT)["model"]["w"]
    assert back.dtype == a.dtype.newbyteorder("=") and np.array_equal(back, a)


@pytest.mark.parametrize("order", ["<", ">", "="])
def test_each_tensor_header_names_its_dtype_as_numpy_does(order):
    state = {name: np.zeros(2, np.dtype(name).newbyteorder(order)) for name in protocol.DTYPES}
    head = msgpack.unpackb(encode("task", round=0, client=0, params={}, model=state).frames[0])
    assert [dtype for _, dtype, _ in head["model"]] == [a.dtype.name for a in state.values()] == list(protocol.DTYPES)


def test_message_size_is_every_frames_bytes_and_the_limit_holds_for_them_together():
    message = encode("task", round=0, client=0, params={}, model={"a": np.zeros(600, np.float32), "b": np.zeros(600)})
    assert len(message) == sum(len(bytes(f)) for f in message.frames) > 600 * 12
    assert max(len(bytes(f)) for f in message.frames) < 4900  # each frame is under the limit ...
    with pytest.raises(ProtocolError, match="exceeds the limit") as e:
        decode(message.frames, 4900)  # ... but not all of them together
    assert e.value.reason == "oversized"
    assert decode(message.frames, len(message))["round"] == 0


@pytest.mark.parametrize(
    "frame, reason, why",
    [
        (b"\xc1\xff garbage", "undecodable", "undecodable"),
        (b"", "undecodable", "undecodable"),
        (encode("hello", worker="w", pid=1).frames[0][:-3], "undecodable", "undecodable"),
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
        decode([frame], LIMIT)
    assert e.value.reason == reason and reason in protocol.REASONS


def test_a_version_1_update_with_its_tensors_inside_the_map_is_refused_by_version():
    v1 = raw({**VALID["update"], "v": 1, "type": "update", "model": [["w", "float32", [2, 3], W_DATA]]})
    with pytest.raises(ProtocolError, match="protocol version 1, expected 3") as e:
        decode([v1], LIMIT)
    assert e.value.reason == "version"


def test_a_version_2_ready_without_the_initial_model_is_refused_by_version():
    with pytest.raises(ProtocolError, match="protocol version 2, expected 3") as e:
        decode([raw({"v": 2, "type": "ready", "worker": "w"})], LIMIT)
    assert e.value.reason == "version"


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
        ("rejected", "round", -1),
        ("rejected", "client", "1"),
        ("rejected", "request", True),
        ("rejected", "of_type", None),
        ("rejected", "detail", 5),
    ],
)
def test_fields_of_the_wrong_type_are_rejected(kind, field, value):
    fields = {**VALID[kind], field: value}
    frames = [W_DATA] if "model" in fields else []
    if "model" in fields:
        fields["model"] = W_HEADER
    with pytest.raises(ProtocolError, match=f"{kind}.{field} = ") as e:
        decode([raw({"v": V, "type": kind, **fields}), *frames], LIMIT)
    assert e.value.reason == "field_type"


@pytest.mark.parametrize(
    "headers, data, why",
    [
        ("not a list", [], "expected a list"),
        ([["w", "float32", [2]]], [b"\x00" * 4], "frame of 4 bytes does not match shape"),
        ([["w", "float32", [2]]], [b"\x00" * 12], "frame of 12 bytes does not match shape"),
        ([["w", "float32", [2**62, 2**62]]], [b"\x00" * 4], "dimensions over"),
        ([["w", "object", [1]]], [b"\x00" * 8], "dtype"),
        ([["w", ["float32"], [1]]], [b"\x00" * 4], "dtype"),
        ([["w", "float32", [-1]]], [b""], "bad shape"),
        ([["w", "float32", [1.0]]], [b"\x00" * 4], "bad shape"),
        ([["w", "float32", [1], b"\x00" * 4]], [], "per tensor"),  # version 1's [name, dtype, shape, data]
        ([["w", "float32"]], [b"\x00" * 4], "per tensor"),
        ([["w", "float32", [1]], ["w", "float32", [1]]], [b"\x00" * 4] * 2, "duplicate"),
        ([["w", "float32", [1]]] * (MAX_TENSORS + 1), [], f"at most {MAX_TENSORS}"),
    ],
)
def test_bad_tensors_are_rejected(headers, data, why):
    with pytest.raises(ProtocolError, match=why) as e:
        decode(update(headers, *data) if data else update(headers)[:1], LIMIT)
    assert e.value.reason == "bad_tensor"


@pytest.mark.parametrize(
    "frames, why",
    [
        ([], "0 frames"),
        (update()[:1], "names 1 tensors but has 0 tensor frames"),  # a header naming more tensors than frames
        (update(W_HEADER, W_DATA, W_DATA), "names 1 tensors but has 2"),
        (update([*W_HEADER, ["b", "float32", [2]]], W_DATA), "names 2 tensors but has 1"),
        ([raw({"v": V, "type": "heartbeat"}), b"\x00" * 8], "heartbeat message names 0 tensors but has 1"),
        ([raw({"v": V, "type": "error", **VALID["error"]}), b"", b""], "error message names 0 tensors but has 2"),
        ([raw({"v": V, "type": "heartbeat"})] * (MAX_FRAMES + 1), f"expected 1 to {MAX_FRAMES}"),
    ],
)
def test_a_frame_count_that_disagrees_with_the_header_is_rejected(frames, why):
    with pytest.raises(ProtocolError, match=why) as e:
        decode(frames, LIMIT)
    assert e.value.reason == "frames" and "frames" in protocol.REASONS


def test_tensor_frames_are_matched_to_the_headers_in_order():
    headers = [["a", "float32", [2]], ["b", "float64", [3]]]
    a, b = np.array([1, 2], np.float32).tobytes(), np.array([3, 4, 5], np.float64).tobytes()
    model = decode(update(headers, a, b), LIMIT)["model"]
    assert model["a"].tolist() == [1, 2] and model["b"].tolist() == [3, 4, 5]
    with pytest.raises(ProtocolError, match=r"model\.b: a frame of 8 bytes does not match"):  # swapped
        decode(update(headers[::-1], a, b), LIMIT)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_tensors_are_rejected(dtype, bad):
    a = np.zeros(5, dtype)
    a[3] = bad
    message = encode("update", round=0, client=0, model={"ok": np.zeros(2, dtype), "w": a}, metrics=METRICS)
    with pytest.raises(ProtocolError, match=r"model\.w: non-finite") as e:
        decode(message.frames, LIMIT)
    assert e.value.reason == "non_finite"


def test_a_nan_training_loss_is_a_valid_metric():
    message = encode("update", round=0, client=0, model=MODEL, metrics={**METRICS, "train_loss": math.nan})
    assert math.isnan(decode(message.frames, LIMIT)["metrics"]["train_loss"])


def test_error_messages_stay_short_whatever_the_value():
    with pytest.raises(ProtocolError) as e:
        decode([raw({"v": V, "type": "hello", "worker": "w", "pid": "9" * 100_000})], LIMIT)
    assert len(str(e.value)) < 300


def test_a_message_without_tensors_is_one_frame():
    assert encode("heartbeat") == Message((raw({"v": V, "type": "heartbeat"}),))


def test_a_bundle_carries_its_tasks_clients_and_params_and_their_model_once():
    tasks = [encode("task", **{**VALID["task"], "client": c, "params": {"steps": c}}) for c in (3, 5, 8)]
    bundle = protocol.bundle(tasks)
    assert bundle.frames[1:] == tasks[0].frames[1:]  # the model's frames, shared, uncopied
    msg = decode(bundle.frames, LIMIT)
    assert (msg["type"], msg["round"], msg["clients"]) == ("bundle", 0, [3, 5, 8])
    assert msg["params"] == [{"steps": 3}, {"steps": 5}, {"steps": 8}]
    assert np.array_equal(msg["model"]["w"], MODEL["w"])
    assert protocol.kind_of(bundle) == "bundle" and protocol.kind_of(tasks[0]) == "task"


@pytest.mark.parametrize(
    ("clients", "params"), [([], []), ([1, 2], [{"steps": 2}]), ([-1], [{"steps": 2}]), ([1], [{"s": [1]}])]
)
def test_a_bundle_with_bad_or_mismatched_clients_and_params_is_rejected(clients, params):
    frames = [
        raw({"v": V, "type": "bundle", "round": 0, "clients": clients, "params": params, "model": W_HEADER}),
        W_DATA,
    ]
    with pytest.raises(ProtocolError) as e:
        decode(frames, LIMIT)
    assert e.value.reason == "field_type"


# --- what a worker can say of a server message it rejects ---------------------------------


def test_a_rejection_may_leave_its_round_client_and_request_unread():
    fields = {**VALID["rejected"], "of_type": "", "round": None, "client": None, "request": None}
    assert decode(encode("rejected", **fields).frames, LIMIT)["round"] is None


NOTHING = {"of_type": "", "round": None, "client": None, "request": None}


@pytest.mark.parametrize(
    "frames, seen",
    [
        (
            encode("task", **{**VALID["task"], "round": 4, "client": 2}).frames,
            {"of_type": "task", "round": 4, "client": 2},
        ),
        (encode("bundle", **VALID["bundle"]).frames, {"of_type": "bundle", "round": 0, "client": 1}),
        (encode("evaluate", **VALID["evaluate"]).frames, {"of_type": "evaluate", "request": 3}),
        ([raw({"v": 99, "type": "task", "round": "x", "client": -1})], {"of_type": "task"}),
        ([raw({"type": 7, "round": 2.0, "clients": []})], {}),
        ([raw([1, 2])], {}),
        ([b"\xc1garbage"], {}),
        ([raw({"type": "x" * 300})], {}),
        ([], {}),
    ],
    ids=["task", "bundle", "evaluate", "wrong types", "junk fields", "not a map", "undecodable", "long", "no frame"],
)
def test_peek_reads_what_it_can_of_a_rejected_message_and_raises_nothing(frames, seen):
    assert protocol.peek(frames, LIMIT) == {**NOTHING, **seen}


def test_peek_reads_the_header_of_a_message_over_the_limit_but_not_a_header_over_it():
    message = encode("task", **VALID["task"])
    with pytest.raises(ProtocolError) as e:
        decode(message.frames, 10 + len(message.frames[0]))
    assert e.value.reason == "oversized"
    assert protocol.peek(message.frames, 10 + len(message.frames[0]))["round"] == 0
    assert protocol.peek(message.frames, 4) == NOTHING


def test_own_problem_is_what_the_receiver_would_reject_a_message_for():
    assert protocol.own_problem(encode("task", **VALID["task"]), LIMIT) == ""
    nan = encode("task", **{**VALID["task"], "model": {"w": np.full(2, np.nan, np.float32)}})
    assert protocol.own_problem(nan, LIMIT) == "model.w: non-finite values"
    assert protocol.own_problem(encode("task", **VALID["task"]), 8).startswith("message of ")

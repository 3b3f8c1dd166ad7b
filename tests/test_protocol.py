import msgpack
import numpy as np
import pytest

from nodes import protocol
from nodes.protocol import ProtocolError, decode, encode, pack_tensors, unpack_tensors

LIMIT = 1 << 20


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
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode(frame, 4000)


@pytest.mark.parametrize("frame, why", [
    (b"\xc1\xff garbage", "undecodable"),
    (msgpack.packb([1, 2, 3]), "not a map"),
    (msgpack.packb({"v": 99, "type": "hello", "worker": "w", "pid": 1}), "protocol version"),
    (msgpack.packb({"v": protocol.VERSION, "type": "launch_missiles"}), "unknown message type"),
    (msgpack.packb({"v": protocol.VERSION, "type": "update", "round": 1}), "lacks"),
])
def test_malformed_messages_are_rejected(frame, why):
    with pytest.raises(ProtocolError, match=why):
        decode(frame, LIMIT)


@pytest.mark.parametrize("items, why", [
    ("not a list", "expected a list"),
    ([["w", "float32", [2], b"\x00" * 4]], "do not match shape"),
    ([["w", "object", [1], b"\x00" * 8]], "dtype"),
    ([["w", "float32", [-1], b""]], "bad shape"),
    ([["w", "float32", [1], "text"]], "raw bytes"),
    ([["w", "float32", [1], b"\x00" * 4], ["w", "float32", [1], b"\x00" * 4]], "duplicate"),
])
def test_bad_tensors_are_rejected(items, why):
    with pytest.raises(ProtocolError, match=why):
        unpack_tensors(items)

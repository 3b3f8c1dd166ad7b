"""Hostile peers on the wire: tensor headers built to crash or stall the decoder, random
msgpack structures, and messages that claim another worker's identity."""

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.config import load
from nodes import protocol
from nodes.keys import keygen, load_worker_keys
from nodes.pool import WorkerPool
from nodes.protocol import ProtocolError
from tests.conftest import FAST
from tests.e2e.test_security import free_address

ROOT = Path(__file__).resolve().parents[2]

LIMIT = 1 << 20
V = protocol.VERSION
METRICS = {"steps": 2, "train_loss": 0.5, "update_norm": 1.0}


def raw(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def update_with(model) -> bytes:
    return raw({"v": V, "type": "update", "round": 0, "client": 0, "model": model, "metrics": METRICS})


@pytest.fixture
def pool(tmp_path):
    """A bare server socket (no local workers) on a private ipc path."""
    p = WorkerPool(f"ipc://{tmp_path}/s.sock", load(None, []).transport)
    p.set_up({"seed": 0})
    yield p
    p.close()


def dealer(ctx, address: str, ident: bytes, keys: Path | None = None):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, ident)
    s.setsockopt(zmq.LINGER, 0)
    if keys:
        s.curve_publickey, s.curve_secretkey, s.curve_serverkey = load_worker_keys(keys)
    s.connect(address)
    return s


@contextmanager
def peer(address: str, ident: bytes):
    """A raw DEALER socket under `ident`, closed with its own context on the way out."""
    ctx = zmq.Context()
    s = dealer(ctx, address, ident)
    try:
        yield s
    finally:
        s.close()
        ctx.term()


def read_until(pool: WorkerPool, done, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"server counters: {pool.counters.reasons}"
        pool._poll(0.05)


# --- tensor headers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, data",
    [
        ([1] * 65, b"\x00" * 4),
        ([1] * 9, b"\x00" * 4),
        ([0, 2**63], b""),
        ([0, 2**40, 2**40], b""),
        ([0, 2**64 - 1], b""),
    ],
)
def test_a_tensor_header_numpy_cannot_build_is_a_rejection(shape, data):
    with pytest.raises(ProtocolError) as e:
        protocol.decode(update_with([["w", "float32", shape, data]]), LIMIT)
    assert e.value.reason == "bad_tensor"


def test_a_shape_of_forty_thousand_dimensions_is_rejected_at_once():
    started = time.monotonic()
    with pytest.raises(ProtocolError) as e:
        protocol.decode(update_with([["w", "uint8", [2**63] * 40_000, b"\x00"]]), LIMIT)
    assert e.value.reason == "bad_tensor" and time.monotonic() - started < 0.5


def test_a_65_dimension_update_from_a_stranger_is_counted_and_the_server_reads_on(pool):
    with peer(pool.address, b"stranger") as s:
        s.send(update_with([["w", "float32", [1] * 65, b"\x00" * 4]]))
        s.send(raw({"v": V, "type": "heartbeat"}))
        read_until(pool, lambda: pool.counters.rejected == 2)
    assert pool.counters.reasons == {"bad_tensor": 1, "unknown_worker": 1}


# --- identities ----------------------------------------------------------------------------


def test_ready_carrying_another_name_does_not_make_its_sender_a_worker(pool):
    with peer(pool.address, b"evil") as evil:
        evil.send(raw({"v": V, "type": "hello", "worker": "evil", "pid": os.getpid()}))
        read_until(pool, lambda: b"evil" in pool.workers)
        assert evil.poll(10_000) and protocol.decode(evil.recv(), LIMIT)["type"] == "setup"
        evil.send(raw({"v": V, "type": "ready", "worker": "local-0.0"}))
        read_until(pool, lambda: pool.counters.rejected == 1)
        assert not pool.workers[b"evil"].ready
        assert pool.counters.reasons == {"identity_mismatch": 1}
        evil.send(raw({"v": V, "type": "ready", "worker": "evil"}))  # its own ready, after its own hello
        read_until(pool, lambda: pool.workers[b"evil"].ready)


def test_ready_from_a_peer_that_never_said_hello_is_refused(pool):
    with peer(pool.address, b"quiet") as s:
        s.send(raw({"v": V, "type": "ready", "worker": "quiet"}))
        read_until(pool, lambda: pool.counters.rejected == 1)
    assert pool.counters.reasons == {"unknown_worker": 1} and b"quiet" not in pool.workers


# --- memory ---------------------------------------------------------------------------------


def status_kib(pid: int, key: str) -> int:
    return next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith(key + ":"))


def test_oversized_frames_are_dropped_by_the_socket_and_the_servers_memory_stays_flat(tmp_path):
    """Frames between the limit and twice the limit used to be read whole before being refused."""
    keys, address, limit = tmp_path / "keys", free_address(), 64 * 2**20
    keygen(keys)
    with open(tmp_path / "console.log", "w") as log:  # it waits for a second worker: the attack comes first
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "emulator",
                *FAST,
                "workers=1",
                f"output.dir={tmp_path}",
                "output.name=run",
                f"transport.address={address}",
                f"transport.keys_dir={keys}",
                f"transport.max_message_bytes={limit}",
                "transport.min_workers=2",
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    ctx = zmq.Context()
    attacker = dealer(ctx, address, b"attacker", keys)  # authorized: without a key it could send nothing at all
    worker = None
    try:
        attacker.send(raw({"v": V, "type": "hello", "worker": "attacker", "pid": os.getpid()}))
        assert attacker.poll(120_000), "the server never answered"  # its setup: the server is up and waiting
        attacker.recv()
        try:  # its peak memory from now on
            Path(f"/proc/{server.pid}/clear_refs").write_text("5")
        except OSError as e:
            pytest.skip(f"cannot reset a process's peak memory here: {e}")
        before = status_kib(server.pid, "VmRSS")
        frame = b"\x00" * int(1.9 * limit)
        for _ in range(3):
            attacker.send(frame, copy=False)
        time.sleep(3)
        grown_mib = (status_kib(server.pid, "VmHWM") - before) / 1024
        worker = subprocess.Popen(
            [sys.executable, "-m", "nodes.worker", "--connect", address, "--id", "late", "--keys", str(keys)], cwd=ROOT
        )
        assert server.wait(timeout=300) == 0, (tmp_path / "console.log").read_text()
    finally:
        attacker.close(linger=0)
        ctx.term()
        for p in (server, worker):
            if p is not None:
                p.kill()
                p.wait()
    assert grown_mib < 32, f"the server's peak memory grew by {grown_mib:.0f} MiB"
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "complete"


def test_a_message_of_a_thousand_frames_is_one_counted_rejection(pool):
    with peer(pool.address, b"many") as s:
        s.send_multipart([raw({"v": V, "type": "heartbeat"})] * 1000)
        s.send(raw({"v": V, "type": "heartbeat"}))
        read_until(pool, lambda: pool.counters.rejected == 2)
    assert pool.counters.reasons == {"frames": 1, "unknown_worker": 1}


# --- property: whatever arrives, decoding raises nothing but ProtocolError --------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=64)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=10) | st.binary(max_size=10), inner, max_size=6)
    ),
    max_leaves=40,
)
DIMS = st.integers(min_value=-3, max_value=2**64 - 1) | st.integers(min_value=0, max_value=8)
SHAPES = st.lists(DIMS, max_size=12) | st.lists(st.sampled_from([0, 1, 2**40]), min_size=9, max_size=70)


@st.composite
def tensor_headers(draw):
    """[name, dtype, shape, data], its data often exactly as long as the shape says."""
    dtype, shape = draw(st.sampled_from(protocol.DTYPES)), draw(SHAPES)
    size = int(np.prod([max(d, 0) for d in shape], dtype=object)) * np.dtype(dtype).itemsize
    data = draw(
        st.binary(min_size=size, max_size=size) if size <= 4096 and draw(st.booleans()) else st.binary(max_size=64)
    )
    return [draw(st.text(max_size=4)), dtype, shape, data]


JUNK_TENSOR = st.tuples(
    st.text(max_size=4) | VALUES,
    st.sampled_from(["object", "V8", "<f4"]) | VALUES,
    SHAPES | VALUES,
    st.binary(max_size=64) | VALUES,
).map(list)
HEADERS = st.lists(tensor_headers(), min_size=1, max_size=3)
MODELS = st.one_of(HEADERS, HEADERS, st.lists(JUNK_TENSOR | tensor_headers() | VALUES, max_size=3), VALUES)


GOOD = {
    "worker": "w",
    "pid": 7,
    "scenario": {"seed": 0},
    "wire_log": "",
    "heartbeat_s": 2.0,
    "round": 0,
    "client": 1,
    "params": {"lr": 0.1},
    "metrics": METRICS,
    "message": "boom",
}


@st.composite
def messages(draw):
    """An envelope of a known type (mostly) whose fields are mostly right, so that the checks
    of every field, and the tensors' above all, are reached."""
    kind = draw(st.one_of(*[st.sampled_from(sorted(protocol.FIELDS))] * 3, VALUES))
    fields = {"v": draw(st.one_of(st.just(V), st.just(V), st.just(V), VALUES)), "type": kind}
    for name in protocol.FIELDS.get(kind, {}) if isinstance(kind, str) else {}:
        right = MODELS if name == "model" else st.just(GOOD[name])
        fields[name] = draw(st.one_of(right, right, right, VALUES))
    return raw({**fields, **draw(st.dictionaries(st.text(max_size=8), VALUES, max_size=1))})


FRAMES = (
    messages()
    | MODELS.map(update_with)
    | VALUES.map(raw)
    | st.binary(max_size=512)
    | messages().map(lambda f: f[: len(f) // 2])
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FRAMES)
def test_decoding_any_frame_raises_nothing_but_a_protocol_error(frame):
    try:
        protocol.decode(frame, LIMIT)
    except ProtocolError as e:
        assert e.reason in protocol.REASONS


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(FRAMES, st.binary(min_size=1, max_size=8))
def test_the_server_counts_any_frame_it_cannot_use_and_never_raises(pool, frame, ident):
    before = pool.counters.rejected
    pool._receive([ident, frame])
    try:
        protocol.decode(frame, pool.max_bytes)
    except ProtocolError:
        assert pool.counters.rejected == before + 1

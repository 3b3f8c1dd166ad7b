"""Hostile peers on the wire: tensor headers built to crash or stall the decoder, tensor frames
that disagree with their headers, random msgpack structures and frames, and messages that claim
another worker's identity."""

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

from nodes.contracts import protocol
from nodes.contracts.keys import keygen, load_worker_keys
from nodes.contracts.protocol import MAX_FRAMES, ProtocolError
from nodes.transport.pool import WorkerPool
from nodes.transport.roster import Task
from tests.conftest import FAST, bare_pool
from tests.e2e.test_security import free_address

ROOT = Path(__file__).resolve().parents[2]

LIMIT = 1 << 20
V = protocol.VERSION
METRICS = {"steps": 2, "train_loss": 0.5, "update_norm": 1.0}


def raw(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def update_with(model, *data) -> list[bytes]:
    """An update whose header names `model` (tensor headers), then the frames `data`."""
    return [raw({"v": V, "type": "update", "round": 0, "client": 0, "model": model, "metrics": METRICS}), *data]


@pytest.fixture
def small_pool(tmp_path):
    """A bare server socket whose messages are limited to 64 KiB."""
    p = bare_pool(tmp_path, "transport.max_message_bytes=65536")
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
        protocol.decode(update_with([["w", "float32", shape]], data), LIMIT)
    assert e.value.reason == "bad_tensor"


def test_a_shape_of_forty_thousand_dimensions_is_rejected_at_once():
    started = time.monotonic()
    with pytest.raises(ProtocolError) as e:
        protocol.decode(update_with([["w", "uint8", [2**63] * 40_000]], b"\x00"), LIMIT)
    assert e.value.reason == "bad_tensor" and time.monotonic() - started < 0.5


def test_a_65_dimension_update_from_a_stranger_is_counted_and_the_server_reads_on(pool):
    with peer(pool.address, b"stranger") as s:
        s.send_multipart(update_with([["w", "float32", [1] * 65]], b"\x00" * 4))
        s.send(raw({"v": V, "type": "heartbeat"}))
        read_until(pool, lambda: pool.counters.rejected == 2)
    assert pool.counters.reasons == {"bad_tensor": 1, "unknown_worker": 1}


# --- tensor frames ----------------------------------------------------------------------------

W = [["w", "float32", [4]]]
W_DATA = np.ones(4, np.float32).tobytes()
FRAMINGS = [  # (what a peer sends, the reason the server counts)
    (update_with(W), "frames"),  # a header naming more tensors than frames
    (update_with(W * 0, W_DATA), "frames"),  # a frame no header names
    (update_with([*W, ["b", "float32", [1]]], W_DATA), "frames"),
    (update_with(W, W_DATA, W_DATA), "frames"),
    (update_with(W, W_DATA[:-1]), "bad_tensor"),  # a tensor frame shorter than its header says
    (update_with(W, W_DATA + b"\x00" * 4), "bad_tensor"),  # ... and longer
    (update_with(W, np.full(4, np.nan, np.float32).tobytes()), "non_finite"),
    ([raw({"v": V, "type": "heartbeat"}), W_DATA], "frames"),  # frames in a message that carries no tensors
    ([raw({"v": V, "type": "error", "round": 0, "client": 0, "message": "x"}), b"", b""], "frames"),
    ([raw({"v": V, "type": "heartbeat"})] * (MAX_FRAMES + 1), "frames"),  # the frames after MAX_FRAMES dropped as read
    # ... even where the first MAX_FRAMES would make a valid message
    (update_with([[f"t{i}", "uint8", [1]] for i in range(MAX_FRAMES - 1)], *[b"\x00"] * MAX_FRAMES), "frames"),
    # frames each under the limit, together over it
    (update_with([["w", "uint8", [40_000]], ["b", "uint8", [40_000]]], *[b"\x00" * 40_000] * 2), "oversized"),
    (update_with([["w", "uint8", [1]]], *[b"\x00" * 30_000] * 3), "oversized"),  # checked before the header
]


@pytest.mark.parametrize("frames, reason", FRAMINGS)
def test_a_message_whose_frames_disagree_with_its_header_is_one_counted_rejection(small_pool, frames, reason):
    """Each from a registered worker holding a task: its task fails at once, the server reads on."""
    pool = small_pool
    with peer(pool.address, b"w") as s:
        s.send(raw({"v": V, "type": "hello", "worker": "w", "pid": os.getpid()}))
        s.send(raw({"v": V, "type": "ready", "worker": "w", "model": []}))
        read_until(pool, lambda: b"w" in pool.workers and pool.workers[b"w"].ready)
        pool.replies = {}  # what run_tasks sets up: the worker holds round 0's task for client 0
        pool.workers[b"w"].task = Task(0, 0, time.monotonic())
        s.send_multipart(frames)
        s.send(raw({"v": V, "type": "shutdown"}))  # the next message is read, and counted too
        read_until(pool, lambda: pool.counters.rejected == 2)
    assert pool.counters.reasons == {reason: 1, "unexpected_type": 1}
    assert pool.replies[0].failure.startswith("bad reply from worker w: ")
    assert pool.workers[b"w"].task is None and pool.counters.worker_deaths == 0


def test_an_update_whose_frames_add_up_to_the_limit_is_accepted(small_pool):
    """The limit counts all frames, the header's included: exactly at it is still a message."""
    header = update_with([["w", "uint8", [65_000]]])[0]  # a size of the same msgpack length
    frames = update_with([["w", "uint8", [65536 - len(header)]]], b"\x01" * (65536 - len(header)))
    assert sum(map(len, frames)) == 65536 and len(header) == len(frames[0])
    with peer(small_pool.address, b"stranger") as s:
        s.send_multipart(frames)  # well-formed: only its sender is unknown
        read_until(small_pool, lambda: small_pool.counters.rejected == 1)
    assert small_pool.counters.reasons == {"unknown_worker": 1}


def test_a_tensor_frame_over_the_limit_is_dropped_by_the_socket_and_the_server_reads_on(small_pool):
    with peer(small_pool.address, b"big") as big, peer(small_pool.address, b"next") as nxt:
        big.send_multipart(update_with([["w", "uint8", [70_000]]], b"\x00" * 70_000))
        time.sleep(0.5)
        nxt.send(raw({"v": V, "type": "heartbeat"}))
        read_until(small_pool, lambda: small_pool.counters.rejected == 1)
    assert small_pool.counters.reasons == {"unknown_worker": 1}  # the big one never reached Python


# --- identities ----------------------------------------------------------------------------


def test_ready_carrying_another_name_does_not_make_its_sender_a_worker(pool):
    with peer(pool.address, b"evil") as evil:
        evil.send(raw({"v": V, "type": "hello", "worker": "evil", "pid": os.getpid()}))
        read_until(pool, lambda: b"evil" in pool.workers)
        assert evil.poll(10_000) and protocol.decode(evil.recv_multipart(), LIMIT)["type"] == "setup"
        evil.send(raw({"v": V, "type": "ready", "worker": "local-0.0", "model": []}))
        read_until(pool, lambda: pool.counters.rejected == 1)
        assert not pool.workers[b"evil"].ready
        assert pool.counters.reasons == {"identity_mismatch": 1}
        evil.send(raw({"v": V, "type": "ready", "worker": "evil", "model": []}))  # its own ready, after its own hello
        read_until(pool, lambda: pool.workers[b"evil"].ready)


def test_ready_from_a_peer_that_never_said_hello_is_refused(pool):
    with peer(pool.address, b"quiet") as s:
        s.send(raw({"v": V, "type": "ready", "worker": "quiet", "model": []}))
        read_until(pool, lambda: pool.counters.rejected == 1)
    assert pool.counters.reasons == {"unknown_worker": 1} and b"quiet" not in pool.workers


# --- memory ---------------------------------------------------------------------------------


def status_kib(pid: int, key: str) -> int:
    return next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith(key + ":"))


def settled(pid: int, timeout_s: float = 120.0) -> None:
    """Until the process's resident memory holds still for a second."""
    deadline, last = time.monotonic() + timeout_s, -1
    while time.monotonic() < deadline:
        rss = status_kib(pid, "VmRSS")
        if abs(rss - last) < 1024:
            return
        last = rss
        time.sleep(1.0)
    raise AssertionError(f"process {pid}'s memory never settled")


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
        settled(server.pid)  # the server is set up and waits for workers
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
def tensors(draw):
    """([name, dtype, shape], its frame), the frame often exactly as long as the shape says."""
    dtype, shape = draw(st.sampled_from(protocol.DTYPES)), draw(SHAPES)
    size = int(np.prod([max(d, 0) for d in shape], dtype=object)) * np.dtype(dtype).itemsize
    data = draw(
        st.binary(min_size=size, max_size=size) if size <= 4096 and draw(st.booleans()) else st.binary(max_size=64)
    )
    return [draw(st.text(max_size=4)), dtype, shape], data


JUNK_HEADER = st.tuples(
    st.text(max_size=4) | VALUES, st.sampled_from(["object", "V8", "<f4"]) | VALUES, SHAPES | VALUES
).map(list)
JUNK = st.tuples(JUNK_HEADER | VALUES, st.binary(max_size=64))
TENSORS = st.lists(tensors(), min_size=1, max_size=3)
# (the model field, its frames): well-formed tensors mostly, then junk among them, then no list at all
MODELS = st.one_of(
    TENSORS,
    TENSORS,
    st.lists(JUNK | tensors(), max_size=3),
).map(lambda ts: ([h for h, _ in ts], [d for _, d in ts])) | st.tuples(
    VALUES, st.lists(st.binary(max_size=16), max_size=2)
)


@st.composite
def reframed(draw, frames):
    """The frames as they are (mostly), a tensor frame short, or one more."""
    how = draw(st.sampled_from(["same", "same", "same", "short", "more"]))
    if how == "short" and len(frames) > 1:
        return frames[:-1]
    return [*frames, draw(st.binary(max_size=64))] if how == "more" else frames


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
    "request": 3,
    "loss": 0.25,
    "accuracy": 0.5,
    "error": "",
    "codec": {"kind": "sign", "bits": 8, "fraction": 0.01},
    "shapes": [["w", [2, 3]]],
    "clients": [1, 2],
    "reason": "non_finite",
    "detail": "model.w: non-finite values",
    "of_type": "task",
}
GOOD_OF_KIND = {("bundle", "params"): [{"lr": 0.1}, {"lr": 0.1}]}  # a bundle's params: one map per client


@st.composite
def messages(draw):
    """An envelope of a known type (mostly) whose fields are mostly right, then its tensor frames,
    so that the checks of every field, of the tensors above all, and of the frames are reached."""
    kind = draw(st.one_of(*[st.sampled_from(sorted(protocol.FIELDS))] * 3, VALUES))
    fields = {"v": draw(st.one_of(st.just(V), st.just(V), st.just(V), VALUES)), "type": kind}
    data: list[bytes] = []
    for name in protocol.FIELDS.get(kind, {}) if isinstance(kind, str) else {}:
        if protocol.FIELDS[kind][name].tensors:  # model, and a compressed update's parts and residual
            fields[name], more = draw(MODELS)
            data += more
        else:
            good = GOOD_OF_KIND.get((kind, name), GOOD[name])
            fields[name] = draw(st.one_of(*[st.just(good)] * 3, VALUES))
    header = raw({**fields, **draw(st.dictionaries(st.text(max_size=8), VALUES, max_size=1))})
    return draw(reframed([header, *data]))


FRAMES = (
    messages()
    | MODELS.map(lambda m: update_with(m[0], *m[1]))
    | VALUES.map(lambda v: [raw(v)])
    | st.lists(st.binary(max_size=512), min_size=1, max_size=4)
    | messages().map(lambda fs: [fs[0][: len(fs[0]) // 2], *fs[1:]])
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FRAMES)
def test_decoding_any_frames_raises_nothing_but_a_protocol_error(frames):
    try:
        protocol.decode(frames, LIMIT)
    except ProtocolError as e:
        assert e.reason in protocol.REASONS


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(FRAMES, st.binary(min_size=1, max_size=8))
def test_the_server_counts_any_frames_it_cannot_use_and_never_raises(pool, frames, ident):
    before = pool.counters.rejected
    pool._receive(ident, [memoryview(f) for f in frames])
    try:
        protocol.decode(frames, pool.max_bytes)
    except ProtocolError:
        assert pool.counters.rejected == before + 1

"""Hostile input and network exposure: a fuzzed live server, CURVE keys, loopback-only binding."""

import json
import logging
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from emulator.__main__ import main as cli
from emulator.config import ConfigError, load
from nodes.contracts import protocol
from nodes.contracts.keys import (
    SERVER_PUBLIC,
    is_local_address,
    is_private_ipc,
    keygen,
    load_worker_keys,
    server_keys,
)
from nodes.contracts.protocol import ProtocolError
from nodes.transport.inbound import LOG_FIRST
from nodes.transport.pool import WorkerPool
from nodes.transport.supervisor import NoWorkersLeft
from nodes.worker import REFUSED_EXIT
from tests.conftest import rows

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 65536  # transport.max_message_bytes of the fuzzed run
PER_KIND = 600  # 17 kinds: 10 200 messages
MEMBER = "fuzz-member"  # says a valid hello but never ready: registered, yet never given a task
METRICS = {"steps": 2, "train_loss": 0.5, "update_norm": 1.0}


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


# --- the fuzz generator: every kind of bad message, and the reason the server must count ----


def _raw(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _msg(kind: str, **fields) -> list[bytes]:
    """A message's frames; a model given as {name: array} is framed as the protocol frames it."""
    if isinstance(fields.get("model"), dict) or isinstance(fields.get("parts"), dict):
        return [bytes(f) for f in protocol.encode(kind, **fields).frames]
    return [_raw({"v": protocol.VERSION, "type": kind, **fields})]


def _model(rng, dtype="float32") -> dict:
    return {"w": rng.standard_normal((4, 3)).astype(dtype), "b": np.zeros(3, dtype)}


def _fields(kind: str, rng) -> dict:
    r, c = int(rng.integers(0, 50)), int(rng.integers(0, 6))
    return {
        "hello": lambda: {"worker": f"w{r}", "pid": r},
        "setup": lambda: {"scenario": {"seed": r}, "wire_log": "", "heartbeat_s": 1.0},
        "ready": lambda: {"worker": f"w{r}", "model": _model(rng)},
        "heartbeat": dict,
        "task": lambda: {"round": r, "client": c, "params": {"steps": 2, "lr": 0.1}, "model": _model(rng)},
        "update": lambda: {"round": r, "client": c, "model": _model(rng), "metrics": dict(METRICS)},
        "bundle": lambda: {
            "round": r,
            "clients": [c, c + 1],
            "params": [{"steps": 2, "lr": 0.1}] * 2,
            "model": _model(rng),
        },
        "task_residual": lambda: {
            "round": r,
            "client": c,
            "params": {"steps": 2, "lr": 0.1},
            "model": _model(rng),
            "residual": _model(rng),
        },
        "compressed": lambda: {
            "round": r,
            "client": c,
            "codec": {"kind": "sign", "bits": 8, "fraction": 0.01},
            "shapes": [["w", [4, 3]]],
            "parts": {"w:scale": np.ones(1, np.float32), "w:bits": np.zeros(2, np.uint8)},
            "residual": {},
            "metrics": dict(METRICS),
        },
        "error": lambda: {"round": r, "client": c, "message": "boom"},
        "rejected": lambda: {
            "reason": "non_finite",
            "detail": "model.w: non-finite values",
            "of_type": "task",
            "round": r,
            "client": c,
            "request": None,
        },
        "evaluator_setup": lambda: {"scenario": {"seed": r}, "heartbeat_s": 1.0, "test": []},  # raw: no tensor
        "evaluate": lambda: {"request": r, "model": _model(rng)},
        "evaluation": lambda: {"request": r, "loss": 0.5, "accuracy": 0.25, "error": ""},
        "shutdown": dict,
    }[kind]()


def _pick(rng, options):
    return options[int(rng.integers(0, len(options)))]


def random_bytes(rng):
    return [b"\xc1" + rng.bytes(int(rng.integers(0, 2000)))]  # 0xc1 is never valid msgpack


def truncated(rng):
    kind = _pick(rng, ["hello", "task", "update", "error"])
    header, *tensors = _msg(kind, **_fields(kind, rng))
    return [header[: int(rng.integers(0, len(header)))], *tensors]


def deep_nesting(rng):
    return [b"\x91" * int(rng.integers(2000, 20000)) + b"\x01"]


def not_a_map(rng):
    return [_raw(_pick(rng, [[1, 2], [], 7, -3, "update", None, b"\x00", 1.5, True]))]


def wrong_version(rng):
    wrong = [0, 1, 2, 4, 99, -1, "3", 3.0, True, None, [3], {"v": 3}]  # 1 and 2: the protocol's earlier versions
    m = {"v": _pick(rng, wrong), "type": "hello", "worker": "w", "pid": 1}
    if rng.random() < 0.1:
        del m["v"]
    return [_raw(m)]


def unknown_type(rng):
    return [_raw({"v": protocol.VERSION, "type": _pick(rng, ["launch", "", "HELLO", 7, None, ["update"], 2.5])})]


def missing_field(rng):
    kind = _pick(rng, ["hello", "setup", "ready", "task", "update", "error"])
    fields = _fields(kind, rng)
    del fields[_pick(rng, sorted(fields))]
    return _msg(kind, **fields)


def unknown_field(rng):
    kind = _pick(rng, sorted(protocol.FIELDS))
    return _msg(kind, **_fields(kind, rng), **{_pick(rng, ["admin", "pickle", "x"]): True})


WRONG_TYPES = [
    ("update", "round", "x"),
    ("update", "round", -1),
    ("update", "round", True),
    ("update", "round", 2.0),
    ("update", "client", [1]),
    ("update", "client", None),
    ("update", "metrics", [1, 2]),
    ("update", "metrics", {"steps": 2}),
    ("update", "metrics", {**METRICS, "train_loss": "low"}),
    ("update", "metrics", {**METRICS, "steps": 1.5}),
    ("error", "message", 5),
    ("error", "round", {}),
    ("task", "params", [1]),
    ("task", "params", {"lr": [0.1]}),
    ("hello", "worker", 5),
    ("hello", "worker", ""),
    ("hello", "pid", "1"),
    ("ready", "worker", b"w"),
    ("setup", "scenario", "x"),
    ("setup", "heartbeat_s", -1),
]


def wrong_field_type(rng):
    kind, field, value = _pick(rng, WRONG_TYPES)
    return _msg(kind, **{**_fields(kind, rng), field: value})


BAD_TENSORS = [  # (the model field, its frames)
    ("not a list", []),
    ([["w", "float32", [4, 3]]], [b"\x00" * 44]),
    ([["w", "float32", [4, 3]]], [b"\x00" * 52]),
    ([["w", "float32", [2**40, 2**40]]], [b""]),
    ([["w", "object", [1]]], [b"\x00" * 8]),
    ([["w", "float32", [-1]]], [b""]),
    ([["w", "float32", "3"]], [b""]),
    ([["w", "float32", [1], b"\x00" * 4]], []),  # protocol 1's [name, dtype, shape, data]
    ([["w", "float32"]], [b"\x00" * 4]),
    ([[7, "float32", [1]]], [b"\x00" * 4]),
    ([["w", "float32", [1]], ["w", "float32", [1]]], [b"\x00" * 4] * 2),
]


def bad_tensor(rng):
    model, tensors = _pick(rng, BAD_TENSORS)
    return [*_msg("update", **{**_fields("update", rng), "model": model}), *tensors]


def non_finite(rng):
    a = rng.standard_normal(12).astype(_pick(rng, ["float16", "float32", "float64"]))
    a[int(rng.integers(0, 12))] = _pick(rng, [np.nan, np.inf, -np.inf])
    return _msg("update", **{**_fields("update", rng), "model": {"w": a}})


def multipart(rng):
    """Frames after a message that carries no tensors."""
    kind = _pick(rng, ["heartbeat", "error"])
    extra = [_msg("heartbeat")[0] if rng.random() < 0.5 else b"" for _ in range(int(rng.integers(1, 4)))]
    return [*_msg(kind, **_fields(kind, rng)), *extra]


def unknown_worker(rng):
    kind = _pick(rng, ["heartbeat", "update", "error"])
    return _msg(kind, **_fields(kind, rng))


def identity_mismatch(rng):
    kind = _pick(rng, ["hello", "ready"])
    return _msg(kind, **{**_fields(kind, rng), "worker": _pick(rng, ["local-0.0", "local-1.0", MEMBER, "someone"])})


def duplicate_worker(rng):
    return _msg("hello", worker=MEMBER, pid=1)


def stale(rng):
    kind = _pick(rng, ["update", "error"])
    return _msg(kind, **_fields(kind, rng))


def unexpected_type(rng):
    kind = _pick(rng, ["task", "setup", "shutdown"])
    return _msg(kind, **_fields(kind, rng))


# (generator, who sends it, the reason the server counts it under)
KINDS = [
    (random_bytes, "anon", "undecodable"),
    (truncated, "anon", "undecodable"),
    (deep_nesting, "anon", "undecodable"),
    (not_a_map, "anon", "not_a_map"),
    (wrong_version, "anon", "version"),
    (unknown_type, "anon", "unknown_type"),
    (missing_field, "anon", "missing_field"),
    (unknown_field, "anon", "unknown_field"),
    (wrong_field_type, "anon", "field_type"),
    (bad_tensor, "anon", "bad_tensor"),
    (non_finite, "anon", "non_finite"),
    (multipart, "anon", "frames"),
    (unknown_worker, "anon", "unknown_worker"),
    (identity_mismatch, "anon", "identity_mismatch"),
    (duplicate_worker, "member", "duplicate_worker"),
    (stale, "member", "stale"),
    (unexpected_type, "member", "unexpected_type"),
]


def fuzz_messages(seed: int, per_kind: int) -> list[tuple[str, str, str, list[bytes]]]:
    """(kind, sender, expected reason, frames), a fixed count per kind, in a seeded random order."""
    rng = np.random.default_rng(seed)
    out = [(make.__name__, sender, reason, make(rng)) for make, sender, reason in KINDS for _ in range(per_kind)]
    random.Random(seed).shuffle(out)
    return out


def test_every_fuzz_kind_is_what_it_claims_to_be():
    for kind, _sender, reason, frames in fuzz_messages(seed=1, per_kind=40):
        if reason in protocol.REASONS:
            with pytest.raises(ProtocolError) as e:
                protocol.decode(frames, LIMIT)
            assert e.value.reason == reason, (kind, str(e.value))
            assert sum(map(len, frames)) <= LIMIT  # over it, the socket drops the peer: see test_hostile_wire
        else:  # the server-level kinds are well-formed messages
            assert protocol.decode(frames, LIMIT)


class Fuzzer(threading.Thread):
    """Sends every message from four anonymous sockets and the one registered member.

    DEALER sockets block at the high-water mark rather than drop, so every message sent is
    eventually read by the server; the member heartbeats so that it is never declared dead.
    All of them hold an authorized key: without one, nothing reaches the server at all.
    """

    def __init__(self, address: str, messages, keys: Path):
        super().__init__(daemon=True)
        self.address, self.messages, self.keys = address, messages, load_worker_keys(keys)
        self.sent, self.stop, self.error = threading.Event(), threading.Event(), None

    def run(self):
        ctx = zmq.Context()
        socks = []
        try:
            anon = [self._dealer(ctx, f"fuzz-anon-{i}", socks) for i in range(4)]
            member = self._dealer(ctx, MEMBER, socks)
            member.send_multipart(_msg("hello", worker=MEMBER, pid=os.getpid()))
            if not member.poll(300_000) or protocol.decode(member.recv_multipart(), 1 << 24)["type"] != "setup":
                raise RuntimeError("the fuzz member was not set up")
            beat = time.monotonic()
            for i, (_, sender, _, frames) in enumerate(self.messages):
                (member if sender == "member" else anon[i % len(anon)]).send_multipart(frames)
                if time.monotonic() - beat > 0.5:
                    member.send_multipart(_msg("heartbeat"))
                    beat = time.monotonic()
            self.sent.set()
            while not self.stop.wait(0.5):
                member.send_multipart(_msg("heartbeat"))
        except BaseException as e:
            self.error = e
            self.sent.set()
        finally:
            for s in socks:
                s.close(linger=0)
            ctx.term()

    def _dealer(self, ctx, ident: str, socks: list):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, ident.encode())
        s.setsockopt(zmq.SNDTIMEO, 120_000)  # a dead server fails the test instead of hanging it
        s.curve_publickey, s.curve_secretkey, s.curve_serverkey = self.keys
        s.connect(self.address)
        socks.append(s)
        return s


def pool_waiting_for(fuzzer: Fuzzer, last_round: int):
    """A WorkerPool that holds the last round until it has read every fuzz message, so the
    counters can be compared exactly (a message still in flight at the end would be lost)."""

    class GatedPool(WorkerPool):
        def run_tasks(self, rnd, frames, meanwhile=None):
            deadline = time.monotonic() + 300
            while rnd == last_round and not (fuzzer.sent.is_set() and self.counters.rejected >= len(fuzzer.messages)):
                assert time.monotonic() < deadline, f"read {self.counters.rejected} of {len(fuzzer.messages)}"
                self._poll(0.05)
            return super().run_tasks(rnd, frames, meanwhile)

    return GatedPool


def test_ten_thousand_malformed_messages_change_nothing_but_the_counters(emulate, monkeypatch, caplog, tmp_path):
    common = [f"transport.max_message_bytes={LIMIT}", "budget.rounds=3"]
    reference = emulate(*common)
    address, keys = free_address(), tmp_path / "keys"
    keygen(keys)
    fuzzer = Fuzzer(address, fuzz_messages(seed=0, per_kind=PER_KIND), keys)
    monkeypatch.setattr("emulator.run.lifecycle.WorkerPool", pool_waiting_for(fuzzer, last_round=2))
    caplog.set_level(logging.WARNING, logger="dpfl.server")
    fuzzer.start()
    try:
        fuzzed = emulate(*common, f"transport.address={address}", f"transport.keys_dir={keys}")
    finally:
        fuzzer.stop.set()
        fuzzer.join(timeout=30)
    assert fuzzer.error is None, fuzzer.error
    assert len(fuzzer.messages) >= 10_000
    for name in ("rounds", "client_rounds", "events"):
        assert rows(fuzzed, name) == rows(reference, name), name
    m = manifest(fuzzed)
    expected = Counter(reason for _, _, reason, _ in fuzzer.messages)
    assert m["status"] == "complete"
    assert m["transport"]["reasons"] == dict(expected)
    assert m["transport"]["rejected"] == len(fuzzer.messages)
    assert m["transport"]["worker_deaths"] == 0
    # logged, but rate-limited: the first few per reason and one summary
    logged = [r for r in caplog.records if r.name == "dpfl.server" and "rejected a message" in r.getMessage()]
    assert len(logged) == LOG_FIRST * len(expected)


# --- network exposure --------------------------------------------------------------------


def start_worker(address: str, name: str, keys: Path | None, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "nodes.worker", "--connect", address, "--id", name]
    with open(log, "w") as f:
        return subprocess.Popen(cmd + (["--keys", str(keys)] if keys else []), cwd=ROOT, stderr=f)


def test_curve_admits_workers_with_an_authorized_key_only(emulate, tmp_path):
    keys, intruder = tmp_path / "keys", tmp_path / "intruder"
    assert cli(["keygen", str(keys)]) == 0
    keygen(intruder)  # its own key pair, not authorized ...
    shutil.copy(keys / SERVER_PUBLIC, intruder / SERVER_PUBLIC)  # ... though it knows the server's key
    address = free_address()
    friend = start_worker(address, "friend", keys, tmp_path / "friend.log")
    stranger = start_worker(address, "stranger", intruder, tmp_path / "stranger.log")
    plain = start_worker(address, "plain", None, tmp_path / "plain.log")  # no CURVE at all
    try:
        run = emulate(
            f"transport.address={address}",
            "transport.curve=true",
            f"transport.keys_dir={keys}",
            "workers=1",
            "transport.wire_log=true",
            "budget.rounds=8",
            "transport.min_workers=2",
        )
        served = {json.loads(line)["worker"] for line in (run / "wire.jsonl").read_text().splitlines()}
        assert served == {"friend", "local-0.0"}
        assert friend.wait(timeout=30) == 0  # set up, trained, shut down at the end
        assert stranger.wait(timeout=30) == REFUSED_EXIT
        assert "refused this worker's key" in (tmp_path / "stranger.log").read_text()
        assert plain.wait(timeout=30) == REFUSED_EXIT  # never let in, never set up
        m = manifest(run)
        assert m["status"] == "complete" and m["transport"]["rejected"] == 0
    finally:
        for p in (friend, stranger, plain):
            p.kill()
            p.wait()


@pytest.mark.parametrize("address", ["tcp", "ipc://@dpfl-test-abstract-{pid}"])
def test_a_peer_without_keys_gets_nothing_from_a_server_on_loopback_or_an_abstract_socket(address):
    address = free_address() if address == "tcp" else address.format(pid=os.getpid())
    pool = WorkerPool(address, load(None, []).transport)  # no keys_dir: its own per-run keys
    ctx = zmq.Context()
    plain = ctx.socket(zmq.DEALER)
    plain.setsockopt(zmq.IDENTITY, b"plain")
    plain.connect(address)
    try:
        plain.send_multipart(_msg("hello", worker="plain", pid=os.getpid()), flags=zmq.NOBLOCK)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            pool._poll(0.05)
        assert not pool.workers and pool.counters.rejected == 0
        assert not plain.poll(100)  # no setup: the scenario stays private
    finally:
        plain.close(linger=0)
        ctx.term()
        pool.close()


def test_a_run_on_loopback_tcp_without_keys_dir_serves_only_the_workers_it_started(emulate, tmp_path):
    address = free_address()
    intruder = start_worker(address, "intruder", None, tmp_path / "intruder.log")
    try:
        run = emulate(f"transport.address={address}", "workers=1", "transport.wire_log=true", "budget.rounds=3")
        served = {json.loads(line)["worker"] for line in (run / "wire.jsonl").read_text().splitlines()}
        assert served == {"local-0.0"} and manifest(run)["status"] == "complete"
        assert intruder.wait(timeout=30) == REFUSED_EXIT
    finally:
        intruder.kill()
        intruder.wait()
    err = (tmp_path / "intruder.log").read_text().splitlines()
    assert len(err) == 1 and "requires CURVE keys" in err[0], err


def other_keys(tmp_path: Path, keys: Path, case: str) -> Path | None:
    """A worker's --keys for each way of holding the wrong ones."""
    if case == "none":
        return None
    d = tmp_path / case
    keygen(d)
    if case == "unauthorized":  # its own key pair, with the right server key
        shutil.copy(keys / SERVER_PUBLIC, d / SERVER_PUBLIC)
    return d  # "other_server": another server's public key altogether


@pytest.mark.parametrize("case", ["unauthorized", "other_server", "none", "keys_for_a_keyless_server"])
def test_a_worker_that_cannot_authenticate_exits_3_with_one_line(tmp_path, case):
    keys = tmp_path / "keys"
    keygen(keys)
    if case == "keys_for_a_keyless_server":  # an ipc socket in a private directory needs no keys
        address, transport, worker_keys = f"ipc://{tmp_path}/s.sock", load(None, []).transport, keys
    else:
        address, transport = free_address(), load(None, [f"transport.keys_dir={keys}"]).transport
        worker_keys = other_keys(tmp_path, keys, case)
    pool = WorkerPool(address, transport)
    try:
        worker = start_worker(address, "w", worker_keys, tmp_path / "w.log")
        try:
            try:
                code = worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                code = None  # still running: its log says what it waits for
            assert code == REFUSED_EXIT, (tmp_path / "w.log").read_text()
        finally:
            worker.kill()
            worker.wait()
        assert not pool.workers
    finally:
        pool.close()
    err = (tmp_path / "w.log").read_text().splitlines()
    assert len(err) == 1 and err[0].startswith(f"worker w: the server at {address}"), err


@pytest.mark.parametrize(
    "address",
    [
        "tcp://0.0.0.0:5555",
        "tcp://*:5555",
        "tcp://10.1.2.3:5555",
        "tcp://[::]:5555",
        f"tcp://{socket.gethostname()}:5555",
    ],
)
def test_a_network_address_without_keys_is_refused(address):
    assert not is_local_address(address)
    with pytest.raises(ConfigError, match=r"transport\.address = .*transport\.keys_dir"):
        load(None, [f"transport.address='{address}'"])  # quoted: Hydra's grammar reads [ as a list


@pytest.mark.parametrize(
    "address", ["ipc:///tmp/x.sock", "tcp://127.0.0.1:5555", "tcp://localhost:1", "tcp://127.8.9.10:1", "tcp://[::1]:1"]
)
def test_loopback_needs_no_keys_dir(address):
    # accepted without transport.keys_dir: the server makes a key pair for its own workers
    assert is_local_address(address)
    load(None, [f"transport.address='{address}'"])
    assert is_local_address("")  # the default: an ipc:// socket


def test_only_an_ipc_socket_in_a_directory_no_one_else_may_enter_goes_without_keys(tmp_path):
    private, shared = tmp_path / "private", tmp_path / "shared"
    private.mkdir(mode=0o700)
    shared.mkdir()
    shared.chmod(0o755)
    assert is_private_ipc(f"ipc://{private}/s.sock")
    for address in (
        f"ipc://{shared}/s.sock",
        f"ipc://{tmp_path}/missing/s.sock",
        "ipc://@abstract",
        "tcp://127.0.0.1:5555",
    ):
        assert not is_private_ipc(address), address
        assert server_keys(address, "") is not None, address
    assert server_keys(f"ipc://{private}/s.sock", "") is None


def test_the_cli_refuses_a_network_address_without_keys_before_starting(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "emulator", "transport.address=tcp://0.0.0.0:5555", f"output.dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert p.stderr.startswith("error: transport.address = 'tcp://0.0.0.0:5555'") and len(p.stderr.splitlines()) == 1
    assert "transport.keys_dir" in p.stderr and not list(tmp_path.iterdir())


def test_curve_without_keys_or_with_an_incomplete_keys_dir_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"transport.keys_dir = '': transport.curve = true needs keys"):
        load(None, ["transport.curve=true"])
    with pytest.raises(ConfigError, match=r"missing server.key, server.key_secret, client.key_secret, authorized"):
        load(None, ["transport.curve=true", f"transport.keys_dir={tmp_path}"])


def test_keygen_writes_private_key_pairs_and_never_overwrites(tmp_path, capsys):
    d = tmp_path / "k"
    assert cli(["keygen", str(d)]) == 0
    assert {p.name for p in d.iterdir()} == {
        "server.key",
        "server.key_secret",
        "client.key",
        "client.key_secret",
        "authorized",
    }
    assert [p.name for p in (d / "authorized").iterdir()] == ["client.key"]
    assert all((d / n).stat().st_mode & 0o777 == 0o600 for n in ("server.key_secret", "client.key_secret"))
    load(None, ["transport.address=tcp://0.0.0.0:5555", f"transport.keys_dir={d}"])  # now accepted
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    assert cli(["keygen", str(d)]) == 2
    assert f"{d} is not empty" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before


def test_a_worker_with_an_incomplete_keys_dir_stops_with_a_clear_error(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "nodes.worker", "--connect", "tcp://127.0.0.1:1", "--keys", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "missing server.key, client.key_secret" in p.stderr


# --- a hand-driven peer against a bare WorkerPool -------------------------------------------


def scripted_worker(address: str, answer) -> threading.Thread:
    """A worker that joins properly, then sends answer(task) for every task it gets."""

    def run():
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, b"scripted")
        s.connect(address)
        s.send_multipart(_msg("hello", worker="scripted", pid=os.getpid()))
        while s.poll(20_000):
            msg = protocol.decode(s.recv_multipart(), 1 << 24)
            if msg["type"] == "shutdown":
                break
            for frames in [_msg("ready", worker="scripted", model={})] if msg["type"] == "setup" else answer(msg):
                s.send_multipart(frames)
        s.close(linger=1000)
        ctx.term()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def bare_pool(address: str) -> WorkerPool:
    """No local workers: only the scripted peer serves."""
    pool = WorkerPool(address, load(None, []).transport)
    pool.set_up({"seed": 0})
    deadline = time.monotonic() + 60
    while not any(w.ready for w in pool.workers.values()):
        assert time.monotonic() < deadline
        pool._poll(0.1)
    return pool


def test_a_poisoned_reply_fails_its_client_at_once_and_the_worker_serves_on(tmp_path):
    def answer(task):
        rnd, client = task["round"], task["client"]
        w = np.ones(3, np.float32)
        if client == 0:  # NaN weights (a reply for a task it does not hold: tests/e2e/test_rejections.py)
            return [_msg("update", round=rnd, client=0, model={"w": w * np.nan}, metrics=METRICS)]
        return [_msg("update", round=rnd, client=client, model={"w": w}, metrics=METRICS)]

    address = f"ipc://{tmp_path}/s.sock"  # a private directory: a key-less peer may join
    peer = scripted_worker(address, answer)
    pool = bare_pool(address)
    try:
        started = time.monotonic()
        tasks = [(c, protocol.encode("task", round=0, client=c, params={}, model={})) for c in (0, 1)]
        replies = pool.run_tasks(0, tasks)
        assert time.monotonic() - started < 30  # not transport.worker_timeout_s (600 s)
    finally:
        pool.close()
        peer.join(timeout=30)
    assert replies[0].failure == "bad reply from worker scripted: model.w: non-finite values"
    assert not replies[1].failure and replies[1].message["client"] == 1
    assert pool.counters.reasons == {"non_finite": 1} and pool.counters.worker_deaths == 0


def test_with_no_worker_left_the_round_fails_instead_of_hanging():
    pool = WorkerPool(free_address(), load(None, []).transport)
    try:
        with pytest.raises(NoWorkersLeft, match="no workers left"):
            pool.run_tasks(0, [(0, protocol.encode("task", round=0, client=0, params={}, model={}))])
    finally:
        pool.close()


def test_a_second_connection_with_a_workers_identity_is_ignored(tmp_path):
    # Without ROUTER_HANDOVER, ZeroMQ keeps the first connection: the thief neither speaks nor gets tasks.
    def honest(task):
        return [_msg("update", round=task["round"], client=task["client"], model=[], metrics=METRICS)]

    address = f"ipc://{tmp_path}/s.sock"
    peer = scripted_worker(address, honest)
    pool = bare_pool(address)
    ctx = zmq.Context()
    thief = ctx.socket(zmq.DEALER)
    thief.setsockopt(zmq.IDENTITY, b"scripted")
    thief.connect(address)
    try:
        thief.send_multipart(_msg("hello", worker="scripted", pid=1))
        time.sleep(0.5)
        pool._poll(0.5)
        replies = pool.run_tasks(
            0, [(c, protocol.encode("task", round=0, client=c, params={}, model={})) for c in range(3)]
        )
        assert all(not r.failure for r in replies.values())
        assert pool.counters.rejected == 0 and not thief.poll(500)
    finally:
        thief.close(linger=0)
        ctx.term()
        pool.close()
        peer.join(timeout=30)

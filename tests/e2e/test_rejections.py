"""No reply is waited out that is not coming: a server message a worker rejects is answered at once
(`rejected`) and the server checks its own message (the fault is the server's: the run stops in one line,
blaming and restarting no worker; or the worker's: its task fails), a stale reply frees its worker, a
checkpoint with a NaN model is never resumed, and a SIGKILLed server's private directory is swept."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from emulator.__main__ import main
from emulator.config import load
from emulator.output import checkpoint
from emulator.output.results import read_table
from nodes.contracts import protocol
from nodes.contracts.schema import to_dict
from nodes.transport.evaluator import EvaluatorError, EvaluatorProcess
from nodes.transport.pool import RejectedByWorker, WorkerPool
from nodes.transport.supervisor import PRIVATE_PREFIX, SETTLED_S, private_dir
from tests.conftest import FAST

ROOT = Path(__file__).resolve().parents[2]
METRICS = {"steps": 2, "train_loss": 0.5, "update_norm": 1.0}
QUICK_S = 30.0  # what "at once" means here: transport.worker_timeout_s is 600 s


# --- a hand-driven worker against a bare pool -----------------------------------------------


def peer(address: str, answer, setup=None, limit: int = 1 << 20, name: str = "scripted") -> threading.Thread:
    """A worker `name` that joins and answers each task as answer(decoded task, or the ProtocolError and the
    frames) says: a list of messages. `setup(msg)` is what it answers the setup with (default: ready);
    `limit` is its --max-message-bytes."""

    def run():
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, name.encode())
        s.connect(address)
        s.send_multipart(protocol.encode("hello", worker=name, pid=os.getpid()).frames)
        while s.poll(20_000):
            frames = s.recv_multipart()
            try:
                msg = protocol.decode(frames, limit)
            except protocol.ProtocolError as e:
                out = answer(e, frames)
            else:
                if msg["type"] == "shutdown":
                    break
                if msg["type"] == "setup":
                    out = (setup or (lambda m: [protocol.encode("ready", worker=name, model={})]))(msg)
                else:
                    out = answer(msg, frames)
            for message in out:
                s.send_multipart(message.frames)
        s.close(linger=1000)
        ctx.term()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def rejection(e: protocol.ProtocolError, frames) -> protocol.Message:
    """What nodes.worker answers a message that does not decode with."""
    return protocol.encode("rejected", reason=e.reason, detail=str(e), **protocol.peek(frames, 1 << 20))


def update(rnd: int, client: int) -> protocol.Message:
    return protocol.encode("update", round=rnd, client=client, model={"w": np.ones(3, np.float32)}, metrics=METRICS)


def tasks(*clients: int, model=None) -> list[tuple[int, protocol.Message]]:
    return [(c, protocol.encode("task", round=0, client=c, params={}, model=model or {})) for c in clients]


@pytest.fixture
def served(tmp_path):
    """served(answer, setup=None) -> a bare pool (no local workers) with the scripted peer ready in it."""
    pools, peers = [], []

    def serve(answer, setup=None, ready=True):
        address = f"ipc://{tmp_path}/s.sock"  # a private directory: a key-less peer may join
        peers.append(peer(address, answer, setup))
        pool = WorkerPool(address, load(None, [f"transport.worker_timeout_s={2 * QUICK_S:g}"]).transport)
        pools.append(pool)
        pool.set_up({"seed": 0})
        if ready:
            pool.wait_ready(min_workers=1, timeout_s=QUICK_S)
        return pool

    yield serve
    for pool in pools:
        pool.close()
    for t in peers:
        t.join(timeout=30)


def test_a_task_the_servers_own_check_rejects_stops_the_run_at_once_blaming_no_worker(served):
    pool = served(lambda e, frames: [rejection(e, frames)])
    started = time.monotonic()
    with pytest.raises(RejectedByWorker) as e:
        pool.run_tasks(0, tasks(0, 1, model={"w": np.array([1, np.nan], np.float32)}))
    assert time.monotonic() - started < QUICK_S
    assert str(e.value) == "round 0: worker scripted rejected the task: model.w: non-finite values"
    c = pool.counters
    assert (c.worker_deaths, c.restarts, c.rejected) == (0, 0, 0)


def test_a_rejection_of_a_task_the_server_finds_valid_fails_that_task_as_the_workers(served):
    """A hostile or misconfigured worker cannot stop the run by claiming the server's task is bad."""

    def answer(msg, frames):
        if msg["client"] == 0:
            seen = protocol.peek(frames, 1 << 20)
            return [protocol.encode("rejected", reason="oversized", detail="message of 99 bytes", **seen)]
        return [update(0, msg["client"])]

    pool = served(answer)
    replies = pool.run_tasks(0, tasks(0, 1))
    assert replies[0].failure == (
        "worker scripted rejected its task, which the server's own check passes: oversized: message of 99 bytes"
    )
    assert not replies[1].failure
    assert pool.counters.worker_deaths == 0


def test_a_setup_the_worker_rejects_and_the_server_finds_valid_drops_that_worker(served):
    def refuse(msg):
        seen = {"of_type": "setup", "round": None, "client": None, "request": None}
        return [protocol.encode("rejected", reason="version", detail="protocol version 3, expected 4", **seen)]

    pool = served(lambda msg, frames: [], setup=refuse, ready=False)
    deadline = time.monotonic() + QUICK_S
    while not pool.counters.worker_deaths:
        assert time.monotonic() < deadline
        pool._poll(0.1)
    assert pool.counters.death_causes == {"refused": 1} and not pool.workers


def test_a_setup_over_transport_max_message_bytes_stops_the_run_as_the_servers_fault(tmp_path):
    address = f"ipc://{tmp_path}/s.sock"
    pool = WorkerPool(address, load(None, ["transport.max_message_bytes=65536"]).transport)
    t = over_limit_peer(address, 65536)
    try:
        pool.set_up({"seed": 0, "padding": "x" * 70_000})
        with pytest.raises(RejectedByWorker) as e:
            pool.wait_ready(min_workers=1, timeout_s=QUICK_S)
        assert str(e.value).startswith("worker limited rejected the setup: message of ")
        assert str(e.value).endswith(" bytes exceeds the limit of 65536")
        assert pool.counters.worker_deaths == 0
    finally:
        pool.close()
        t.join(timeout=30)


def over_limit_peer(address: str, limit: int) -> threading.Thread:
    """A worker whose --max-message-bytes is `limit`: it rejects the setup as nodes.worker would."""

    def answer(got, frames):
        if not isinstance(got, protocol.ProtocolError):
            return []
        return [protocol.encode("rejected", reason=got.reason, detail=str(got), **protocol.peek(frames, limit))]

    return peer(address, answer, limit=limit, name="limited")


def test_a_stale_reply_frees_its_worker_at_once(served):
    """A valid update tagged with another client took the place of the reply the task was owed."""
    pool = served(lambda msg, frames: [update(0, 5 if msg["client"] == 0 else msg["client"])])
    started = time.monotonic()
    replies = pool.run_tasks(0, tasks(0, 1))
    assert time.monotonic() - started < QUICK_S  # not transport.worker_timeout_s
    assert replies[0].failure == "worker scripted sent a update for round 0 client 5 in reply to this task"
    assert not replies[1].failure and replies[1].message["client"] == 1  # the same worker, free again
    assert pool.counters.reasons == {"stale": 1} and pool.counters.worker_deaths == 0


def test_a_rejection_naming_another_task_is_stale_and_frees_its_worker(served):
    def answer(msg, frames):
        if msg["client"] == 0:
            seen = {"of_type": "task", "round": 7, "client": 0, "request": None}
            return [protocol.encode("rejected", reason="non_finite", detail="model.w: non-finite values", **seen)]
        return [update(0, msg["client"])]

    pool = served(answer)
    replies = pool.run_tasks(0, tasks(0, 1))
    assert replies[0].failure == "worker scripted sent a rejected for round 7 client 0 in reply to this task"
    assert not replies[1].failure and pool.counters.reasons == {"stale": 1}


def test_a_late_reply_to_a_task_that_failed_is_dropped_without_failing_the_next(served):
    """A poisoned reply fails its task; the worker's late reply to that task, read while it holds the next,
    is counted stale and dropped: the next task stands."""

    def answer(msg, frames):
        if msg["client"] == 0:
            bad = {"w": np.full(3, np.nan, np.float32)}
            return [protocol.encode("update", round=0, client=0, model=bad, metrics=METRICS)]
        return [update(0, 0), update(0, msg["client"])]  # the late one first: a worker answers in order

    pool = served(answer)
    replies = pool.run_tasks(0, tasks(0, 1))
    assert replies[0].failure == "bad reply from worker scripted: model.w: non-finite values"
    assert not replies[1].failure and replies[1].message["client"] == 1
    assert pool.counters.reasons == {"non_finite": 1, "stale": 1}


# --- through real runs: a killed run's checkpoint with a NaN model ---------------------------

KILLED = [*FAST, "budget.rounds=12"]


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A 12-round run SIGKILLed once round 5 has its rows (round 4's checkpoint is complete by then), and
    the private directories it left behind in the temporary directory."""
    out = tmp_path_factory.mktemp("killed")
    cmd = [sys.executable, "-m", "emulator", *KILLED, f"output.dir={out}", "output.name=run"]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = out / "run"
    deadline = time.monotonic() + 120
    while not (run_dir / "rounds" / "round-000005.parquet").exists():
        assert server.poll() is None and time.monotonic() < deadline, "the run ended before the kill point"
        time.sleep(0.01)
    server.send_signal(signal.SIGKILL)
    server.wait()
    if not (run_dir / checkpoint.FILE).exists():  # killed between checkpoint.save's two renames
        shutil.copy(run_dir / checkpoint.PREVIOUS, run_dir / checkpoint.FILE)
    left = sorted(Path(tempfile.gettempdir()).glob(f"{PRIVATE_PREFIX}{server.pid}-*"))
    assert len(left) == 1 and {p.name for p in left[0].iterdir()} == {"server.sock", "evaluator.sock"}
    return run_dir, left[0]


def copy_of(killed, tmp_path: Path) -> Path:
    shutil.copytree(killed[0], tmp_path / "run")
    return tmp_path / "run"


def poison(path: Path) -> None:
    """Set the checkpoint's fc.weight[0, 0] to NaN, the rest as it was."""
    weights, state = checkpoint._read(path)
    weights["fc.weight"][0, 0] = np.nan
    blob = np.frombuffer(json.dumps(state).encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **weights, **{checkpoint.STATE_KEY: blob})


def next_round(path: Path) -> int:
    return checkpoint._read(path)[1]["next_round"]


def test_a_nan_checkpoint_falls_back_to_the_previous_one_at_once(killed, tmp_path, caplog):
    run_dir = copy_of(killed, tmp_path)
    poison(run_dir / checkpoint.FILE)
    previous = next_round(run_dir / checkpoint.PREVIOUS)
    started = time.monotonic()
    assert main(["resume", str(run_dir)]) == 0
    assert time.monotonic() - started < QUICK_S
    assert "checkpoint.npz cannot be used (checkpoint.npz: tensor fc.weight: non-finite values (1 of" in caplog.text
    assert f"continuing from checkpoint.prev.npz (round {previous})" in caplog.text
    m = json.loads((run_dir / "run.json").read_text())
    assert m["status"] == "complete" and [r["at_round"] for r in m["resumed"]] == [previous]
    assert len(read_table(run_dir, "rounds")) == 12


def test_with_both_checkpoints_nan_resume_is_one_line_exit_2(killed, tmp_path):
    run_dir = copy_of(killed, tmp_path)
    for name in (checkpoint.FILE, checkpoint.PREVIOUS):
        poison(run_dir / name)
    before = (run_dir / "run.json").read_text()
    out = subprocess.run(
        [sys.executable, "-m", "emulator", "resume", str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(err) == 1, out.stderr
    assert err[0].startswith(f"error: {run_dir}: no usable checkpoint (checkpoint.npz: tensor fc.weight: non-finite")
    assert "checkpoint.prev.npz: tensor fc.weight: non-finite values" in err[0]
    assert (run_dir / "run.json").read_text() == before


# The command line with checkpoint.validate's plausibility check switched off: the NaN model reaches the workers.
UNCHECKED = (
    "import sys; from emulator.output import checkpoint; checkpoint._implausible = lambda a: ''; "
    "from emulator.__main__ import cli; sys.argv[0] = 'emulator'; cli()"
)


def test_a_nan_model_every_worker_rejects_stops_the_run_in_one_line_blaming_no_worker(killed, tmp_path):
    """What a NaN checkpoint did before checkpoint.validate refused it: each worker dropped its task, and the
    server waited out transport.worker_timeout_s (600 s) per attempt and ended blaming the workers."""
    run_dir = copy_of(killed, tmp_path)
    poison(run_dir / checkpoint.FILE)
    resumed_at = next_round(run_dir / checkpoint.FILE)
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", UNCHECKED, "resume", str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert time.monotonic() - started < QUICK_S
    err = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(err) == 1, out.stderr
    line = f"round {resumed_at}: worker local-[01].0 rejected the task: model.fc.weight: non-finite values"
    assert re.fullmatch(f"error: {line}", err[0]), err
    m = json.loads((run_dir / "run.json").read_text())
    assert m["status"] == "failed" and re.fullmatch(f"RejectedByWorker: {line}", m["error"]), m["error"]
    t = m["transport"]
    assert (t["worker_deaths"], t["restarts"], t["rejected"]) == (0, 0, 0)


# --- the evaluator --------------------------------------------------------------------------


def test_a_model_the_evaluator_rejects_fails_the_run_in_one_line_at_once():
    cfg = load(None, ["clients.n=4"])
    sock_dir = tempfile.mkdtemp(prefix="dpfl-test-", dir="/tmp")  # an ipc path is at most 107 bytes
    evaluator = EvaluatorProcess(f"ipc://{sock_dir}/evaluator.sock", cfg.transport.max_message_bytes)
    pool = WorkerPool(f"ipc://{sock_dir}/server.sock", cfg.transport)
    try:
        evaluator.proc = pool.start(0, evaluator.args())
        initial = evaluator.set_up(to_dict(cfg)).result(timeout=120)
        bad = {k: np.full_like(v, np.inf) if k == "fc.bias" else v for k, v in initial.items()}
        started = time.monotonic()
        with pytest.raises(EvaluatorError) as e:
            evaluator.evaluate(3, bad).result(timeout=QUICK_S)
        assert time.monotonic() - started < QUICK_S
        assert str(e.value) == "round 3: the evaluator rejected the server's evaluate: model.fc.bias: non-finite values"
        with pytest.raises(EvaluatorError, match=r"^round 3: the evaluator rejected"):  # and every evaluation after
            evaluator.evaluate(4, initial).result(timeout=QUICK_S)
        assert evaluator.deaths() == []
    finally:
        pool.close()
        evaluator.close()
        shutil.rmtree(sock_dir)


# --- the private directories of servers that were SIGKILLed ---------------------------------


def test_a_sigkilled_servers_private_directory_is_swept_at_the_next_start_and_no_live_ones(killed, tmp_path):
    dead_dir = killed[1]
    dead_pid = int(dead_dir.name.split("-")[1])
    tmp = Path(tempfile.gettempdir())
    ours = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-"))  # a live server's (this process)
    (ours / "server.sock").touch()
    # a dead pid here, but a socket someone serves on: a server in another pid namespace sharing the directory
    elsewhere = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{dead_pid}-"))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(elsewhere / "server.sock"))
    listener.listen()
    old, fresh = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX)), Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX))
    os.utime(old, (time.time() - SETTLED_S - 5,) * 2)  # an older version's, without a pid, settled
    other = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{dead_pid}-"))
    (other / "results.txt").touch()  # not a server's: only sockets are ever in one
    made = ""
    try:
        made = private_dir()  # what a run's start calls
        assert Path(made).parent == tmp and Path(made).name.startswith(f"{PRIVATE_PREFIX}{os.getpid()}-")
        assert not dead_dir.exists() and not old.exists()
        assert ours.exists() and elsewhere.exists() and fresh.exists() and other.exists()
    finally:
        listener.close()
        for d in (ours, elsewhere, fresh, other, made):
            if d:
                shutil.rmtree(d, ignore_errors=True)

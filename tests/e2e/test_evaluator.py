"""The server's evaluator process (nodes/transport/evaluator.py): the initial model the seed gives, the global
model's evaluation bit for bit as in one process, and a failed evaluation or a dead evaluator as an
error naming it, never a number."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch

from emulator.config import load
from nodes.contracts import protocol
from nodes.contracts.schema import to_dict
from nodes.data import load_federated
from nodes.training.models import build_model, loss_fn
from nodes.training.trainer import evaluate, load_numpy_state, state_to_numpy, tensors
from nodes.transport.evaluator import HEARTBEAT_S, EvaluatorError, EvaluatorProcess
from nodes.transport.pool import WorkerPool

SCENARIO = ["clients.n=4", "model.name=mlp", "dp.batch_eval=7"]


@pytest.fixture
def started(tmp_path):
    """A pool with one worker and the evaluator, started as a run starts them, and the scenario."""
    cfg = load(None, SCENARIO)
    sock_dir = tempfile.mkdtemp(prefix="dpfl-test-", dir="/tmp")  # an ipc path is at most 107 bytes
    evaluator = EvaluatorProcess(f"ipc://{sock_dir}/evaluator.sock", cfg.transport.max_message_bytes)
    pool = WorkerPool(f"ipc://{sock_dir}/server.sock", cfg.transport)
    try:
        evaluator.proc = pool.start(1, evaluator.args())
        yield cfg, evaluator
    finally:
        pool.close()
        evaluator.close()
        shutil.rmtree(sock_dir)


def test_the_evaluator_builds_the_seeds_model_and_evaluates_as_one_process_would(started):
    cfg, evaluator = started
    initial = evaluator.set_up(to_dict(cfg)).result(timeout=60)
    data = load_federated(cfg.data, cfg.clients.n, cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.seed)
    expected = state_to_numpy(model)
    assert initial.keys() == expected.keys() and all(np.array_equal(initial[k], expected[k]) for k in expected)

    weights = {
        k: v + np.float32(0.01) * np.arange(v.size, dtype=np.float32).reshape(v.shape) for k, v in expected.items()
    }
    load_numpy_state(model, weights)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the evaluator (a worker's one thread on a CPU)
    try:
        here = evaluate(model, *tensors(data.test()), cfg.dp.batch_eval, loss_fn(cfg.model.name))
    finally:
        torch.set_num_threads(threads)
    assert evaluator.evaluate(0, weights).result(timeout=60) == here  # bit for bit
    assert evaluator.evaluate(0, expected).result(timeout=60) != here  # it evaluates what it is sent


def in_one_process(cfg, weights, test) -> tuple[float, float]:
    """`weights`' evaluation on `test` as the evaluator makes it: one thread, the scenario's batch."""
    data = load_federated(cfg.data, cfg.clients.n, cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.seed)
    load_numpy_state(model, weights)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return evaluate(model, *tensors(test), cfg.dp.batch_eval, loss_fn(cfg.model.name))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("fits", [True, False])
def test_the_evaluator_takes_the_test_set_the_server_hands_it_when_it_fits_the_message_limit(started, fits):
    """The server's drawn test set (nodes.data.federated.ServerData) is the one evaluated; one that would
    make the set-up message over transport.max_message_bytes is not sent: the evaluator builds its own."""
    cfg, evaluator = started
    x, y = load_federated(cfg.data, cfg.clients.n, cfg.seed).test()
    handed = (x + np.float32(1), y)  # not the evaluator's own: which one it used shows
    if not fits:  # room for the replies (the initial model), not for the header beside the test set
        evaluator.max_bytes = x.nbytes + y.nbytes
    initial = evaluator.set_up(to_dict(cfg), handed).result(timeout=60)
    expected = in_one_process(cfg, initial, handed if fits else (x, y))
    assert evaluator.evaluate(0, initial).result(timeout=60) == expected  # bit for bit
    assert expected != in_one_process(cfg, initial, (x, y) if fits else handed)


def test_a_failed_evaluation_is_an_error_naming_it_and_the_evaluator_serves_on(started):
    cfg, evaluator = started
    initial = evaluator.set_up(to_dict(cfg)).result(timeout=60)
    wrong = {k: np.zeros((3, 3), np.float32) for k in initial}
    with pytest.raises(
        EvaluatorError, match=r"(?s)the global model's evaluation failed: RuntimeError: .*size mismatch"
    ):
        evaluator.evaluate(0, wrong).result(timeout=60)
    loss, accuracy = evaluator.evaluate(0, initial).result(timeout=60)
    assert np.isfinite(loss) and 0.0 <= accuracy <= 1.0


def test_an_evaluator_that_dies_is_an_error_not_a_wait(started):
    cfg, evaluator = started
    initial = evaluator.set_up(to_dict(cfg)).result(timeout=60)
    assert evaluator.proc is not None
    pid = evaluator.proc.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(
        EvaluatorError,
        match=r"^the evaluator process ended \(exit -9\) before its evaluation, for round 0: "
        r"not restarted \(transport.max_restarts = 0\)$",
    ):
        evaluator.evaluate(0, initial).result(timeout=60)


def kill(evaluator: EvaluatorProcess) -> int:
    """SIGKILL the evaluator's current process; its pid."""
    assert evaluator.proc is not None and evaluator.proc.pid is not None
    os.kill(evaluator.proc.pid, signal.SIGKILL)
    return evaluator.proc.pid


def test_an_evaluator_that_dies_is_restarted_answers_alike_and_its_restarts_are_capped(started):
    cfg, evaluator = started
    evaluator.max_restarts = 1
    initial = evaluator.set_up(to_dict(cfg)).result(timeout=60)
    first = evaluator.evaluate(0, initial).result(timeout=60)
    killed = kill(evaluator)
    assert evaluator.evaluate(1, initial).result(timeout=60) == first  # set up again and asked again
    (death,) = evaluator.deaths()
    assert {k: v for k, v in death.items() if k != "time"} == {
        "process": "evaluator.0",
        "pid": killed,
        "exit": -9,
        "signal": "SIGKILL",
        "round": 1,
        "restarted": True,
    }
    assert evaluator.pids().keys() == {"evaluator.0", "evaluator.1"} and evaluator.pids()["evaluator.0"] == killed
    kill(evaluator)
    spent = (
        r"^the evaluator process ended \(exit -9\) before its evaluation, for round 2: "
        r"not restarted \(transport.max_restarts = 1, all spent\)$"
    )
    for rnd in (2, 3):  # and every evaluation after it, without another death recorded
        with pytest.raises(EvaluatorError, match=spent):
            evaluator.evaluate(rnd, initial).result(timeout=60)
    assert [(d["process"], d["round"], d["restarted"]) for d in evaluator.deaths()] == [
        ("evaluator.0", 1, True),
        ("evaluator.1", 2, False),
    ]


def test_a_restarted_evaluator_must_build_the_first_ones_initial_model(started):
    cfg, evaluator = started
    evaluator.max_restarts = 1
    initial = evaluator.set_up(to_dict(cfg)).result(timeout=60)
    evaluator._setup = protocol.encode(  # what a restart sets up with, as if its seed had changed
        "evaluator_setup", scenario=to_dict(load(None, [*SCENARIO, "seed=1"])), heartbeat_s=HEARTBEAT_S, test={}
    )
    kill(evaluator)
    with pytest.raises(EvaluatorError, match=r"^the restarted evaluator evaluator\.1's initial model differs"):
        evaluator.evaluate(0, initial).result(timeout=60)


def test_an_evaluator_that_cannot_be_restarted_is_an_error_saying_why(started, monkeypatch):
    cfg, evaluator = started
    evaluator.max_restarts = 1
    initial = evaluator.set_up(to_dict(cfg)).result(timeout=60)

    def cannot_fork(args):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr("nodes.transport.evaluator.start_evaluator", cannot_fork)
    kill(evaluator)
    with pytest.raises(EvaluatorError) as e:
        evaluator.evaluate(4, initial).result(timeout=60)
    assert str(e.value) == (
        "the evaluator process ended (exit -9) before its evaluation, for round 4: "
        "its restart failed: [Errno 11] Resource temporarily unavailable"
    )
    assert [(d["round"], d["restarted"]) for d in evaluator.deaths()] == [(4, False)]


def test_an_evaluator_asked_to_exit_exits_by_itself_and_close_then_waits_for_it(started):
    """A run's end asks it before it shuts the workers down, so that their exits overlap."""
    cfg, evaluator = started
    evaluator.set_up(to_dict(cfg)).result(timeout=60)
    evaluator.ask_to_exit()
    assert evaluator.proc is not None and evaluator.proc.wait(timeout=60) == 0  # its own exit, not a kill
    evaluator.ask_to_exit()  # asking again does nothing
    evaluator.close()
    assert evaluator.deaths() == []


def test_closing_ends_a_wait_for_an_evaluator_that_never_answers(tmp_path):
    sock_dir = tempfile.mkdtemp(prefix="dpfl-test-", dir="/tmp")
    try:
        evaluator = EvaluatorProcess(f"ipc://{sock_dir}/evaluator.sock", 2**20)  # no process: nobody says hello
        initial = evaluator.set_up({"seed": 0})
        evaluator.close()
        with pytest.raises(EvaluatorError, match="the run ended before the evaluator's hello"):
            initial.result(timeout=5)
    finally:
        shutil.rmtree(sock_dir)


def test_an_evaluator_that_never_set_up_fails_every_evaluation_with_why(tmp_path):
    """Whether or not anyone reads the initial model's Future (a run adopts a worker's)."""
    sock_dir = tempfile.mkdtemp(prefix="dpfl-test-", dir="/tmp")
    try:
        evaluator = EvaluatorProcess(f"ipc://{sock_dir}/evaluator.sock", 2**20)
        evaluator.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"])  # ends before its hello
        evaluator.set_up({"seed": 0})
        for _ in range(2):
            with pytest.raises(EvaluatorError, match=r"the evaluator process ended \(exit 4\) before its hello"):
                evaluator.evaluate(0, {}).result(timeout=30)
        evaluator.close()
    finally:
        shutil.rmtree(sock_dir)

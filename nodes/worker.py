"""Worker process: hosts any of the run's logical clients and trains them on request; or, with
--evaluator, the server's evaluator (nodes/transport/evaluator.py), which builds the initial model and
evaluates the global model on the test set.

    python -m nodes.worker --connect tcp://SERVER:PORT [--id NAME] [--keys DIR]

A worker needs nothing but the server's address (and, unless the server listens on an ipc://
socket in a private directory, a keys directory from `python -m emulator keygen`): the server
sends the resolved scenario in its `setup` reply, and the worker rebuilds the same model and,
client by client as their tasks come, the same data from the seed. Workers the server starts
itself get the run's keys in their environment.

The main thread trains; a network thread owns the socket. It sends a heartbeat every
`heartbeat_s` (set by the server), training or not, so the server can tell a slow worker
from a dead one, and it ends the process at once when the server says shutdown, when the
server process is gone (local workers), or, with status 3, when the CURVE handshake fails or a
peer that accepted the connection has not completed it within HANDSHAKE_S. A --keys directory
that others could read or change is refused before connecting (status 3 too).

A worker started by hand says on stderr what it is doing: waiting (every WAITING_NOTICE_S
until the server answers), connected, serving, done; a refused handshake stays one line. Local workers stay quiet:
the server that started them reports on them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import queue
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from nodes.contracts import protocol, rng
from nodes.contracts.codecs import CodecLoadError, load_codec, round_trip
from nodes.contracts.keys import (
    SERVER_PUBLIC,
    WORKER_NEEDS,
    address_problem,
    is_ipv6,
    load_worker_keys,
    missing_keys,
    unprotected_keys,
    worker_keys_from_env,
)
from nodes.contracts.protocol import Message, MessageType, ProtocolError
from nodes.contracts.schema import NO_COMPRESSION, CompressionConfig

if TYPE_CHECKING:
    import torch

    from nodes.contracts.schema import Scenario
    from nodes.training.bundle import BundleTrainer
    from nodes.training.trainer import Trainer

HANDSHAKE_EVENTS = (
    zmq.EVENT_CONNECTED  # a peer accepted the connection: from here its handshake is timed
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
REFUSED_EXIT = 3  # exit status when the CURVE handshake with the server fails, or the keys are unprotected
# A handshake cut short without a reason: what a wrong server key looks like from here (the
# server cannot read our hello and hangs up). Once could be a connection lost; this many is not.
CUT_SHORT_LIMIT = 3
WAITING_NOTICE_S = 10.0  # how often a worker the server has not answered yet says it is still waiting
# A live server's handshake is moments of its I/O thread and of its authenticator thread: a peer that
# accepts and stays silent this long (a stopped process, another service) is not serving. Under
# WAITING_NOTICE_S, so that such a worker's stderr is one line.
HANDSHAKE_S = 5.0
WORKER_TAKES = (
    MessageType.TASK,
    MessageType.TASK_RESIDUAL,
    MessageType.BUNDLE,
)  # after its setup; all else is answered with `rejected`
DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?")  # what --device takes: the devices nodes.training.dp_step has rules for


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nodes.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--connect", required=True, help="server address, e.g. tcp://10.0.0.5:5555 or ipc:///tmp/x")
    ap.add_argument("--id", default=f"{socket.gethostname()}-{os.getpid()}", help="worker name (unique per run)")
    ap.add_argument("--keys", default="", help="CURVE keys directory (server.key + client.key_secret, from keygen)")
    ap.add_argument("--parent", type=int, default=0, help="exit when this process id is gone (local workers)")
    ap.add_argument("--max-message-bytes", type=int, default=256 * 2**20)
    ap.add_argument("--evaluator", action="store_true", help="be the server's evaluator process (the server starts it)")
    ap.add_argument("--device", default="", help="train on this torch device, e.g. cuda:1 (default: the scenario's)")
    args = ap.parse_args(argv)
    problem = connect_problem(args.connect)
    if problem:
        print(f"error: --connect {args.connect}: {problem}", file=sys.stderr)
        return 2
    if args.device and not DEVICE.fullmatch(args.device):
        print(f"error: --device {args.device[:80]}: expected cpu, cuda or cuda:N", file=sys.stderr)
        return 2
    if args.parent:  # Ctrl-C, or a scheduler's SIGTERM, reaches the whole process group: the server shuts us down
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # the evaluator's socket is an ipc:// file in the server's private directory: no CURVE there
    keys = None if args.evaluator else worker_keys_from_env()
    if args.keys:
        missing = missing_keys(args.keys, WORKER_NEEDS)
        if missing:
            print(
                f"error: --keys {args.keys}: missing {', '.join(missing)} (python -m emulator keygen DIR)",
                file=sys.stderr,
            )
            return 2
        problem = unprotected_keys(args.keys, WORKER_NEEDS)
        if problem:  # keys others could read or replace are as good as wrong ones
            print(f"error: --keys {args.keys}: {problem}", file=sys.stderr)
            return REFUSED_EXIT
        keys = load_worker_keys(args.keys)
    link = Link(args, keys)
    link.start()
    # torch loads while the hello waits for the server's setup, which then only builds the model:
    # clients' data are built as their tasks come (Opacus only on the hooks path)
    import_training()

    try:
        (serve_evaluations if args.evaluator else serve)(args.id, link, args.device)
    except KeyboardInterrupt:
        return 130
    return 0


def import_training() -> None:
    """torch and the trainer (a no-op in a worker forked from nodes.transport.zygote, which imported them), with
    the collector off while importing, as in the zygote (collections of objects that all live on are
    wasted: python -m bench --only startup); on afterwards."""
    gc.disable()
    from nodes.training import dp_step, trainer  # noqa: F401

    gc.enable()


def connect_problem(address: str) -> str:
    """'' if ZeroMQ can connect to `address`; else why not, in words (not a ZMQError traceback)."""
    hint = f" (did you mean tcp://{address}?)" if ":" in address and "://" not in address else ""
    problem = address_problem(address)
    return problem + hint if problem else ""


def serve(name: str, link: Link, device: str = "") -> None:
    """Set up on `setup` (on `device`, '': the scenario's), train on `task` (or `bundle`: nodes.training.bundle);
    answer anything else, a task before the setup, or a setup naming a codec this worker cannot import or
    failing in any other way, with `rejected`. The network thread ends the process."""
    trainer: Trainer | None = None
    bundler: BundleTrainer | None = None
    codec = CompressionConfig()
    wire_log: str | None = None
    while True:
        msg = link.inbox.get()
        kind = msg["type"]
        if kind == MessageType.SETUP:
            try:
                trainer, codec = _setup(msg["scenario"], device)
            except CodecLoadError as e:  # a user's codec this worker cannot import: it cannot serve the run
                link.reject(msg, "unknown_codec", str(e))
                continue
            except Exception as e:  # its data or device cannot be set up here: said once, not a crash to restart
                link.reject(msg, "setup_failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                continue
            bundler = None
            wire_log = msg["wire_log"] or None
            link.send(protocol.encode(MessageType.READY, worker=name, model=trainer.weights()))
            link.say("serving: data and model built, waiting for tasks")
        elif kind not in WORKER_TAKES:
            link.reject(msg, "unexpected_type", f"{kind} is not a message a worker takes")
        elif trainer is None:
            link.reject(msg, "not_set_up", f"{kind} before the setup")
        else:
            if kind == MessageType.BUNDLE:
                bundler = bundler or _bundler(trainer)
                replies = _train_bundle(bundler, msg, codec)
            else:
                replies = [(msg["client"], _train(trainer, msg, codec))]
            link.tasks_done += len(replies)
            for i, (client, reply) in enumerate(replies):
                if wire_log:  # before sending: the server may shut us down as soon as it has the reply
                    # a bundle's bytes on its first client's line: the lines of a round sum to what crossed
                    _log_wire(wire_log, msg["round"], client, name, msg["nbytes"] if i == 0 else 0, len(reply))
                link.send(reply)


def _log_wire(path: str, rnd: int, client: int, worker: str, received: int, sent: int) -> None:
    with open(path, "a") as f:
        f.write(
            json.dumps({"round": rnd, "client": client, "worker": worker, "received": received, "sent": sent}) + "\n"
        )


def serve_evaluations(name: str, link: Link, device_name: str = "") -> None:
    """The server's evaluator (--evaluator): on `evaluator_setup` build the model and take the test set
    (the server's, else built here) and answer with the initial model, on `evaluate` with the weights'
    (loss, accuracy) or the error; anything else, or an evaluate before the setup, with `rejected`."""
    evaluation = None
    while True:
        msg = link.inbox.get()
        if msg["type"] == MessageType.EVALUATOR_SETUP:
            cfg, device = _configured(msg["scenario"], device_name)
            from nodes.data import load_federated
            from nodes.training.trainer import GlobalEvaluation

            test = msg["test"]  # read-only arrays over the message's frames: copied, as torch takes them
            evaluation = GlobalEvaluation(
                load_federated(cfg.data, cfg.clients.n, cfg.seed),
                device,
                model=cfg.model,
                seed=cfg.seed,
                batch_eval=cfg.dp.batch_eval,
                test=(np.array(test["x"]), np.array(test["y"])) if test else None,
            )
            link.send(protocol.encode(MessageType.READY, worker=name, model=evaluation.initial))
        elif msg["type"] != MessageType.EVALUATE:
            link.reject(msg, "unexpected_type", f"{msg['type']} is not a message the evaluator takes")
        elif evaluation is None:
            link.reject(msg, "not_set_up", "evaluate before the evaluator_setup")
        else:
            loss, accuracy, error = math.nan, math.nan, ""
            try:
                loss, accuracy = evaluation(msg["model"])
            except Exception as e:  # the server fails the run with it
                error = f"{type(e).__name__}: {e}"
            link.send(
                protocol.encode(
                    MessageType.EVALUATION, request=msg["request"], loss=loss, accuracy=accuracy, error=error
                )
            )


class Link(threading.Thread):
    """The network thread: DEALER socket to the server, heartbeats, and the process's exit."""

    def __init__(self, args: argparse.Namespace, keys: tuple[bytes, bytes, bytes] | None) -> None:
        super().__init__(name="link", daemon=True)
        self.args, self.keys = args, keys
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()  # decoded server messages, for the main thread
        self.ctx = zmq.Context()
        pipe = f"inproc://outbox-{id(self)}"
        self._outbox = self.ctx.socket(zmq.PAIR)  # the network thread's end
        self._outbox.bind(pipe)
        self._main_end = self.ctx.socket(zmq.PAIR)  # the main thread's end: replies to send
        self._main_end.connect(pipe)
        self.heartbeat_s = 0.0  # 0 until setup says how often
        self.cut_short = 0  # handshakes in a row the server ended without a reason
        self.connected_at = 0.0  # when the current connection's peer accepted it (monotonic)
        self.tasks_done = 0  # counted by the main thread, told at the end
        self.answered = False  # the server's setup has arrived

    def say(self, what: str) -> None:
        """One line on stderr about the worker's state, for a worker started by hand."""
        if not self.args.parent:
            print(f"worker {self.args.id}: {what}", file=sys.stderr, flush=True)

    def send(self, message: Message) -> None:
        """Queue a message for the server (main thread only). Its tensor frames are not copied:
        they are the arrays of a model the trainer made for this reply and never writes again."""
        self._main_end.send_multipart(message.frames, copy=False)

    def reject(self, msg: dict[str, Any], reason: str, detail: str) -> None:
        """Answer a decoded server message this process does not take (main thread only): `rejected`."""
        said = {k: msg.get(k) for k in ("round", "client", "request")}
        if said["client"] is None and msg.get("clients"):  # a bundle: its first client's
            said["client"] = msg["clients"][0]
        self.say(f"rejected message: {detail}")
        self.send(protocol.encode(MessageType.REJECTED, reason=reason, detail=detail, of_type=msg["type"], **said))

    def run(self) -> None:
        try:
            self._serve()
        except BaseException:  # without this thread the worker would wait forever: end it
            traceback.print_exc()
            _exit(1)

    def _serve(self) -> None:
        a = self.args
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, a.id.encode())
        dealer.setsockopt(zmq.LINGER, 1000)
        dealer.setsockopt(zmq.IPV6, is_ipv6(a.connect))
        dealer.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_S * 1000))
        if self.keys:
            dealer.curve_publickey, dealer.curve_secretkey, dealer.curve_serverkey = self.keys
        monitor = dealer.get_monitor_socket(HANDSHAKE_EVENTS)
        dealer.connect(a.connect)
        dealer.send_multipart(protocol.encode(MessageType.HELLO, worker=a.id, pid=os.getpid()).frames)
        poller = zmq.Poller()
        for sock in (dealer, self._outbox, monitor):
            poller.register(sock, zmq.POLLIN)
        next_beat = 0.0
        connected_at = time.monotonic()
        next_notice = connected_at + WAITING_NOTICE_S
        while True:
            wait = min(1.0, max(0.0, next_beat - time.monotonic())) if self.heartbeat_s else 1.0
            for sock, _ in poller.poll(int(wait * 1000)):
                if sock is dealer:
                    self._receive(dealer, [f.buffer for f in dealer.recv_multipart(copy=False)])
                elif sock is self._outbox:  # inproc hands the frames over without a copy
                    dealer.send_multipart(self._outbox.recv_multipart(copy=False), copy=False)
                else:
                    self._handshake_event(recv_monitor_message(monitor))
            if self.heartbeat_s and time.monotonic() >= next_beat:
                # never block on a heartbeat: one the server is not reading is useless anyway
                with contextlib.suppress(zmq.Again):
                    dealer.send_multipart(protocol.encode(MessageType.HEARTBEAT).frames, flags=zmq.NOBLOCK)
                next_beat = time.monotonic() + self.heartbeat_s
            if a.parent and not _alive(a.parent):
                _exit(0)  # the server is gone: never linger as an orphan
            if not self.answered and time.monotonic() >= next_notice:  # ZeroMQ retries silently: say so
                self.say(
                    f"waiting for the server at {a.connect} (no answer for "
                    f"{time.monotonic() - connected_at:.0f} s; is it running at that address?)"
                )
                next_notice += WAITING_NOTICE_S

    def _handshake_event(self, event: Mapping[str, object]) -> None:
        """A failed or stalled handshake never heals: say why in one line and exit 3, not hang."""
        kind = event["event"]
        if kind == zmq.EVENT_CONNECTED:
            self.connected_at = time.monotonic()
            return
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.cut_short = 0
            return
        # a cut-short handshake ends moments after the connection, a timed-out one HANDSHAKE_S after:
        # half tells them apart even when this thread reads both events late
        stalled = time.monotonic() - self.connected_at >= HANDSHAKE_S / 2
        if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and not stalled:
            self.cut_short += 1
            if self.cut_short < CUT_SHORT_LIMIT:
                return
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            why = "refused this worker's key (CURVE authentication failed; its public key is not authorized)"
        elif stalled:
            why = (
                f"accepted the connection but did not complete the handshake within {HANDSHAKE_S:.0f} s "
                "(is a dpfl server listening there, and is it running?)"
            )
        elif not self.keys:
            why = "requires CURVE keys: start the worker with --keys DIR (python -m emulator keygen DIR)"
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            why = "does not use CURVE keys (an ipc:// socket in a private directory): start the worker without --keys"
        else:
            why = (
                f"ended the CURVE handshake {self.cut_short} times: the keys directory holds another server's "
                f"public key ({SERVER_PUBLIC}), or the server uses no keys"
            )
        _exit(REFUSED_EXIT, f"worker {self.args.id}: the server at {self.args.connect} {why}")

    def _receive(self, dealer: zmq.Socket[Any], frames: list[memoryview]) -> None:
        """A server message, decoded, for the main thread; one that does not decode is answered at once
        with `rejected`, naming why and what could be read of it: never dropped in silence, which would
        leave the server waiting out transport.worker_timeout_s for a reply that is not coming."""
        try:
            msg = protocol.decode(frames, self.args.max_message_bytes)
        except ProtocolError as e:
            self.say(f"rejected message: {e}")  # the server reports it, in one line
            seen = protocol.peek(frames, self.args.max_message_bytes)
            dealer.send_multipart(protocol.encode(MessageType.REJECTED, reason=e.reason, detail=str(e), **seen).frames)
            return
        if msg["type"] == MessageType.SHUTDOWN:
            self.say(f"done: the server ended the run ({self.tasks_done} tasks trained)")
            _exit(0)
        if msg["type"] in (MessageType.SETUP, MessageType.EVALUATOR_SETUP):
            self.heartbeat_s = float(msg["heartbeat_s"])
            self.answered = True
            scenario = msg["scenario"]
            self.say(
                f"connected to {self.args.connect}: run {scenario.get('name')!r}, seed {scenario.get('seed')}; "
                "building data and model"
            )
        msg["nbytes"] = sum(f.nbytes for f in frames)
        self.inbox.put(msg)


def _exit(code: int, message: str = "") -> None:
    """End the whole process from the network thread: workers hold nothing worth saving."""
    if message:
        print(message, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _setup(scenario: dict[str, Any], device_name: str = "") -> tuple[Trainer, CompressionConfig]:
    """The scenario's trainer, and how this worker encodes updates (its `compression` section, whose codec
    it imports first where it is a user's: CodecLoadError if it cannot)."""
    from nodes.data import load_federated
    from nodes.training.trainer import build_trainer

    cfg, device = _configured(scenario, device_name)
    load_codec(cfg.compression.kind)
    return build_trainer(cfg, load_federated(cfg.data, cfg.clients.n, cfg.seed), device), cfg.compression


def _configured(scenario: dict[str, Any], device_name: str = "") -> tuple[Scenario, torch.device]:
    """The scenario, and torch set up for it in this process (set_up_torch) on its device: `device_name`,
    where the server placed this process, else the scenario's."""

    from nodes.contracts.schema import from_dict
    from nodes.training.determinism import set_up_torch
    from nodes.training.trainer import resolve_device

    cfg = from_dict(scenario)
    device = resolve_device(device_name or cfg.device)
    set_up_torch(device)
    return cfg, device


def _train(trainer: Trainer, msg: dict[str, Any], codec: CompressionConfig) -> Message:
    from nodes.contracts.tasks import ClientTask

    rnd, client = msg["round"], msg["client"]
    try:
        task = ClientTask.from_wire(msg["params"])
        # msg["model"]: read-only arrays over the received frames, which the trainer copies into its model
        weights, metrics = trainer.train(rnd, task, msg["model"])
        return _update(codec, trainer.seed, msg, weights, metrics)
    except Exception as e:  # reported to the server as this client's failure; the worker lives on
        return _failure(rnd, client, e)


def _update(
    codec: CompressionConfig, seed: int, task: dict[str, Any], weights: dict[str, Any], metrics: dict[str, Any]
) -> Message:
    """The reply to `task` (its round, client and global model) once trained: the model, or its compressed update."""
    if codec.kind == NO_COMPRESSION:
        return protocol.encode(
            MessageType.UPDATE, round=task["round"], client=task["client"], model=weights, metrics=metrics
        )
    return compressed_update(codec, seed, task, weights, metrics)


def _failure(rnd: int, client: int, e: Exception) -> Message:
    return protocol.encode(MessageType.ERROR, round=rnd, client=client, message=f"{type(e).__name__}: {e}")


def _bundler(trainer: Trainer) -> BundleTrainer:
    from nodes.training.bundle import BundleTrainer

    return BundleTrainer(trainer)


def _train_bundle(bundler: BundleTrainer, msg: dict[str, Any], codec: CompressionConfig) -> list[tuple[int, Message]]:
    """A `bundle` message's clients trained as one computation (nodes.training.bundle): each client's reply,
    in order."""
    from nodes.contracts.tasks import ClientTask

    rnd, clients, model = msg["round"], msg["clients"], msg["model"]
    tasks: list[ClientTask | Exception] = []
    for params in msg["params"]:
        try:
            tasks.append(ClientTask.from_wire(params))
        except Exception as e:  # this client's failure
            tasks.append(e)
    valid = [t for t in tasks if isinstance(t, ClientTask)]
    trained = iter(bundler.train(rnd, valid, model))
    replies = []
    for client, task in zip(clients, tasks):
        outcome = next(trained) if isinstance(task, ClientTask) else task
        try:
            if isinstance(outcome, Exception):
                raise outcome
            weights, metrics = outcome
            task_msg = {"round": rnd, "client": client, "model": model}
            reply = _update(codec, bundler.trainer.seed, task_msg, weights, metrics)
        except Exception as e:  # reported to the server as this client's failure, as at K = 1
            reply = _failure(rnd, client, e)
        replies.append((client, reply))
    return replies


def compressed_update(
    codec: CompressionConfig, seed: int, task: dict[str, Any], weights: dict[str, Any], metrics: dict[str, Any]
) -> Message:
    """The update w_i - w of the trained `weights` (after any DP noise: post-processing), plus the task's
    residual under error feedback, in `codec`'s parts, with the next residual (emulator.aggregate.compression).
    qsgd draws from the (seed, "compression", round, client) stream: no result depends on the worker."""
    rnd, client, model = task["round"], task["client"], task["model"]
    residual = task.get("residual") or {}
    if residual and (residual.keys() != model.keys() or any(residual[k].shape != model[k].shape for k in model)):
        raise ValueError("the task's residual does not match the model")
    update = {k: weights[k] - model[k] + residual[k] if residual else weights[k] - model[k] for k in model}
    parts, decoded = round_trip(codec, update, rng.stream(seed, "compression", rnd, client))
    return protocol.encode(
        MessageType.COMPRESSED,
        round=rnd,
        client=client,
        codec=protocol.codec_fields(codec),
        shapes=[[k, list(v.shape)] for k, v in update.items()],
        parts=parts,
        residual={k: update[k] - decoded[k] for k in update} if codec.error_feedback else {},
        metrics=metrics,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def cli(argv: list[str] | None = None) -> NoReturn:
    """`python -m nodes.worker`, the `dpfl-worker` script, and a worker forked by nodes.transport.zygote: it
    never returns (a forked worker must not run on in the zygote's loop)."""
    code = 1
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's --help and usage errors
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter teardown: torch's exit hooks import its compiler stack (seconds),
        # and the socket is closed and every file written by now.
        os._exit(code)


if __name__ == "__main__":
    cli()

"""Worker process: hosts any of the run's logical clients and trains them on request.

    python -m nodes.worker --connect tcp://SERVER:PORT [--id NAME]

A worker needs nothing but the server's address: the server sends the resolved scenario
in its `setup` reply, and the worker rebuilds the same data and model from the seed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys

import zmq

from nodes import protocol
from nodes.protocol import ProtocolError, pack_tensors, unpack_tensors

# Fault injection for the test-suite: "ROUND:CLIENT" makes this process SIGKILL itself
# when it receives that task, exactly as if the OS had killed it mid-round.
KILL_AT_ENV = "DPFL_FAULT_KILL_AT"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nodes.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--connect", required=True, help="server address, e.g. tcp://10.0.0.5:5555 or ipc:///tmp/x")
    ap.add_argument("--id", default=f"{socket.gethostname()}-{os.getpid()}", help="worker name (unique per run)")
    ap.add_argument("--parent", type=int, default=0, help="exit when this process id is gone (local workers)")
    ap.add_argument("--max-message-bytes", type=int, default=256 * 2**20)
    args = ap.parse_args(argv)

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, args.id.encode())
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(args.connect)
    sock.send(protocol.encode("hello", worker=args.id, pid=os.getpid()))
    kill_at = os.environ.get(KILL_AT_ENV, "")
    trainer, wire_log = None, None
    try:
        while True:
            if not sock.poll(1000):
                if args.parent and not _alive(args.parent):
                    return 0  # the server is gone: never linger as an orphan
                continue
            frame = sock.recv()
            try:
                msg = protocol.decode(frame, args.max_message_bytes)
            except ProtocolError as e:
                print(f"worker {args.id}: rejected message: {e}", file=sys.stderr)
                continue
            kind = msg["type"]
            if kind == "shutdown":
                return 0
            if kind == "setup":
                trainer = _setup(msg["scenario"])
                wire_log = msg.get("wire_log") or None
                sock.send(protocol.encode("ready", worker=args.id))
            elif kind == "task" and trainer is not None:
                rnd, client = msg["round"], msg["client"]
                if kill_at == f"{rnd}:{client}":
                    os.kill(os.getpid(), signal.SIGKILL)
                reply = _train(trainer, msg)
                sock.send(reply)
                if wire_log:
                    with open(wire_log, "a") as f:
                        f.write(json.dumps({"round": rnd, "client": client, "worker": args.id,
                                            "received": len(frame), "sent": len(reply)}) + "\n")
    finally:
        sock.close(linger=1000)
        ctx.term()


def _setup(scenario: dict):
    import torch

    from emulator.config import from_dict
    from nodes.data import load_federated
    from nodes.trainer import Trainer, resolve_device

    cfg = from_dict(scenario)
    device = resolve_device(cfg.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # one core per worker; also keeps CPU float reductions identical
    torch.use_deterministic_algorithms(True, warn_only=True)
    data = load_federated(cfg.data, cfg.clients.n, cfg.seed)
    return Trainer(cfg, data, device)


def _train(trainer, msg: dict) -> bytes:
    from emulator.policies.base import ClientTask
    rnd, client = msg["round"], msg["client"]
    try:
        task = ClientTask.from_wire(msg["params"])
        weights, metrics = trainer.train(rnd, task, unpack_tensors(msg["model"]))
        return protocol.encode("update", round=rnd, client=client, model=pack_tensors(weights), metrics=metrics)
    except Exception as e:  # reported to the server as this client's failure; the worker lives on
        return protocol.encode("error", round=rnd, client=client, message=f"{type(e).__name__}: {e}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: torch's exit hooks import its compiler stack (seconds),
    # and the socket is closed and every file written by now.
    os._exit(code)

"""The scenario's run: budgets, rounds, buffered aggregation, training, compression, aggregation checks,
evaluation, devices, transport and output, with their admitted ranges."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nodes.contracts.schema.settings import (
    MAX_CLIENTS,
    MAX_GPUS,
    MAX_ROUNDS,
    MAX_SECONDS,
    MAX_WORKERS,
    NON_NEGATIVE,
    POSITIVE,
    Choice,
    Range,
    setting,
)


class RoundMode(Choice):
    SYNC = "sync"  # rounds with a deadline (emulator.rounds.round)
    BUFFERED = "buffered"  # FedBuff: buffered.k arrived updates make a version (emulator.run.buffered)
    ASYNC = "async"  # FedAsync: each arrived update is mixed in at once


class Staleness(Choice):
    """buffered.staleness: s(t) of an update t versions old (FedAsync, Xie et al. 2019: its staleness functions)."""

    CONSTANT = "constant"  # s(t) = 1
    POLYNOMIAL = "polynomial"  # s(t) = (t + 1)^-a
    HINGE = "hinge"  # s(t) = 1 if t <= b else 1 / (a (t - b) + 1)


class Device(Choice):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class Launcher(Choice):
    LOCAL = "local"  # subprocesses of the server
    RAY = "ray"  # actors on a Ray cluster (nodes/transport/ray_workers.py)


# --- run --------------------------------------------------------------------------------


@dataclass
class BudgetConfig:
    rounds: int = setting(20, "R_s: maximum number of rounds")
    time_s: float = setting(math.inf, "virtual-time budget, seconds")
    bytes: float = setting(math.inf, "total bytes over all links")
    energy_j: float = setting(
        math.inf, "total energy of the clients' tasks, joules (energy.radio must model it; round.mode=sync)"
    )


@dataclass
class RoundConfig:
    deadline_s: float = setting(math.inf, "an update arriving later than round start + deadline is late")
    partial_work: bool = setting(
        False,
        "a client runs the local steps (at most the task's) that fit before the deadline, by its own link and "
        "compute, and is charged for those (docs/time-model.md#partial-work)",
    )
    partial_work_normalize: bool = setting(
        True, "partial_work: weight each update FedNova-style, by the steps it did (false: plain FedAvg)"
    )
    mode: str = setting(
        "sync",
        f"{RoundMode.describe()}: rounds with a deadline, FedBuff's buffered versions or FedAsync's "
        "(buffered.*; docs/async.md)",
    )


@dataclass
class BufferedConfig:
    concurrency: int = setting(10, "round.mode=buffered|async: clients training at once (FedBuff's M)")
    k: int = setting(10, "round.mode=buffered: arrived updates per model version (FedBuff's K; async: 1)")
    staleness: str = setting(
        "constant", f"{Staleness.describe()}: weight s(t) of an update t versions old (docs/async.md)"
    )
    staleness_a: float = setting(0.5, "staleness=polynomial|hinge: the exponent / slope a")
    staleness_b: float = setting(4.0, "staleness=hinge: the staleness b up to which s(t) = 1")
    server_lr: float = setting(1.0, "round.mode=buffered: server learning rate (FedBuff's eta_g)")
    alpha: float = setting(0.6, "round.mode=async: FedAsync's mixing weight alpha")


BUNDLE_AUTO = "auto"  # train.bundle: K chosen when the run starts (emulator.run.bundles)


def bundle_size(value: str) -> int | None:
    """train.bundle's K; None for auto and for text that is neither (validation refuses it)."""
    return int(value) if value.isascii() and value.isdigit() else None


@dataclass
class TrainConfig:
    bundle: str = setting(
        BUNDLE_AUTO,
        "K: a worker trains up to K of a round's clients (cut in client-id order) as one batched computation, "
        "each client's update its own within float rounding; 1 = one client at a time; auto = chosen at the "
        "start from the model, device and workers, recorded in run.json (docs/bundles.md#choosing-k)",
    )


NO_COMPRESSION = "none"  # compression.kind without a codec: the worker sends its model, as an `update`


@dataclass
class CompressionConfig:
    kind: str = setting(
        NO_COMPRESSION,
        "the codec a worker encodes its update w_i - w with for the upload, after any DP noise "
        "(nodes.contracts.codecs.CODECS; docs/compression.md)",
    )
    bits: int = setting(8, "kind=qsgd: bits per coordinate, sign included (2^(bits-1) - 1 levels each side)")
    fraction: float = setting(0.01, "kind=topk: share of each tensor's coordinates sent (at least one)")
    error_feedback: bool = setting(
        False, "keep each client's compression error and add it to its next update (any codec)"
    )


@dataclass
class AggregateConfig:
    max_update_norm: float = setting(
        0.0,
        "the server rejects an update of a larger norm as implausible, before aggregating: 0 = auto (derived from "
        "each task at a false-rejection probability of 1e-9: DP-SGD's lr, steps, C and sigma, clips and output "
        "noise; for unclipped plain SGD only float32's, 2^64) | N > 0 = N for every update | inf = no check "
        "(emulator/aggregate/plausibility.py)",
    )


@dataclass
class EvalConfig:
    every: int = setting(
        1,
        "evaluate the global model on the server's test set after every k-th round and after the run's last "
        "(the rounds between have NaN test_loss and test_accuracy); 1 with a policy that reads the evaluation",
    )
    overlap: bool = setting(
        True,
        "evaluate a round while the next one trains, when the policy does not read the evaluation, and "
        "write its rows and checkpoint meanwhile too (the tables are the same either way)",
    )


@dataclass
class RayConfig:
    address: str = setting(
        "",
        "the Ray cluster of transport.launcher=ray: auto (the one this machine belongs to) | HOST:PORT | "
        "ray://HOST:PORT (Ray Client); empty = start a Ray instance on this machine",
    )
    num_cpus_per_worker: float = setting(1.0, "CPUs Ray reserves for each worker")
    num_gpus_per_worker: float = setting(
        0.0, "GPUs Ray reserves for each worker (a fraction shares one GPU); 0: the workers train on CPU"
    )


@dataclass
class GpuConfig:
    devices: list[int] = setting(
        None, "GPU indices (torch's numbering) the local workers train on; empty = every GPU torch sees", list
    )
    workers_per_gpu: int = setting(1, "local worker processes sharing each GPU when workers = 0")
    evaluator: int = setting(-1, "GPU index of the server's evaluator; -1 = the last of gpu.devices")


@dataclass
class TransportConfig:
    address: str = setting(
        "",
        "server address; empty = an ipc:// socket in a private (0700) directory, the only one "
        "without CURVE; tcp://HOST:PORT (IPv6: tcp://[::1]:PORT) or ipc://PATH are authenticated (a key pair per run "
        "for the workers the server starts; keys_dir for others, and for a non-loopback HOST)",
    )
    max_message_bytes: int = setting(256 * 2**20, "largest message accepted from the wire")
    worker_timeout_s: float = setting(600.0, "real seconds without a reply before a busy worker is declared dead")
    heartbeat_s: float = setting(2.0, "real seconds between worker heartbeats; 10 missed in a row = a dead worker")
    max_restarts: int = setting(3, "restarts of each local worker slot after crashes or hangs before it is given up")
    curve: bool = setting(False, "require keygen's CURVE keys (keys_dir) whatever the address")
    keys_dir: str = setting("", "CURVE keys from python -m emulator keygen DIR (server key pair, authorized/ workers)")
    wire_log: bool = setting(False, "workers log the size of every frame they receive and send (wire.jsonl)")
    min_workers: int = setting(0, "ready workers (local and joined by hand) to wait for before the first round")
    launcher: str = setting(
        "local",
        f"who starts the run's `workers`: {Launcher.describe()} (actors on a Ray cluster, which connect "
        "back to a tcp:// transport.address)",
    )
    ray: RayConfig = setting(None, "the Ray cluster of transport.launcher=ray", RayConfig)


@dataclass
class OutputConfig:
    dir: str = setting("runs", "parent directory of run directories")
    name: str = setting("", "run directory name (empty = timestamp)")
    progress: bool = setting(True, "show a progress bar")
    tensorboard: str = setting(
        "", "directory of TensorBoard event files, one run per run directory below output.dir ('' = none)"
    )
    hooks: list[str] = setting(
        None, "after-round hooks of your own: package.module:ClassName, each an emulator.hooks.RoundHook subclass", list
    )


RANGES: dict[type, dict[str, Range]] = {
    BudgetConfig: dict(
        rounds=Range(1, MAX_ROUNDS),
        time_s=Range(0, MAX_SECONDS, low_open=True, inf="unlimited"),
        bytes=Range(0, 1e18, low_open=True, inf="unlimited"),
        energy_j=Range(0, 1e18, low_open=True, inf="unlimited"),
    ),
    RoundConfig: dict(deadline_s=Range(0, MAX_SECONDS, low_open=True, inf="no deadline")),
    BufferedConfig: dict(
        concurrency=Range(1, MAX_CLIENTS),
        k=Range(1, MAX_CLIENTS),
        staleness_a=NON_NEGATIVE,
        staleness_b=Range(0, MAX_ROUNDS),
        server_lr=POSITIVE,
        alpha=Range(0, 1, low_open=True),
    ),
    CompressionConfig: dict(bits=Range(2, 16), fraction=Range(0, 1, low_open=True)),
    AggregateConfig: dict(max_update_norm=Range(0, 1e30, inf="no bound")),
    EvalConfig: dict(every=Range(1, MAX_ROUNDS)),
    TransportConfig: dict(
        max_message_bytes=Range(1024, 2**40),
        worker_timeout_s=Range(0.1, 1e7),
        heartbeat_s=Range(0.01, 3600.0),
        max_restarts=Range(0, 1000),
        min_workers=Range(0, MAX_WORKERS),
    ),
    GpuConfig: dict(
        devices=Range(0, MAX_GPUS - 1), workers_per_gpu=Range(1, MAX_WORKERS), evaluator=Range(-1, MAX_GPUS - 1)
    ),
    RayConfig: dict(num_cpus_per_worker=Range(0, 1024), num_gpus_per_worker=Range(0, 64)),
}

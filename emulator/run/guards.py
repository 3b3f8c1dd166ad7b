"""Checks against the machine before a run starts, so a run that cannot fit fails up front, in one line.

`check_open_files` and `check_transport` (before the address is bound): the open files limit and the
address. `preflight` (every run, once its workers have started, before the run directory exists): the
output directory. The device, and the GPUs' memory, are emulator.run.devices' (before the workers start).
`check_memory` (every run and resume, at the same point): the memory the
server and the workers will hold, counted per process from the scenario alone: the model is
sized from its architecture, so even one too big to allocate costs nothing to measure.
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from emulator.config import clip
from nodes.contracts.keys import parse_tcp
from nodes.contracts.schema import Scenario, bundle_size
from nodes.training.model_catalog import evaluation_batch

if TYPE_CHECKING:
    from nodes.data import DatasetSpec

# Above what each process holds before any data (a worker with torch and Opacus imported; the server,
# no torch; its evaluator): a bound of each process's peak (python -m bench.rss_tree). What each holds of
# the data, its dataset's spec says (nodes.data.spec.DatasetSpec).
PROCESS_BYTES = 400 * 2**20
FLOAT32 = 4
# Whole-model float32 copies a process holds at once, besides per-sample gradients.
SERVER_COPIES = 2  # the global model and its numpy weights
SERVER_COPIES_PER_CLIENT = 3  # per client of a round: its task frame, its update frame, the decoded update
WORKER_COPIES = 8  # weights, gradients, DP-SGD's summed gradient and its noise, the global
# model (anchor), the task and update frames, full gradients (ALI-DPFL's mu)
# Per sample of a DP-SGD batch: Opacus's per-sample gradients plus the transient products of
# computing and clipping them, in model copies, rounded up from the MLPs' (python -m bench.rss_tree).
PER_SAMPLE_COPIES = 3
# The server's own state, besides model copies (bounds of what bench.rss_tree measured up to 400,000 clients):
REGISTERED_BYTES_PER_CLIENT = 2**9  # every registered client's drawn arrays, data size and availability windows
SERVER_BYTES_PER_CLIENT = 4 * 2**10  # each client made: its links, clock and ledger, clients-table row and policy state
SERVER_BYTES_PER_TASK = 24 * 2**10  # each client of a round: its reply as ZeroMQ received it, clock events, rows
ROUNDS_HELD = 2  # a round's tasks are held while the next one plays, its evaluation overlapped
OUTCOME_BYTES = 2**10  # each client's outcome of each round, kept for the run (histories, privacy ledgers)
OUTPUT_MIN_BYTES = 16 * 2**20  # tables, run.json and logs of a run, besides its checkpoints
PROBE_BYTES = 2**20  # written and removed in output.dir before a run starts
IPC_PATH_MAX = 107  # sun_path of a Unix socket, less its terminating NUL
OPEN_FILES_BASE = 64  # twice the least the server needed besides connections as ulimit -n was lowered (tcp, CURVE)
OPEN_FILES_PER_WORKER = 2  # twice the server's one connection to each worker
GIB, MIB = 2**30, 2**20


class ResourceError(RuntimeError):
    """The run would not fit on this machine; the message says why, with the estimate."""


# --- preflight ------------------------------------------------------------------------------


def preflight(cfg: Scenario) -> None:
    """What the machine must offer before the run directory is created: the output directory (the
    address: `check_transport`, before it is bound; the device: emulator.run.devices, before the workers start)."""
    check_output_dir(cfg.output.dir, OUTPUT_MIN_BYTES + 2 * FLOAT32 * model_size(cfg).parameters)


def open_files_needed(workers: int) -> int:
    return OPEN_FILES_BASE + OPEN_FILES_PER_WORKER * workers


def check_open_files(workers: int) -> None:
    """The server may open the descriptors a run with `workers` connected needs: ZeroMQ aborts the
    process when it runs out. A soft limit below that is raised, as far as the hard limit allows;
    the workers the server starts inherit it."""
    need = open_files_needed(workers)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    raise ResourceError(
        f"open files limit (ulimit -n) is {soft}: this run needs at least {need} "
        f"({OPEN_FILES_BASE} + {OPEN_FILES_PER_WORKER} per worker, {workers} workers) and the hard limit is "
        f"{hard}; raise the hard limit (ulimit -Hn {need}, as root, or limits.conf) or run fewer workers"
    )


def check_transport(address: str) -> None:
    """The server will be able to bind `address`: an existing directory for ipc://, a free port for tcp://."""
    key = f"transport.address = {clip(repr(address))}"
    if address.startswith("ipc://") and not address.startswith("ipc://@"):  # @: abstract, no file
        path = Path(address[len("ipc://") :])
        if len(str(path).encode()) > IPC_PATH_MAX:
            raise ResourceError(f"{key}: a socket path has at most {IPC_PATH_MAX} bytes")
        if not path.parent.is_dir():
            raise ResourceError(f"{key}: the directory {clip(str(path.parent))} does not exist")
    elif address.startswith("tcp://"):
        host, port = parse_tcp(address)
        try:
            family, kind, proto, _, where = socket.getaddrinfo(
                None if host == "*" else host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            with socket.socket(family, kind, proto) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ does
                s.bind(where)
        except OSError as e:
            raise ResourceError(f"{key}: cannot listen there: {e.strerror or e}") from None


def check_output_dir(out_dir: str, need_bytes: int) -> None:
    """output.dir is (or can be made) a writable directory with room for a run: a probe file is
    written, synced and removed in it, or in its nearest existing parent."""
    key = f"output.dir = {clip(repr(out_dir))}"
    d = Path(out_dir).expanduser()
    try:
        existing = next(p for p in (d, *d.parents) if p.exists())
    except OSError as e:  # e.g. a component longer than this file system allows
        raise ResourceError(f"{key}: {e.strerror or e}") from None
    if not existing.is_dir():
        raise ResourceError(f"{key}: {clip(str(existing))} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".dpfl-probe-", dir=existing)
        try:
            with open(fd, "wb") as f:  # a buffered write raises on a short write (disk full)
                f.write(bytes(PROBE_BYTES))
                f.flush()
                os.fsync(f.fileno())
        finally:
            os.unlink(probe)
        free = shutil.disk_usage(existing).free
    except OSError as e:
        raise ResourceError(f"{key}: cannot write there: {e.strerror or e}") from None
    if free < need_bytes:
        raise ResourceError(
            f"{key}: {free / MIB:.0f} MiB free, a run needs about {need_bytes / MIB:.0f} MiB "
            f"(tables and model checkpoints)"
        )


# --- memory -----------------------------------------------------------------------------


@dataclass
class ModelSize:
    parameters: int
    activations: int  # floats one sample leaves in the forward pass (kept for backward)
    widest_layer: int  # floats of the largest single layer output (the peak without autograd)


def model_size(cfg: Scenario) -> ModelSize:
    """The scenario's model sized from its architecture (nodes.training.model_catalog): shapes only, no torch,
    no memory, whatever its size."""
    from nodes.training.model_catalog import architecture, output_shapes, parameter_shapes

    data = _data(cfg)
    layers = architecture(cfg.model, data.sample_shape, data.classes)
    outputs = [math.prod(shape) for shape in output_shapes(layers, data.sample_shape)]
    parameters = sum(math.prod(shape) for shape in parameter_shapes(layers).values())
    return ModelSize(parameters, sum(outputs), max(outputs))


def _data(cfg: Scenario) -> DatasetSpec:
    """The scenario's dataset as its spec declares it: the samples and bytes the data hold, without a file."""
    from nodes.data import dataset_spec

    return dataset_spec(cfg.data)


def server_data_bytes(cfg: Scenario) -> int:
    """What the server holds of the data while it loads the sizes (nodes.data.federated.ServerData)."""
    return _data(cfg).server_bytes(cfg.clients.n)


def clients_per_round(cfg: Scenario) -> int:
    """The most clients a round may train: clients.per_round limits uniform and round-robin selections only."""
    from nodes.contracts.schema import Selection

    c = cfg.clients
    return c.n if c.select == Selection.ALL else c.per_round or c.n


def clients_made(cfg: Scenario) -> int:
    """The most clients whose state the server makes (docs/architecture.md, "Scale"): those its rounds train
    and those its policy asks about besides (`Policy.clients_asked`)."""
    from emulator.config.server_scenario import policy_options
    from emulator.policies import policy_class

    policy = policy_class(cfg.policy)
    asked = policy.clients_asked(policy_options(policy, cfg), cfg.clients.n)
    return min(cfg.clients.n, cfg.budget.rounds * (clients_per_round(cfg) + asked))


def worker_cache_bytes(cfg: Scenario) -> int:
    """The clients' data a worker keeps built, on its device (nodes.data.cache: at most CACHE_BYTES, and
    one client more as it is built)."""
    from nodes.data.cache import CACHE_BYTES
    from nodes.data.spec import DATA_OVERHEAD

    data, n = _data(cfg), cfg.clients.n
    per_sample = data.sample_bytes() * DATA_OVERHEAD
    return int(min(data.client_samples(n) * per_sample, CACHE_BYTES + data.largest_client(n) * per_sample))


@dataclass
class MemoryEstimate:
    workers: int
    server_data: int
    server_state: int  # the clients' state and a round's tasks, besides model copies
    evaluator_data: int
    worker_data: int
    parameters: int
    batch: int  # the expected DP-SGD batch of the largest client
    server_model: int
    worker_model: int
    evaluator_model: int

    @property
    def server(self) -> int:
        return PROCESS_BYTES + self.server_data + self.server_state + self.server_model

    @property
    def evaluator(self) -> int:  # nodes/transport/evaluator.py
        return PROCESS_BYTES + self.evaluator_data + self.evaluator_model

    @property
    def worker(self) -> int:
        return PROCESS_BYTES + self.worker_data + self.worker_model

    @property
    def total(self) -> int:
        return self.server + self.evaluator + self.workers * self.worker


def memory_estimate(cfg: Scenario, workers: int) -> MemoryEstimate:
    """Bytes the server, its evaluator and `workers` local workers hold: each the runtime, its data
    and the model: the server each client's state and its model copies per client of a round; the
    evaluator the test set and an evaluation batch; a worker the clients' data it keeps built, its
    gradients, per-sample gradients and activations of a DP-SGD batch at rate q (K times the model and the
    activations for a bundle of K; train.bundle = auto counts as 1 until the run resolves it)."""
    m, data, n = model_size(cfg), _data(cfg), cfg.clients.n
    per_round = clients_per_round(cfg)
    server_state = (
        n * REGISTERED_BYTES_PER_CLIENT
        + clients_made(cfg) * SERVER_BYTES_PER_CLIENT
        + ROUNDS_HELD * per_round * SERVER_BYTES_PER_TASK
        + cfg.budget.rounds * per_round * OUTCOME_BYTES
    )
    batch = max(1, math.ceil(cfg.dp.q * data.largest_client(n)))
    per_sample_grads = PER_SAMPLE_COPIES * batch * m.parameters if cfg.dp.sigma > 0 or cfg.dp.clip > 0 else 0
    eval_batch = evaluation_batch(cfg.model.name, cfg.dp.batch_eval)
    evaluating = 2 * min(eval_batch, data.test_samples(n)) * m.widest_layer  # two layers' outputs at a time
    server_model = (SERVER_COPIES + SERVER_COPIES_PER_CLIENT * per_round) * m.parameters
    stacked = bundle_size(cfg.train.bundle) or 1  # a bundle's K models and batches (nodes.training.bundle)
    worker_model = stacked * (WORKER_COPIES * m.parameters + 2 * batch * m.activations) + per_sample_grads + evaluating
    return MemoryEstimate(
        workers,
        data.server_bytes(n),
        server_state,
        data.evaluator_bytes(n),
        worker_cache_bytes(cfg) + data.source_bytes(n),
        m.parameters,
        batch,
        server_model * FLOAT32,
        worker_model * FLOAT32,
        (SERVER_COPIES * m.parameters + evaluating) * FLOAT32,
    )


def available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_memory(cfg: Scenario, workers: int) -> None:
    e, have = memory_estimate(cfg, workers), available_memory()
    if e.total > have:
        raise ResourceError(
            f"estimated memory {e.total / GIB:.1f} GiB exceeds the {have / GIB:.1f} GiB available: "
            f"server {e.server / GIB:.2f} GiB (clients' state {e.server_state / GIB:.2f}) + "
            f"evaluator {e.evaluator / GIB:.2f} GiB + "
            f"{workers} workers x {e.worker / GIB:.2f} GiB "
            f"(runtime {PROCESS_BYTES / GIB:.2f}, data {e.worker_data / GIB:.2f}, "
            f"model {e.worker_model / GIB:.2f} GiB: "
            f"{e.parameters:,} parameters, per-sample gradients of a batch of {e.batch}); "
            f"lower workers, clients.n, the data or the model size"
        )

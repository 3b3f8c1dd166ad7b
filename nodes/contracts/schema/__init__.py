"""The scenario schema: typed dataclasses with defaults, the admitted Range of every number,
and the scenario as plain data (what run.json keeps and what the server sends its workers).

Every process reads it: the server loads and validates a scenario (emulator.config), a worker
rebuilds it from the task message. The sections of the server's policies are theirs
(emulator.policies); this is what every run has.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from enum import StrEnum
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar, cast, get_args, get_origin, get_type_hints, overload

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")


class Choice(StrEnum):
    """The allowed values of a text key; a member is its value (compared, stored and written as text)."""

    @classmethod
    def admits(cls, value: str) -> bool:
        return value in cls._value2member_map_

    @classmethod
    def describe(cls) -> str:
        return " | ".join(cls)


@overload
def setting(default: T, help: str) -> T: ...
@overload
def setting(default: None, help: str, factory: Callable[[], T]) -> T: ...


def setting(default: object, help: str, factory: Callable[[], object] | None = None) -> Any:
    """A schema field with its help text (python -m emulator --help). Typed as the field's value,
    as dataclasses.field is: `x: int = setting(0, "...")`."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


# --- allowed values: one Choice per text key with a fixed set, read by validation and code alike


class DistKind(Choice):
    CONSTANT = "constant"
    LOGNORMAL = "lognormal"
    UNIFORM = "uniform"
    LIST = "list"


class DropoutDirection(Choice):
    UP = "up"
    DOWN = "down"
    BOTH = "both"


class TraceAssign(Choice):
    SAME = "same"  # the first file for every client
    ROUND_ROBIN = "round_robin"  # client i gets file i mod len(files)
    RANDOM = "random"  # a file drawn per client from its own stream(seed, "trace", i)


class TraceOffset(Choice):
    ZERO = "zero"  # every client starts at the beginning of its trace
    RANDOM = "random"  # each client starts at a uniform point of its trace's period


class AvailabilityModel(Choice):
    ALWAYS = "always"
    CSV = "csv"
    DIURNAL = "diurnal"


class OnUnavailable(Choice):
    EXCLUDE = "exclude"  # clients unavailable at the start of a round are not offered to the policy
    DROP = "drop"  # they may be selected, and drop out of the round at once


class Selection(Choice):
    ALL = "all"
    UNIFORM = "uniform"
    ROUND_ROBIN = "round_robin"


class Conversion(Choice):
    IMPROVED = "improved"
    CLASSIC = "classic"


class Partition(Choice):
    IID = "iid"
    DIRICHLET = "dirichlet"
    DIRICHLET_CAPPED = "dirichlet_capped"
    SHARDS = "shards"
    QUANTITY = "quantity"


class Normalization(Choice):
    STANDARD = "standard"
    HALF = "half"
    NONE = "none"


class Split(Choice):
    OFFICIAL = "official"
    PER_CLIENT = "per_client"


class EmptyBatch(Choice):
    NOISE = "noise"
    SKIP = "skip"


class PerSample(Choice):
    AUTO = "auto"  # bk wherever it applies
    BK = "bk"  # book-keeping: one backward pass (Linear and Conv2d layers)
    HOOKS = "hooks"  # Opacus's per-sample gradients


class ImpactKind(Choice):
    UNIFORM = "uniform"
    DATA_SIZE = "data_size"
    EXPLICIT = "explicit"
    SCHEDULE = "schedule"
    RELIABILITY = "reliability"  # data size x observed arrival rate (emulator.aggregate.impact)


FIXED_IMPACT = (ImpactKind.UNIFORM, ImpactKind.DATA_SIZE, ImpactKind.EXPLICIT)  # a schedule's phases are these


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


# --- per-client quantities -------------------------------------------------------------


@dataclass
class Dist:
    """A per-client quantity, drawn once per client from the client's own RNG stream."""

    kind: str = setting("constant", DistKind.describe())
    value: float = setting(0.0, "the value when kind=constant")
    median: float = setting(0.0, "median when kind=lognormal")
    sigma: float = setting(0.0, "log-space standard deviation when kind=lognormal")
    low: float = setting(0.0, "lower bound when kind=uniform")
    high: float = setting(0.0, "upper bound when kind=uniform")
    values: list[float] = setting(None, "one value per client when kind=list (cycled)", list)


def const(v: float) -> Callable[[], Dist]:
    return lambda: Dist(kind=DistKind.CONSTANT.value, value=v)


@dataclass
class SchedulePoint:
    t: float = setting(0.0, "virtual time (s) from which the factor applies")
    factor: float = setting(
        1.0,
        "multiplier from t on (piecewise constant): of the bandwidth in links.schedule, "
        "of the seconds per step in compute.schedule",
    )


@dataclass
class Outage:
    clients: list[int] = setting(None, "client ids the window applies to (empty = all)", list)
    start: float = setting(0.0, "outage start, virtual seconds")
    end: float = setting(0.0, "outage end, virtual seconds")


@dataclass
class DropoutConfig:
    model: str = setting("none", "the loss model of every transfer (emulator.timemodel.loss.LOSS_MODELS)")
    p: float = setting(0.0, "bernoulli: loss probability per transfer")
    p_good_to_bad: float = setting(0.1, "gilbert_elliott: P(good -> bad) per transfer")
    p_bad_to_good: float = setting(0.5, "gilbert_elliott: P(bad -> good) per transfer")
    loss_good: float = setting(0.0, "gilbert_elliott: loss probability in the good state")
    loss_bad: float = setting(1.0, "gilbert_elliott: loss probability in the bad state")
    direction: str = setting("both", f"which transfers can be lost: {DropoutDirection.describe()}")
    outages: list[Outage] = setting(None, "scheduled outage windows; a transfer overlapping one is lost", list)
    args: dict[str, Any] = setting(
        None, "options of a user's loss model (model=package.module:ClassName), checked by its Options dataclass", dict
    )


@dataclass
class LinkTraceConfig:
    down: list[str] = setting(
        None,
        "download bandwidth trace files: Mahimahi packet-delivery (one millisecond "
        "timestamp per 1500-byte opportunity) or .csv rows t_s,bps; relative paths are "
        "looked up next to the scenario file, then in scenarios/",
        list,
    )
    up: list[str] = setting(
        None,
        "upload bandwidth trace files (as down); a direction without files keeps links.up_bps / links.down_bps",
        list,
    )
    assign: str = setting("round_robin", f"which file a client gets: {TraceAssign.describe()}")
    offset: str = setting("zero", f"where in its trace a client is at t=0: {TraceOffset.describe()}")


@dataclass
class LinksConfig:
    down_bps: Dist = setting(None, "download bandwidth per client, bits/s", const(20e6))
    up_bps: Dist = setting(None, "upload bandwidth per client, bits/s", const(5e6))
    latency_s: Dist = setting(None, "one-way latency per transfer, seconds", const(0.05))
    schedule: list[SchedulePoint] = setting(
        None, "piecewise-constant bandwidth factor over virtual time (all clients)", list
    )
    server_down_bps: float = setting(
        0.0, "shared server egress capacity, bits/s, split fairly among concurrent downloads (0 = unlimited)"
    )
    server_up_bps: float = setting(
        0.0, "shared server ingress capacity, bits/s, split fairly among concurrent uploads (0 = unlimited)"
    )
    dropout: DropoutConfig = setting(None, "link losses", DropoutConfig)
    trace: LinkTraceConfig = setting(
        None,
        "per-client bandwidth traces, repeated when they end (instead of down_bps/up_bps and schedule)",
        LinkTraceConfig,
    )


@dataclass
class ComputeTraceConfig:
    files: list[str] = setting(
        None,
        "per-client compute traces, .csv rows t_s,step_s (seconds per step from t_s "
        "to the next row; the last row's t_s ends the trace, which repeats)",
        list,
    )
    assign: str = setting("round_robin", f"which file a client gets: {TraceAssign.describe()}")
    offset: str = setting("zero", f"where in its trace a client is at t=0: {TraceOffset.describe()}")


@dataclass
class ComputeConfig:
    step_s: Dist = setting(None, "virtual seconds per DP-SGD step per client", const(0.05))
    schedule: list[SchedulePoint] = setting(
        None, "piecewise-constant factor on every client's seconds per step over virtual time", list
    )
    trace: ComputeTraceConfig = setting(
        None, "per-client seconds-per-step traces (instead of step_s and schedule)", ComputeTraceConfig
    )


@dataclass
class AvailabilityConfig:
    model: str = setting("always", f"when clients can be reached: {AvailabilityModel.describe()}")
    file: str = setting(
        "",
        "model=csv: rows client,t_start,t_end, the intervals in which the client is available "
        "(a client without rows is always available); looked up like trace files",
    )
    on_unavailable: str = setting(
        "exclude",
        f"{OnUnavailable.describe()}: a client unavailable at a round's start "
        "is not offered to the policy (exclude) or drops out of the round (drop); "
        "one that becomes unavailable during its round drops either way",
    )
    repeat_s: float = setting(
        0.0,
        "model=csv: the file's windows repeat with this period, virtual seconds (each must end by it); "
        "0 = they happen once, and after its last window a client with rows stays unavailable",
    )
    period_s: float = setting(86400.0, "model=diurnal: period of the availability probability, virtual seconds")
    mean: float = setting(0.6, "model=diurnal: mean probability that a client is available")
    amplitude: float = setting(0.3, "model=diurnal: amplitude of the sinusoid around the mean")
    phase_spread_s: float = setting(
        0.0,
        "model=diurnal: each client's phase is uniform in [0, phase_spread_s) "
        "(0 = all in step; period_s = spread over the whole day)",
    )


# --- learning ---------------------------------------------------------------------------


@dataclass
class ClientGroup:
    clients: int = setting(1, "number of consecutive clients in the group (groups are listed in client-id order)")
    samples: int = setting(1, "training samples of every client in the group")


@dataclass
class QualityRule:
    clients: list[int] = setting(None, "client ids the rule applies to (or use client_range)", list)
    client_range: list[int] = setting(None, "[first, stop): the clients first..stop-1 (instead of clients)", list)
    from_round: int = setting(0, "first round (0-based) the rule applies to; a later from_round overrides")
    salt_pepper: float = setting(0.0, "share of pixels set to 0 or 1 (half each), in [0, 1]")
    label_noise: float = setting(0.0, "share of labels replaced by a random wrong label, in [0, 1]")


@dataclass
class DataConfig:
    dataset: str = setting("synthetic", "the dataset (docs/data-models.md)")
    root: str = setting("", "directory holding the dataset files, searched before the standard locations")
    cache_dir: str = setting("~/.cache/dpfl-emulator", "where downloaded datasets are kept")
    download: bool = setting(True, "download a missing dataset from its official source (checksum-verified)")
    alpha: float = setting(1.0, "synthetic: model heterogeneity alpha of Synthetic(alpha, beta)")
    beta: float = setting(1.0, "synthetic: data heterogeneity beta of Synthetic(alpha, beta)")
    dim: int = setting(60, "synthetic: input dimension")
    classes: int = setting(10, "synthetic: number of classes")
    samples_per_client: int = setting(200, "synthetic: mean samples per client (lognormal sizes)")
    size_sigma: float = setting(
        0.5, "synthetic: log-space standard deviation of per-client sample counts (0 = equal sizes)"
    )
    test_fraction: float = setting(0.2, "synthetic: share of generated samples held out for the server's test set")
    normalize: str = setting(
        "standard",
        "image datasets: standard (per-channel mean/std of the training set) | "
        "half ((x - 0.5) / 0.5, the ALI-DPFL code) | none (pixels in [0, 1])",
    )
    split: str = setting(
        "official",
        "image datasets: official (training set -> clients, test set -> server) | per_client "
        "(train+test pooled, partitioned, each share split train/test; the server tests "
        "on the union of the clients' test shares: the ALI-DPFL code)",
    )
    client_train_fraction: float = setting(0.75, "split=per_client: share of each client's samples kept for training")
    partition: str = setting(
        "iid",
        "image datasets: iid | dirichlet | dirichlet_capped (the ALI-DPFL code's, "
        "no client beyond N/clients) | shards | quantity",
    )
    partition_seed: int = setting(
        -1,
        "-1 = the partition follows seed; N >= 0 = a fixed partition from numpy's "
        "legacy RandomState(N) (the ALI-DPFL code's files: 1)",
    )
    dirichlet_beta: float = setting(0.5, "concentration of Dir(beta) label skew")
    shards_per_client: int = setting(2, "partition=shards: label-sorted shards per client")
    groups: list[ClientGroup] = setting(None, "partition=quantity: client groups with an exact sample count each", list)
    quality: list[QualityRule] = setting(
        None, "data-quality corruption rules (salt-and-pepper, label noise) by client and round", list
    )
    min_samples: int = setting(10, "each client gets at least this many samples")
    max_train: int = setting(0, "image datasets: use only the first N training samples (0 = all)")
    max_test: int = setting(0, "use only the first N test samples (0 = all); synthetic: of clients 0, 1, ... in turn")


@dataclass
class ModelConfig:
    name: str = setting("logreg", "logreg | linreg | mlp | mlp_talaei | mlp_wei | cnn_fmnist | cnn_cifar | cnn_fedavg")
    hidden: int = setting(64, "mlp: hidden units (mlp_talaei and mlp_wei have fixed sizes)")


@dataclass
class ClientsConfig:
    n: int = setting(10, "number of logical clients")
    select: str = setting("all", f"client selection: {Selection.describe()}")
    per_round: int = setting(0, "clients per round for uniform / round_robin (0 = all)")


@dataclass
class DPConfig:
    q: float = setting(0.05, "Poisson sampling rate per local step, in (0, 1]")
    sigma: float = setting(1.0, "noise multiplier (0 = no noise)")
    clip: float = setting(1.0, "per-sample clipping norm C (0 = no clipping; needs sigma = 0)")
    lr: float = setting(0.1, "local learning rate eta")
    tau: int = setting(5, "local DP-SGD steps per round")
    epsilon: float = setting(math.inf, "per-client privacy budget epsilon (inf = unlimited)")
    delta: float = setting(1e-5, "delta of (epsilon, delta)-DP")
    accountant: str = setting(
        "rdp",
        "DP-SGD's accountant: rdp (Renyi DP, Opacus) | prv (privacy random variables, Gopi et al. 2021, "
        "Opacus; tighter, slower) | pld (privacy loss distributions, dp_accounting; tighter, slower; "
        "pip install 'dpfl-emulator[pld]') | package.module:ClassName (your own emulator.privacy.EpsilonTheorem "
        "subclass, imported by the server only: docs/privacy.md)",
    )
    conversion: str = setting(
        "improved",
        "RDP -> (epsilon, delta): improved (Opacus) | classic (ALI-DPFL Thm 2); dp.accountant=rdp only",
    )
    batch_divisor: float = setting(
        0.0,
        "the noisy gradient sum is divided by: 0 = the expected batch q|D_i| (Opacus) | "
        "N > 0 = a fixed N (the ALI-DPFL code: its batch_size, 64)",
    )
    empty_batch: str = setting(
        "noise",
        "an empty Poisson batch: noise = a noise-only step (as the RDP analysis assumes) | "
        "skip = no step (the ALI-DPFL code's sampler)",
    )
    per_sample: str = setting(
        "auto",
        "how clipped per-sample gradients are formed, equal up to float rounding: "
        "bk = book-keeping, one backward pass (Linear/Conv2d models) | hooks = Opacus's "
        "per-sample gradients | auto = bk where it applies (fastest, bench.dp_step)",
    )
    batch_eval: int = setting(
        0,
        "batch size of the server's evaluation and of the full-data gradients (ali_dpfl.mu_estimate=gradient); "
        "0 = by model: 64 for the conv nets, 1024 for the others (python -m bench.eval_batch)",
    )


@dataclass
class ImpactPhase:
    from_round: int = setting(0, "first round the phase applies to")
    kind: str = setting("uniform", " | ".join(FIXED_IMPACT))
    values: list[float] = setting(None, "kind=explicit: one factor per client, summing to 1", list)


@dataclass
class ImpactConfig:
    kind: str = setting("data_size", f"impact factors p_i: {ImpactKind.describe()}")
    values: list[float] = setting(None, "kind=explicit: one factor per client, summing to 1", list)
    schedule: list[ImpactPhase] = setting(None, "kind=schedule: phases by round", list)
    prior_rate: float = setting(1.0, "kind=reliability: arrival rate assumed before a client is seen")
    prior_weight: float = setting(2.0, "kind=reliability: weight of prior_rate, in rounds of evidence")


# --- run --------------------------------------------------------------------------------


@dataclass
class BudgetConfig:
    rounds: int = setting(20, "R_s: maximum number of rounds")
    time_s: float = setting(math.inf, "virtual-time budget, seconds")
    bytes: float = setting(math.inf, "total bytes over all links")


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


@dataclass
class TrainConfig:
    bundle: int = setting(
        1,
        "K: a worker trains up to K of a round's clients (cut in client-id order) as one batched computation, "
        "each client's update its own within float rounding; 1 = one client at a time (docs/bundles.md)",
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
        "noise; no bound for unclipped plain SGD) | N > 0 = N for every update (emulator/aggregate/plausibility.py)",
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


@dataclass
class Scenario:
    """What every process of a run reads; the server's ServerScenario (emulator.config) adds one section
    of options per policy."""

    name: str = setting("default", "scenario name")
    seed: int = setting(0, "the one seed that drives everything")
    policy: str = setting("fedavg_dp", "server policy")
    workers: int = setting(0, "worker processes (0 = one per CPU core; on GPUs, gpu.workers_per_gpu per GPU)")
    device: str = setting(
        "auto", f"{Device.describe()} (auto: cuda when torch sees a GPU; local workers placed per gpu.*)"
    )
    gpu: GpuConfig = setting(None, "where local workers and the evaluator train when the device is cuda", GpuConfig)
    data: DataConfig = setting(None, "dataset and partition", DataConfig)
    model: ModelConfig = setting(None, "model", ModelConfig)
    clients: ClientsConfig = setting(None, "clients and selection", ClientsConfig)
    dp: DPConfig = setting(None, "client-side DP-SGD", DPConfig)
    links: LinksConfig = setting(None, "network links", LinksConfig)
    compute: ComputeConfig = setting(None, "client compute speed", ComputeConfig)
    availability: AvailabilityConfig = setting(None, "when clients can be reached", AvailabilityConfig)
    impact: ImpactConfig = setting(None, "aggregation impact factors", ImpactConfig)
    budget: BudgetConfig = setting(None, "budgets; the run stops at the first exhausted", BudgetConfig)
    round: RoundConfig = setting(None, "round timing", RoundConfig)
    buffered: BufferedConfig = setting(None, "buffered and asynchronous aggregation (round.mode)", BufferedConfig)
    train: TrainConfig = setting(None, "how workers train a round's clients", TrainConfig)
    compression: CompressionConfig = setting(None, "compressed updates on the upload", CompressionConfig)
    aggregate: AggregateConfig = setting(None, "the server's checks of the updates it aggregates", AggregateConfig)
    eval: EvalConfig = setting(None, "the server's evaluation of the global model", EvalConfig)
    transport: TransportConfig = setting(None, "ZeroMQ transport", TransportConfig)
    output: OutputConfig = setting(None, "results", OutputConfig)


# --- admitted ranges ----------------------------------------------------------------------
# Every number in a scenario is checked against its key's Range before anything starts, so
# NaN, infinities and absurd sizes never reach the run. The bounds are far beyond any useful
# setting (a round of 10^6 local steps already takes hours) but keep every derived quantity
# finite and every allocation sane; +inf is admitted only where the key documents it.


@dataclass(frozen=True)
class Range:
    """[low, high] (an open end excludes its bound); `inf` says what +inf means where it is admitted."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    inf: str = ""

    def admits(self, v: float) -> bool:
        if v == math.inf:
            return bool(self.inf)
        above = v > self.low if self.low_open else v >= self.low  # NaN fails every comparison
        below = v < self.high if self.high_open else v <= self.high
        return above and below

    def describe(self, integer: bool) -> str:
        what = "an integer" if integer else "a number"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        text = f"{what} in {left}{_bound(self.low)}, {_bound(self.high)}{right}"
        return f"{text} or inf ({self.inf})" if self.inf else text


def _bound(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


MAX_CLIENTS = 10**6
MAX_ROUNDS = 10**6
MAX_STEPS = 10**6  # local steps per round (dp.tau, fu_tuning.local_iters)
MAX_SAMPLES = 10**8  # per client
MAX_WORKERS = 1024
MAX_GPUS = 1024
MAX_SECONDS = 1e12  # virtual time (about 31,700 years)
MAX_QUANTITY = 1e15  # a per-client bandwidth (bits/s) or duration (s)
MAX_PARAMETER = 1e6  # learning rate, noise multiplier, clipping norm and other scalars

PROBABILITY = Range(0, 1)
OPEN_UNIT = Range(0, 1, low_open=True, high_open=True)
QUANTITY = Range(0, MAX_QUANTITY)
TIME = Range(0, MAX_SECONDS)
ROUND = Range(0, MAX_ROUNDS)
CLIENT_ID = Range(0, MAX_CLIENTS - 1)
NON_NEGATIVE = Range(0, MAX_PARAMETER)
POSITIVE = Range(0, MAX_PARAMETER, low_open=True)
FINITE = Range(-math.inf, math.inf, low_open=True, high_open=True)  # also for a key with no declared range

RANGES: dict[type, dict[str, Range]] = {
    Dist: dict(value=QUANTITY, median=QUANTITY, sigma=Range(0, 10), low=QUANTITY, high=QUANTITY, values=QUANTITY),
    SchedulePoint: dict(t=TIME, factor=Range(1e-6, 1e6)),
    Outage: dict(clients=CLIENT_ID, start=TIME, end=TIME),
    DropoutConfig: dict(
        p=PROBABILITY, p_good_to_bad=PROBABILITY, p_bad_to_good=PROBABILITY, loss_good=PROBABILITY, loss_bad=PROBABILITY
    ),
    LinksConfig: dict(server_down_bps=QUANTITY, server_up_bps=QUANTITY),
    AvailabilityConfig: dict(
        repeat_s=TIME,
        period_s=Range(0, MAX_SECONDS, low_open=True),
        mean=PROBABILITY,
        amplitude=PROBABILITY,
        phase_spread_s=TIME,
    ),
    ClientGroup: dict(clients=Range(1, MAX_CLIENTS), samples=Range(1, MAX_SAMPLES)),
    QualityRule: dict(
        clients=CLIENT_ID,
        client_range=Range(0, MAX_CLIENTS),
        from_round=ROUND,
        salt_pepper=PROBABILITY,
        label_noise=PROBABILITY,
    ),
    DataConfig: dict(
        alpha=Range(0, 1e3),
        beta=Range(0, 1e3),
        dim=Range(1, 10**6),
        classes=Range(2, 10**5),
        samples_per_client=Range(1, MAX_SAMPLES),
        size_sigma=Range(0, 10),
        test_fraction=OPEN_UNIT,
        dirichlet_beta=POSITIVE,
        shards_per_client=Range(1, 10**6),
        min_samples=Range(1, MAX_SAMPLES),
        max_train=Range(0, 10**9),
        max_test=Range(0, 10**9),
        client_train_fraction=OPEN_UNIT,
        partition_seed=Range(-1, 2**32 - 1),
    ),  # RandomState takes seeds below 2^32
    ModelConfig: dict(hidden=Range(1, 10**9)),
    ClientsConfig: dict(n=Range(1, MAX_CLIENTS), per_round=Range(0, MAX_CLIENTS)),
    DPConfig: dict(
        q=Range(0, 1, low_open=True),
        sigma=NON_NEGATIVE,
        clip=NON_NEGATIVE,
        lr=POSITIVE,
        tau=Range(1, MAX_STEPS),
        epsilon=Range(0, MAX_PARAMETER, low_open=True, inf="unlimited"),
        # [1e-12, 0.1], where each accountant answers: PRV refuses a delta whose float error its grid (up to
        # 2^22 points, x 1.1e-19 each) would dominate, and PLD's truncated tails (1e-15 of mass) give no epsilon
        # below their mass; near 1 PRV finds no epsilon at all. A delta above 0.1 guarantees nothing anyway (1/n lets
        # a mechanism publish a random client's data in the clear).
        delta=Range(1e-12, 0.1),
        batch_eval=Range(0, 10**7),
        batch_divisor=Range(0, 10**9),
    ),
    ImpactPhase: dict(from_round=ROUND, values=PROBABILITY),
    ImpactConfig: dict(values=PROBABILITY, prior_rate=PROBABILITY, prior_weight=Range(0, 1e6)),
    BudgetConfig: dict(
        rounds=Range(1, MAX_ROUNDS),
        time_s=Range(0, MAX_SECONDS, low_open=True, inf="unlimited"),
        bytes=Range(0, 1e18, low_open=True, inf="unlimited"),
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
    TrainConfig: dict(bundle=Range(1, MAX_CLIENTS)),
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
    Scenario: dict(seed=Range(0, 2**64 - 1), workers=Range(0, MAX_WORKERS)),
}
# Lists whose entries must be listed in order of a field (ties keep the later-listed entry).
ORDERED_BY: dict[type, dict[str, str]] = {
    LinksConfig: dict(schedule="t"),
    ComputeConfig: dict(schedule="t"),
    ImpactConfig: dict(schedule="from_round"),
    DropoutConfig: dict(outages="start"),
}


def ranges_of(cls: type) -> dict[str, Range]:
    """The Ranges of a section's numbers: its entry in RANGES (the server's Scenario has its base's),
    or the section's own RANGES: a policy's options declare theirs beside their fields."""
    if "RANGES" in vars(cls):
        own: dict[str, Range] = vars(cls)["RANGES"]
        return own
    return next((RANGES[c] for c in cls.__mro__ if c in RANGES), {})


def declared_range(cls: type, name: str) -> Range:
    return ranges_of(cls).get(name, FINITE)


def numeric_type(hint: object) -> type | None:
    """int or float for a number or a list of numbers; None for anything else (bool is not a number here)."""
    if get_origin(hint) is list:
        hint = get_args(hint)[0]
    return hint if isinstance(hint, type) and hint in (int, float) else None


def list_entry_type(hint: object) -> type | None:
    """The dataclass of a list-of-dataclass field, else None."""
    if get_origin(hint) is list and is_dataclass(get_args(hint)[0]):
        entry: type = get_args(hint)[0]
        return entry
    return None


# `check(ok, key, value, expected)`: reports (raises on) a failed check of a scenario key's value.
Check = Callable[[bool, str, object, str], None]


def check_ranges(obj: DataclassInstance, prefix: str, check: Check) -> None:
    """Every number in `obj`, nested sections and list entries included, against its declared Range;
    `check(ok, key, value, expected)` reports a failure."""
    hints = get_type_hints(type(obj))
    for f in fields(obj):
        key, value, hint = prefix + f.name, getattr(obj, f.name), hints[f.name]
        if is_dataclass(value):
            check_ranges(cast("DataclassInstance", value), key + ".", check)  # a section: an instance
        elif list_entry_type(hint):
            _check_order(value, ORDERED_BY.get(type(obj), {}).get(f.name), key, check)
            for i, entry in enumerate(value):
                check_ranges(entry, f"{key}[{i}].", check)
        elif numeric_type(hint):
            rng, integer = declared_range(type(obj), f.name), numeric_type(hint) is int
            numbers = [(f"{key}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else [(key, value)]
            for k, v in numbers:
                check(rng.admits(v), k, v, rng.describe(integer))


def _check_order(entries: list[Any], by: str | None, key: str, check: Check) -> None:
    if not by:
        return
    for i in range(1, len(entries)):
        before, now = getattr(entries[i - 1], by), getattr(entries[i], by)
        check(now >= before, f"{key}[{i}].{by}", now, f"entries listed in order of {by} (>= {before} of entry {i - 1})")


def to_dict(c: DataclassInstance) -> dict[str, Any]:
    # What OmegaConf.to_container(OmegaConf.structured(c)) gives for a loaded scenario (a test checks
    # every shipped one), without building a DictConfig: the server takes it twice before round 0.
    return asdict(c)


@overload
def from_dict(d: dict[str, Any]) -> Scenario: ...
@overload
def from_dict(d: dict[str, Any], cls: type[T]) -> T: ...


def from_dict(d: dict[str, Any], cls: type = Scenario) -> Any:
    """`cls` from to_dict's plain data, as the server sends it to its workers: a worker's Scenario leaves
    the policies' sections out, a missing key takes its default. The data is a validated scenario's, so
    it is not checked again (run.json is, by emulator.config.from_dict); OmegaConf would build the same,
    and the workers need not import it (a test compares the two on every shipped scenario)."""
    hints = _field_types(cls)
    return cls(**{name: _plain_value(hints[name], v) for name, v in d.items() if name in hints})


@cache
def _field_types(cls: type) -> dict[str, Any]:
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls) if f.init}


def _plain_value(tp: Any, value: Any) -> Any:
    if is_dataclass(tp):
        return from_dict(value, cast(type, tp))
    if get_origin(tp) is list:
        (item,) = get_args(tp)
        return [_plain_value(item, v) for v in value]
    if get_origin(tp) is dict:
        return dict(value)
    return value

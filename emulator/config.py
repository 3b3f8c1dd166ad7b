"""Scenario schema: typed dataclasses with defaults, loaded from YAML plus dotted overrides.

OmegaConf does the merging and type checking (unknown keys, wrong types); `validate`
checks every number against its key's `Range` (RANGES, one walker over the schema) and then
what the keys mean together. Scenario files are read bounded (size, nesting, alias expansion)
and strict (UTF-8, no duplicate keys). Every failure becomes one `ConfigError` naming the key,
the bad value and what was expected.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass
from functools import reduce
from pathlib import Path
from typing import List, Optional, get_args, get_origin, get_type_hints

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from emulator import untrusted_yaml

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"


class ConfigError(ValueError):
    """Bad scenario input; the message is one line naming the key."""


SHOWN_CHARS = 80   # of a key or value echoed in an error


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` cut to `limit` characters, so an error stays one readable line whatever the input."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _check(ok: bool, key: str, value, expected: str):
    if not ok:
        raise ConfigError(f"{clip(key)} = {clip(repr(value))}: expected {expected}")


def _f(default, help: str, factory=None):
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


# --- per-client quantities -------------------------------------------------------------

@dataclass
class Dist:
    """A per-client quantity, drawn once per client from the client's own RNG stream."""
    kind: str = _f("constant", "constant | lognormal | uniform | list")
    value: float = _f(0.0, "the value when kind=constant")
    median: float = _f(0.0, "median when kind=lognormal")
    sigma: float = _f(0.0, "log-space standard deviation when kind=lognormal")
    low: float = _f(0.0, "lower bound when kind=uniform")
    high: float = _f(0.0, "upper bound when kind=uniform")
    values: List[float] = _f(None, "one value per client when kind=list (cycled)", list)


def const(v: float):
    return lambda: Dist(kind="constant", value=v)


@dataclass
class SchedulePoint:
    t: float = _f(0.0, "virtual time (s) from which the factor applies")
    factor: float = _f(1.0, "bandwidth multiplier from t on (piecewise constant)")


@dataclass
class Outage:
    clients: List[int] = _f(None, "client ids the window applies to (empty = all)", list)
    start: float = _f(0.0, "outage start, virtual seconds")
    end: float = _f(0.0, "outage end, virtual seconds")


@dataclass
class DropoutConfig:
    model: str = _f("none", "none | bernoulli | gilbert_elliott")
    p: float = _f(0.0, "bernoulli: loss probability per transfer")
    p_good_to_bad: float = _f(0.1, "gilbert_elliott: P(good -> bad) per transfer")
    p_bad_to_good: float = _f(0.5, "gilbert_elliott: P(bad -> good) per transfer")
    loss_good: float = _f(0.0, "gilbert_elliott: loss probability in the good state")
    loss_bad: float = _f(1.0, "gilbert_elliott: loss probability in the bad state")
    direction: str = _f("both", "which transfers can be lost: up | down | both")
    outages: List[Outage] = _f(None, "scheduled outage windows; a transfer overlapping one is lost", list)


@dataclass
class LinksConfig:
    down_bps: Dist = _f(None, "download bandwidth per client, bits/s", const(20e6))
    up_bps: Dist = _f(None, "upload bandwidth per client, bits/s", const(5e6))
    latency_s: Dist = _f(None, "one-way latency per transfer, seconds", const(0.05))
    schedule: List[SchedulePoint] = _f(None, "piecewise-constant bandwidth factor over virtual time (all clients)", list)
    server_down_bps: float = _f(0.0, "shared server egress capacity, bits/s, split fairly among concurrent downloads (0 = unlimited)")
    server_up_bps: float = _f(0.0, "shared server ingress capacity, bits/s, split fairly among concurrent uploads (0 = unlimited)")
    dropout: DropoutConfig = _f(None, "link losses", DropoutConfig)


@dataclass
class ComputeConfig:
    step_s: Dist = _f(None, "virtual seconds per DP-SGD step per client", const(0.05))


# --- learning ---------------------------------------------------------------------------

@dataclass
class ClientGroup:
    clients: int = _f(1, "number of consecutive clients in the group (groups are listed in client-id order)")
    samples: int = _f(1, "training samples of every client in the group")


@dataclass
class QualityRule:
    clients: List[int] = _f(None, "client ids the rule applies to (or use client_range)", list)
    client_range: List[int] = _f(None, "[first, stop): the clients first..stop-1 (instead of clients)", list)
    from_round: int = _f(0, "first round (0-based) the rule applies to; a later from_round overrides")
    salt_pepper: float = _f(0.0, "share of pixels set to 0 or 1 (half each), in [0, 1]")
    label_noise: float = _f(0.0, "share of labels replaced by a random wrong label, in [0, 1]")


@dataclass
class DataConfig:
    dataset: str = _f("synthetic", "synthetic | fashion_mnist | mnist | cifar10")
    root: str = _f("", "directory holding the dataset files, searched before the standard locations")
    cache_dir: str = _f("~/.cache/dpfl-emulator", "where downloaded datasets are kept")
    download: bool = _f(True, "download a missing dataset from its official source (checksum-verified)")
    alpha: float = _f(1.0, "synthetic: model heterogeneity alpha of Synthetic(alpha, beta)")
    beta: float = _f(1.0, "synthetic: data heterogeneity beta of Synthetic(alpha, beta)")
    dim: int = _f(60, "synthetic: input dimension")
    classes: int = _f(10, "synthetic: number of classes")
    samples_per_client: int = _f(200, "synthetic: mean samples per client (lognormal sizes)")
    size_sigma: float = _f(0.5, "synthetic: log-space standard deviation of per-client sample counts (0 = equal sizes)")
    test_fraction: float = _f(0.2, "synthetic: share of generated samples held out for the server's test set")
    normalize: str = _f("standard", "image datasets: standard (per-channel mean/std of the training set) | "
                                    "half ((x - 0.5) / 0.5, the ALI-DPFL code) | none (pixels in [0, 1])")
    split: str = _f("official", "image datasets: official (training set -> clients, test set -> server) | per_client "
                                "(train+test pooled, partitioned, each share split train/test; the server tests "
                                "on the union of the clients' test shares: the ALI-DPFL code)")
    client_train_fraction: float = _f(0.75, "split=per_client: share of each client's samples kept for training")
    partition: str = _f("iid", "image datasets: iid | dirichlet | dirichlet_capped (the ALI-DPFL code's, "
                               "no client beyond N/clients) | shards | quantity")
    partition_seed: int = _f(-1, "-1 = the partition follows seed; N >= 0 = a fixed partition from numpy's "
                                 "legacy RandomState(N) (the ALI-DPFL code's files: 1)")
    dirichlet_beta: float = _f(0.5, "concentration of Dir(beta) label skew")
    shards_per_client: int = _f(2, "partition=shards: label-sorted shards per client")
    groups: List[ClientGroup] = _f(None, "partition=quantity: client groups with an exact sample count each", list)
    quality: List[QualityRule] = _f(None, "data-quality corruption rules (salt-and-pepper, label noise) by client and round", list)
    min_samples: int = _f(10, "each client gets at least this many samples")
    max_train: int = _f(0, "image datasets: use only the first N training samples (0 = all)")
    max_test: int = _f(0, "image datasets: use only the first N test samples (0 = all)")


@dataclass
class ModelConfig:
    name: str = _f("logreg", "logreg | linreg | mlp | mlp_talaei | mlp_wei | cnn_fmnist | cnn_cifar | cnn_fedavg")
    hidden: int = _f(64, "mlp: hidden units (mlp_talaei and mlp_wei have fixed sizes)")


@dataclass
class ClientsConfig:
    n: int = _f(10, "number of logical clients")
    select: str = _f("all", "client selection: all | uniform | round_robin")
    per_round: int = _f(0, "clients per round for uniform / round_robin (0 = all)")


@dataclass
class DPConfig:
    q: float = _f(0.05, "Poisson sampling rate per local step, in (0, 1]")
    sigma: float = _f(1.0, "noise multiplier (0 = no noise)")
    clip: float = _f(1.0, "per-sample clipping norm C (0 = no clipping; needs sigma = 0)")
    lr: float = _f(0.1, "local learning rate eta")
    tau: int = _f(5, "local DP-SGD steps per round")
    epsilon: float = _f(math.inf, "per-client privacy budget epsilon (inf = unlimited)")
    delta: float = _f(1e-5, "delta of (epsilon, delta)-DP")
    conversion: str = _f("improved", "RDP -> (epsilon, delta): improved (Opacus) | classic (ALI-DPFL Thm 2)")
    batch_divisor: float = _f(0.0, "the noisy gradient sum is divided by: 0 = the expected batch q|D_i| (Opacus) | "
                                   "N > 0 = a fixed N (the ALI-DPFL code: its batch_size, 64)")
    empty_batch: str = _f("noise", "an empty Poisson batch: noise = a noise-only step (as the RDP analysis assumes) | "
                                   "skip = no step (the ALI-DPFL code's sampler)")
    per_sample: str = _f("auto", "how clipped per-sample gradients are formed, equal up to float rounding: "
                                 "bk = book-keeping, one backward pass (Linear/Conv2d models) | hooks = Opacus's "
                                 "per-sample gradients | auto = bk where it applies (fastest, bench.dp_step)")
    batch_eval: int = _f(1024, "batch size for evaluation")


@dataclass
class ImpactPhase:
    from_round: int = _f(0, "first round the phase applies to")
    kind: str = _f("uniform", "uniform | data_size | explicit")
    values: List[float] = _f(None, "kind=explicit: one factor per client, summing to 1", list)


@dataclass
class ImpactConfig:
    kind: str = _f("data_size", "impact factors p_i: uniform | data_size | explicit | schedule")
    values: List[float] = _f(None, "kind=explicit: one factor per client, summing to 1", list)
    schedule: List[ImpactPhase] = _f(None, "kind=schedule: phases by round", list)


# --- run --------------------------------------------------------------------------------

@dataclass
class BudgetConfig:
    rounds: int = _f(20, "R_s: maximum number of rounds")
    time_s: float = _f(math.inf, "virtual-time budget, seconds")
    bytes: float = _f(math.inf, "total bytes over all links")


@dataclass
class RoundConfig:
    deadline_s: float = _f(math.inf, "an update arriving later than round start + deadline is late")


@dataclass
class TransportConfig:
    address: str = _f("", "server address; empty = an ipc:// socket in a private (0700) directory, the only one "
                          "without CURVE; tcp://HOST:PORT or ipc://PATH are authenticated (a key pair per run "
                          "for the workers the server starts; keys_dir for others, and for a non-loopback HOST)")
    max_message_bytes: int = _f(256 * 2**20, "largest message accepted from the wire")
    worker_timeout_s: float = _f(600.0, "real seconds without a reply before a busy worker is declared dead")
    heartbeat_s: float = _f(2.0, "real seconds between worker heartbeats; 10 missed in a row = a dead worker")
    max_restarts: int = _f(3, "restarts of each local worker slot after crashes or hangs before it is given up")
    curve: bool = _f(False, "require keygen's CURVE keys (keys_dir) whatever the address")
    keys_dir: str = _f("", "CURVE keys from python -m emulator keygen DIR (server key pair, authorized/ workers)")
    wire_log: bool = _f(False, "workers log the size of every frame they receive and send (wire.jsonl)")
    min_workers: int = _f(0, "ready workers (local and joined by hand) to wait for before the first round")


@dataclass
class OutputConfig:
    dir: str = _f("runs", "parent directory of run directories")
    name: str = _f("", "run directory name (empty = timestamp)")
    progress: bool = _f(True, "show a progress bar")


# --- policies (each section is read only by its policy) ----------------------------------

@dataclass
class AliDpflConfig:
    gamma: float = _f(0.0, "Gamma of eq. 9, the data heterogeneity (paper: 10 Dir(0.05), 5 Dir(0.5), 1 Dir(1), 0 IID)")
    mu_estimate: str = _f("gradient", "mu of eq. 9: gradient (§IV-B, full local gradients) | last_step (the authors' "
                                      "code: last step's change of w_i over ||w_i - w_new||)")
    gamma_estimate: str = _f("fixed", "Gamma of eq. 9: fixed (ali_dpfl.gamma, as the paper) | loss_change (the authors' "
                                      "code: |sum p_i loss change of the last step|, every round)")


@dataclass
class AdapDpflConfig:
    decay: float = _f(0.9, "the noise multiplier is multiplied by this, in (0, 1), when the loss stalls")
    patience: int = _f(4, "rounds without a new lowest test loss before sigma decays")


@dataclass
class FuTuningConfig:
    mechanism: str = _f("gaussian", "output noise: laplace (Thm 1, z = 2) | gaussian (Thm 2, z = 1); dp.clip is xi")
    local_iters: int = _f(0, "E local iterations per round (0 = round(T^(z/(z+1))) from iterations)")
    iterations: int = _f(0, "T, total local iterations: sets E when local_iters = 0 and caps rounds at T/E (0 = no cap)")


@dataclass
class PadpflConfig:
    bound: float = _f(10.0, "B: clients clip their weights to ||x_i|| <= B before upload (eq. 7)")
    prox_mu: float = _f(0.01, "FedProx proximal coefficient mu of eq. 4")
    revelations: int = _f(0, "R: most uploads per client, R <= T = R_s (0 = ceil(R_s * per_round / n))")


@dataclass
class UdpCrdConfig:
    crd: bool = _f(True, "communication-rounds discounting (Alg. 2); false = UDP with a fixed horizon (Alg. 1)")
    horizon: int = _f(0, "initial T, communication rounds (0 = R_s)")
    zeta: float = _f(0.001, "discount when the test loss improves by less than zeta: V(w_t) - V(w_t+1) < zeta")
    beta: float = _f(0.9, "discount factor in (0, 1): T = floor(beta (T - t)) + t")


@dataclass
class Scenario:
    name: str = _f("default", "scenario name")
    seed: int = _f(0, "the one seed that drives everything")
    policy: str = _f("fedavg_dp", "server policy")
    workers: int = _f(0, "worker processes (0 = one per CPU core)")
    device: str = _f("auto", "auto | cpu | cuda")
    data: DataConfig = _f(None, "dataset and partition", DataConfig)
    model: ModelConfig = _f(None, "model", ModelConfig)
    clients: ClientsConfig = _f(None, "clients and selection", ClientsConfig)
    dp: DPConfig = _f(None, "client-side DP-SGD", DPConfig)
    links: LinksConfig = _f(None, "network links", LinksConfig)
    compute: ComputeConfig = _f(None, "client compute speed", ComputeConfig)
    impact: ImpactConfig = _f(None, "aggregation impact factors", ImpactConfig)
    budget: BudgetConfig = _f(None, "budgets; the run stops at the first exhausted", BudgetConfig)
    round: RoundConfig = _f(None, "round timing", RoundConfig)
    transport: TransportConfig = _f(None, "ZeroMQ transport", TransportConfig)
    output: OutputConfig = _f(None, "results", OutputConfig)
    ali_dpfl: AliDpflConfig = _f(None, "policy=ali_dpfl (ALI-DPFL Alg. 2)", AliDpflConfig)
    adap_dpfl: AdapDpflConfig = _f(None, "policy=adap_dpfl (Adap DP-FL baseline)", AdapDpflConfig)
    fu_tuning: FuTuningConfig = _f(None, "policy=fu_tuning (Fu et al. Alg. 1)", FuTuningConfig)
    padpfl: PadpflConfig = _f(None, "policy=padpfl (Talaei & Izadi)", PadpflConfig)
    udp_crd: UdpCrdConfig = _f(None, "policy=udp_crd (Wei et al. Alg. 2)", UdpCrdConfig)


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

    def admits(self, v) -> bool:
        if v == math.inf:
            return bool(self.inf)
        above = v > self.low if self.low_open else v >= self.low   # NaN fails every comparison
        below = v < self.high if self.high_open else v <= self.high
        return above and below

    def describe(self, integer: bool) -> str:
        what = "an integer" if integer else "a number"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        text = f"{what} in {left}{_bound(self.low)}, {_bound(self.high)}{right}"
        return f"{text} or inf ({self.inf})" if self.inf else text


def _bound(x) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


MAX_CLIENTS = 10**6
MAX_ROUNDS = 10**6
MAX_STEPS = 10**6          # local steps per round (dp.tau, fu_tuning.local_iters)
MAX_SAMPLES = 10**8        # per client
MAX_WORKERS = 1024
MAX_SECONDS = 1e12         # virtual time (about 31,700 years)
MAX_QUANTITY = 1e15        # a per-client bandwidth (bits/s) or duration (s)
MAX_PARAMETER = 1e6        # learning rate, noise multiplier, clipping norm and other scalars

PROBABILITY = Range(0, 1)
OPEN_UNIT = Range(0, 1, low_open=True, high_open=True)
QUANTITY = Range(0, MAX_QUANTITY)
TIME = Range(0, MAX_SECONDS)
ROUND = Range(0, MAX_ROUNDS)
CLIENT_ID = Range(0, MAX_CLIENTS - 1)
NON_NEGATIVE = Range(0, MAX_PARAMETER)
POSITIVE = Range(0, MAX_PARAMETER, low_open=True)
FINITE = Range(-math.inf, math.inf, low_open=True, high_open=True)   # also for a key with no declared range

RANGES: dict[type, dict[str, Range]] = {
    Dist: dict(value=QUANTITY, median=QUANTITY, sigma=Range(0, 10), low=QUANTITY, high=QUANTITY, values=QUANTITY),
    SchedulePoint: dict(t=TIME, factor=Range(1e-6, 1e6)),
    Outage: dict(clients=CLIENT_ID, start=TIME, end=TIME),
    DropoutConfig: dict(p=PROBABILITY, p_good_to_bad=PROBABILITY, p_bad_to_good=PROBABILITY,
                        loss_good=PROBABILITY, loss_bad=PROBABILITY),
    LinksConfig: dict(server_down_bps=QUANTITY, server_up_bps=QUANTITY),
    ClientGroup: dict(clients=Range(1, MAX_CLIENTS), samples=Range(1, MAX_SAMPLES)),
    QualityRule: dict(clients=CLIENT_ID, client_range=Range(0, MAX_CLIENTS), from_round=ROUND,
                      salt_pepper=PROBABILITY, label_noise=PROBABILITY),
    DataConfig: dict(alpha=Range(0, 1e3), beta=Range(0, 1e3), dim=Range(1, 10**6), classes=Range(2, 10**5),
                     samples_per_client=Range(1, MAX_SAMPLES), size_sigma=Range(0, 10), test_fraction=OPEN_UNIT,
                     dirichlet_beta=POSITIVE, shards_per_client=Range(1, 10**6), min_samples=Range(1, MAX_SAMPLES),
                     max_train=Range(0, 10**9), max_test=Range(0, 10**9), client_train_fraction=OPEN_UNIT,
                     partition_seed=Range(-1, 2**32 - 1)),   # RandomState takes seeds below 2^32
    ModelConfig: dict(hidden=Range(1, 10**9)),
    ClientsConfig: dict(n=Range(1, MAX_CLIENTS), per_round=Range(0, MAX_CLIENTS)),
    DPConfig: dict(q=Range(0, 1, low_open=True), sigma=NON_NEGATIVE, clip=NON_NEGATIVE, lr=POSITIVE,
                   tau=Range(1, MAX_STEPS), epsilon=Range(0, MAX_PARAMETER, low_open=True, inf="unlimited"),
                   delta=OPEN_UNIT, batch_eval=Range(1, 10**7), batch_divisor=Range(0, 10**9)),
    ImpactPhase: dict(from_round=ROUND, values=PROBABILITY),
    ImpactConfig: dict(values=PROBABILITY),
    BudgetConfig: dict(rounds=Range(1, MAX_ROUNDS), time_s=Range(0, MAX_SECONDS, low_open=True, inf="unlimited"),
                       bytes=Range(0, 1e18, low_open=True, inf="unlimited")),
    RoundConfig: dict(deadline_s=Range(0, MAX_SECONDS, low_open=True, inf="no deadline")),
    TransportConfig: dict(max_message_bytes=Range(1024, 2**40), worker_timeout_s=Range(0.1, 1e7),
                          heartbeat_s=Range(0.01, 3600.0), max_restarts=Range(0, 1000),
                          min_workers=Range(0, MAX_WORKERS)),
    Scenario: dict(seed=Range(0, 2**64 - 1), workers=Range(0, MAX_WORKERS)),
    AliDpflConfig: dict(gamma=NON_NEGATIVE),
    AdapDpflConfig: dict(decay=OPEN_UNIT, patience=Range(1, MAX_ROUNDS)),
    FuTuningConfig: dict(local_iters=Range(0, MAX_STEPS), iterations=Range(0, 10**9)),   # E <= T^(2/3) <= 10^6
    PadpflConfig: dict(bound=POSITIVE, prox_mu=NON_NEGATIVE, revelations=ROUND),
    UdpCrdConfig: dict(horizon=ROUND, zeta=FINITE, beta=OPEN_UNIT),   # zeta is only compared: 1e9 = always
}
# Lists whose entries must be listed in order of a field (ties keep the later-listed entry).
ORDERED_BY: dict[type, dict[str, str]] = {
    LinksConfig: dict(schedule="t"),
    ImpactConfig: dict(schedule="from_round"),
    DropoutConfig: dict(outages="start"),
}


def declared_range(cls: type, name: str) -> Range:
    return RANGES.get(cls, {}).get(name, FINITE)


def numeric_type(hint) -> type | None:
    """int or float for a number or a list of numbers; None for anything else (bool is not a number here)."""
    if get_origin(hint) is list:
        hint = get_args(hint)[0]
    return hint if hint in (int, float) else None


def list_entry_type(hint) -> type | None:
    """The dataclass of a list-of-dataclass field, else None."""
    if get_origin(hint) is list and is_dataclass(get_args(hint)[0]):
        return get_args(hint)[0]
    return None


def check_ranges(obj, prefix: str = "", check=_check) -> None:
    """Every number in `obj`, nested sections and list entries included, against its declared Range."""
    hints = get_type_hints(type(obj))
    for f in fields(obj):
        key, value, hint = prefix + f.name, getattr(obj, f.name), hints[f.name]
        if is_dataclass(value):
            check_ranges(value, key + ".", check)
        elif list_entry_type(hint):
            _check_order(value, ORDERED_BY.get(type(obj), {}).get(f.name), key, check)
            for i, entry in enumerate(value):
                check_ranges(entry, f"{key}[{i}].", check)
        elif numeric_type(hint):
            rng, integer = declared_range(type(obj), f.name), numeric_type(hint) is int
            numbers = [(f"{key}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else [(key, value)]
            for k, v in numbers:
                check(rng.admits(v), k, v, rng.describe(integer))


def _check_order(entries: list, by: str | None, key: str, check) -> None:
    if not by:
        return
    for i in range(1, len(entries)):
        before, now = getattr(entries[i - 1], by), getattr(entries[i], by)
        check(now >= before, f"{key}[{i}].{by}", now, f"entries listed in order of {by} (>= {before} of entry {i - 1})")


# --- loading ----------------------------------------------------------------------------

MAX_SCENARIO_BYTES = 2**20   # scenarios are a few KiB
PROBLEM_CHARS = 200


def resolve_scenario_path(name: str) -> Path:
    if not name:
        raise ConfigError("scenario= has no value: expected a path or a name from scenarios/")
    p = Path(name)
    for cand in (p, SCENARIO_DIR / p, SCENARIO_DIR / f"{name}.yaml"):
        try:
            if cand.is_file():
                return cand
        except OSError as e:   # e.g. a name too long for the file system
            raise ConfigError(f"scenario={clip(name)}: {e.strerror or e}") from None
    raise ConfigError(f"scenario={clip(name)}: file not found (looked in ./ and {SCENARIO_DIR}/)")


def read_scenario(name: str) -> dict:
    """The scenario file's keys: UTF-8 YAML of bounded size and shape, one plain mapping without
    duplicate keys (see untrusted_yaml)."""
    path, where = resolve_scenario_path(name), f"scenario={clip(name)}"
    text = _read_text(path, where)
    try:
        problem = untrusted_yaml.shape_problem(text)
        data = None if problem else yaml.load(text, Loader=untrusted_yaml.StrictLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{where}: malformed YAML{line}: "
                          f"{clip(str(getattr(e, 'problem', None) or e), PROBLEM_CHARS)}") from None
    if problem:
        raise ConfigError(f"{where}: the YAML {clip(problem, PROBLEM_CHARS)}")
    if data is None:
        raise ConfigError(f"{where}: the file is empty; expected a mapping of keys")
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of keys at top level, got {type(data).__name__}")
    problem = untrusted_yaml.plain_problem(data)
    if problem:
        raise ConfigError(f"{where}: {clip(problem, PROBLEM_CHARS)}")
    return data


def _read_text(path: Path, where: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SCENARIO_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{where}: cannot read the file: {e.strerror or e}") from None
    if len(raw) > MAX_SCENARIO_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_SCENARIO_BYTES // 2**10} KiB; expected a scenario of a few KiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None


def split_args(args: List[str]) -> tuple[Optional[str], List[str]]:
    """The command line's `scenario=NAME` apart from its dotted overrides (their order kept)."""
    scenario, overrides = None, []
    for a in args:
        if a.startswith("scenario="):
            scenario = a.split("=", 1)[1]
        else:
            overrides.append(a)
    return scenario, overrides


def _override_key(item: str) -> str:
    """The key of `key=value`, once the value is known not to nest or expand too far."""
    if "=" not in item:
        raise ConfigError(f"{clip(item)}: expected key=value")
    key, value = item.split("=", 1)
    try:
        problem = untrusted_yaml.shape_problem(value)
    except yaml.YAMLError:
        problem = ""   # not YAML: OmegaConf reports it, or takes it as text
    if problem:
        raise ConfigError(f"{clip(key)}: the YAML value {clip(problem, PROBLEM_CHARS)}")
    return key


def load(scenario: Optional[str] = None, overrides: List[str] = ()) -> Scenario:
    """Schema defaults <- scenario YAML <- each dotted override in turn, then `validate`."""
    cfg = OmegaConf.structured(Scenario)
    if scenario is not None:
        data = read_scenario(scenario)
        cfg = _merged(cfg, lambda: data, f"scenario={clip(scenario)}")
    for item in overrides:
        key = _override_key(item)
        cfg = _merged(cfg, lambda: OmegaConf.to_container(OmegaConf.from_dotlist([item])), clip(key))
    try:
        checked: Scenario = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(_omegaconf_message(e)) from None
    validate(checked)
    return checked


def _merged(cfg, layer, source: str):
    """cfg with the dict `layer()` merged in; a failure names its key, or else `source`."""
    try:
        data = layer()
        _check_list_entries(data)
        return OmegaConf.merge(cfg, data)
    except ConfigError:
        raise
    except OmegaConfBaseException as e:
        raise ConfigError(_omegaconf_message(e, fallback=source)) from None
    except Exception as e:   # OmegaConf lets assorted errors through on odd keys (`[=1`, `a.0.b=1`)
        raise ConfigError(f"{source}: {clip(str(e) or type(e).__name__, PROBLEM_CHARS)}") from None


def _check_list_entries(data: dict, cls: type = Scenario, prefix: str = "") -> None:
    """Type-check every entry of a list-of-sections on its own, so an error names it in full
    (`data.groups[1].clients`): OmegaConf reports a bad entry by its field name alone."""
    hints = get_type_hints(cls)
    for f in fields(cls):
        value, key, hint = data.get(f.name), prefix + f.name, hints[f.name]
        if is_dataclass(hint) and isinstance(value, dict):
            _check_list_entries(value, hint, key + ".")
        elif list_entry_type(hint) and isinstance(value, list):
            for i, item in enumerate(value):
                try:
                    OmegaConf.merge(OmegaConf.structured(list_entry_type(hint)), item)
                except OmegaConfBaseException as e:
                    raise ConfigError(_omegaconf_message(e, prefix=f"{key}[{i}].")) from None
                except (TypeError, ValueError):
                    raise ConfigError(f"{key}[{i}] = {clip(repr(item))}: expected a section of "
                                      f"{', '.join(g.name for g in fields(list_entry_type(hint)))}") from None


def _omegaconf_message(e: OmegaConfBaseException, prefix: str = "", fallback: str = "?") -> str:
    full_key = getattr(e, "full_key", None)
    key = clip(prefix + str(full_key)) if full_key else fallback
    msg = str(e).splitlines()[0]
    if "not in" in msg:
        return f"{key}: unknown key (see python -m emulator --help)"
    value = clip(repr(getattr(e, "value", None)))
    hint = ""
    if "could not be converted" in msg:
        want = msg.rsplit("to ", 1)[-1]
        hint = f"expected {want.lower()}"
    return f"{key} = {value}: {hint or clip(msg, PROBLEM_CHARS)}"


def _check_dist(d: Dist, key: str, minimum: float, unit: str):
    """The values d's kind uses are at least `minimum` (their Range already bounds them)."""
    kinds = ("constant", "lognormal", "uniform", "list")
    _check(d.kind in kinds, f"{key}.kind", d.kind, " | ".join(kinds))
    at_least = f"a number >= {minimum:g} ({unit})"
    if d.kind == "constant":
        _check(d.value >= minimum, f"{key}.value", d.value, at_least)
    elif d.kind == "lognormal":
        _check(d.median > 0 and d.median >= minimum, f"{key}.median", d.median,
               at_least if minimum else f"a number > 0 ({unit})")
    elif d.kind == "uniform":
        _check(d.low >= minimum, f"{key}.low", d.low, at_least)
        _check(d.high >= d.low, f"{key}.high", d.high, f"a number >= low ({d.low})")
    else:
        _check(len(d.values) > 0, f"{key}.values", d.values, f"a non-empty list of numbers >= {minimum:g} ({unit})")
        for i, v in enumerate(d.values):
            _check(v >= minimum, f"{key}.values[{i}]", v, at_least)


def _check_factors(values: List[float], n: int, key: str):
    _check(len(values) == n, key, values, f"{n} values, one per client")
    _check(abs(sum(values) - 1.0) < 1e-6, key, values, f"impact factors summing to 1 (sum is {sum(values):.6g})")


def parse_tcp(address: str) -> tuple[str, int]:
    """(host, port) of tcp://HOST:PORT (an IPv6 host in brackets); ValueError if malformed."""
    host, sep, port = address[len("tcp://"):].rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(address)
    return host, int(port)


def _address_ok(address: str) -> bool:
    if address.startswith("tcp://"):
        try:
            parse_tcp(address)
        except ValueError:
            return False
        return True
    return address == "" or (address.startswith("ipc://") and len(address) > len("ipc://"))


NAME_MAX = 255          # bytes of one file name on Linux file systems
PATH_BYTES_MAX = 3500   # PATH_MAX (4096) less a run name and the files a run writes below it
PATH_KEYS = ("data.root", "data.cache_dir", "transport.keys_dir", "output.dir")   # file system paths


def _path_ok(text: str) -> bool:
    """A path the file system can take: not too long, no component too long, no NUL."""
    return ("\0" not in text and len(text.encode()) <= PATH_BYTES_MAX
            and all(len(part.encode()) <= NAME_MAX for part in Path(text).parts))


def _run_name_ok(name: str) -> bool:
    """A single directory name inside output.dir: nothing that could climb out of it."""
    return name == "" or (name not in (".", "..") and not any(c in name for c in "/\\\0")
                          and len(name.encode()) <= NAME_MAX)


def validate(c: Scenario) -> None:
    """Ranges of every number first (one walker over the schema), then what the keys mean together."""
    check_ranges(c)
    from emulator.policies import POLICIES
    _check(c.policy in POLICIES, "policy", c.policy, " | ".join(sorted(POLICIES)))
    _check(c.device in ("auto", "cpu", "cuda"), "device", c.device, "auto | cpu | cuda")
    _check(c.clients.select in ("all", "uniform", "round_robin"), "clients.select", c.clients.select,
           "all | uniform | round_robin")
    _check(c.clients.per_round <= c.clients.n, "clients.per_round", c.clients.per_round,
           f"an integer in [0, clients.n={c.clients.n}]")
    dp = c.dp
    _check(dp.clip > 0 or dp.sigma == 0, "dp.clip", dp.clip, "a clipping norm > 0 when dp.sigma > 0")
    _check(dp.conversion in ("improved", "classic"), "dp.conversion", dp.conversion, "improved | classic")
    _check(dp.empty_batch in ("noise", "skip"), "dp.empty_batch", dp.empty_batch, "noise | skip")
    _check(dp.epsilon == math.inf or dp.sigma > 0, "dp.sigma", dp.sigma,
           "a noise multiplier > 0 when dp.epsilon is finite")
    _validate_links(c)
    _check_dist(c.compute.step_s, "compute.step_s", 0, "seconds")
    _validate_impact(c)
    _validate_names(c)
    _validate_policies(c)
    from nodes.data import validate_data
    validate_data(c.data, c.clients.n, _check)
    _validate_model(c)


def _validate_names(c: Scenario) -> None:
    """The address, the run name and every path: well-formed, and nothing that leaves output.dir."""
    a = c.transport.address
    _check(_address_ok(a), "transport.address", a, "'' | ipc://PATH | tcp://HOST:PORT with PORT in 1..65535")
    _check(_run_name_ok(c.output.name), "output.name", c.output.name,
           f"a directory name of at most {NAME_MAX} bytes without '/', '\\' or '..' (empty = a timestamp)")
    for key in PATH_KEYS:
        value = reduce(getattr, key.split("."), c)
        _check(_path_ok(value), key, value, f"a path of at most {PATH_BYTES_MAX} bytes, {NAME_MAX} per name")
    from nodes.keys import exposure_problem
    problem = exposure_problem(a, c.transport.curve, c.transport.keys_dir)
    if problem:
        raise ConfigError(problem)


def _validate_model(c: Scenario) -> None:
    """A known model, defined for the shape of the data's samples."""
    from nodes.data import sample_shape
    from nodes.dp_step import PER_SAMPLE_PATHS
    from nodes.models import MODELS, designed_inputs
    _check(c.model.name in MODELS, "model.name", c.model.name, " | ".join(sorted(MODELS)))
    _check(c.dp.per_sample in PER_SAMPLE_PATHS, "dp.per_sample", c.dp.per_sample, " | ".join(PER_SAMPLE_PATHS))
    shape, wanted = sample_shape(c.data), designed_inputs(c.model.name)
    _check(wanted is None or shape in wanted, "model.name", c.model.name,
           f"a model for data.dataset={c.data.dataset}, whose samples have shape {shape} "
           f"({c.model.name} is defined for input {' or '.join(map(str, wanted or ()))})")


def _validate_links(c: Scenario) -> None:
    L = c.links
    _check_dist(L.down_bps, "links.down_bps", 1, "bits/s")
    _check_dist(L.up_bps, "links.up_bps", 1, "bits/s")
    _check_dist(L.latency_s, "links.latency_s", 0, "seconds")
    for k in ("server_down_bps", "server_up_bps"):
        v = getattr(L, k)
        _check(v == 0 or v >= 1, f"links.{k}", v, "0 (unlimited) or a capacity >= 1 bit/s")
    d = L.dropout
    _check(d.model in ("none", "bernoulli", "gilbert_elliott"), "links.dropout.model", d.model,
           "none | bernoulli | gilbert_elliott")
    _check(d.direction in ("up", "down", "both"), "links.dropout.direction", d.direction, "up | down | both")
    for i, o in enumerate(d.outages):
        _check(o.end > o.start, f"links.dropout.outages[{i}].end", o.end, f"a time > start ({o.start})")
        bad = [k for k in o.clients if not 0 <= k < c.clients.n]
        _check(not bad, f"links.dropout.outages[{i}].clients", o.clients, f"client ids in [0, {c.clients.n})")


def _validate_impact(c: Scenario) -> None:
    imp = c.impact
    _check(imp.kind in ("uniform", "data_size", "explicit", "schedule"), "impact.kind", imp.kind,
           "uniform | data_size | explicit | schedule")
    if imp.kind == "explicit":
        _check_factors(imp.values, c.clients.n, "impact.values")
    if imp.kind == "schedule":
        _check(len(imp.schedule) > 0, "impact.schedule", imp.schedule, "at least one phase")
        for i, ph in enumerate(imp.schedule):
            _check(ph.kind in ("uniform", "data_size", "explicit"), f"impact.schedule[{i}].kind", ph.kind,
                   "uniform | data_size | explicit")
            if ph.kind == "explicit":
                _check_factors(ph.values, c.clients.n, f"impact.schedule[{i}].values")


def _validate_policies(c: Scenario) -> None:
    _check(c.ali_dpfl.mu_estimate in ("gradient", "last_step"), "ali_dpfl.mu_estimate", c.ali_dpfl.mu_estimate,
           "gradient | last_step")
    _check(c.ali_dpfl.gamma_estimate in ("fixed", "loss_change"), "ali_dpfl.gamma_estimate",
           c.ali_dpfl.gamma_estimate, "fixed | loss_change")
    fu = c.fu_tuning
    _check(fu.mechanism in ("laplace", "gaussian"), "fu_tuning.mechanism", fu.mechanism, "laplace | gaussian")
    if c.policy == "fu_tuning":
        _check(fu.local_iters > 0 or fu.iterations > 0, "fu_tuning.iterations", fu.iterations,
               "T > 0 when fu_tuning.local_iters = 0 (E = round(T^(z/(z+1))))")
    if c.policy in ("fu_tuning", "udp_crd"):
        _check(c.dp.clip > 0, "dp.clip", c.dp.clip, f"a gradient clipping bound > 0 (policy={c.policy})")


def to_dict(c: Scenario) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(c), resolve=True)


def from_dict(d: dict) -> Scenario:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Scenario), OmegaConf.create(d)))


def help_text() -> str:
    """One line per key: dotted name, default (of the default instance, so Dist defaults are real),
    meaning and, for numbers, the admitted range; list entries as key[i].field."""
    lines = []

    def walk(obj, prefix):
        hints = get_type_hints(type(obj))
        for f in fields(obj):
            key, value, hint = prefix + f.name, getattr(obj, f.name), hints[f.name]
            meaning = f.metadata.get("help", "")
            if is_dataclass(value):
                lines.append(f"  {key}:  {meaning}")
                walk(value, key + ".")
                continue
            if numeric_type(hint):
                each = "each " if isinstance(value, list) else ""
                meaning += f"; {each}{declared_range(type(obj), f.name).describe(numeric_type(hint) is int)}"
            order = ORDERED_BY.get(type(obj), {}).get(f.name)
            if order:
                meaning += f"; listed in order of {order}"
            lines.append(f"  {key} = {value!r}  # {meaning}")
            if list_entry_type(hint):
                walk(list_entry_type(hint)(), f"{key}[i].")
    walk(Scenario(), "")
    return "\n".join(lines)

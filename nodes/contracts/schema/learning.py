"""The scenario's learning: data, model, clients and selection, DP-SGD, and impact factors, with their
admitted ranges."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nodes.contracts.schema.settings import (
    CLIENT_ID,
    MAX_CLIENTS,
    MAX_PARAMETER,
    MAX_SAMPLES,
    MAX_STEPS,
    NON_NEGATIVE,
    OPEN_UNIT,
    POSITIVE,
    PROBABILITY,
    ROUND,
    Choice,
    Range,
    setting,
)


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


RANGES: dict[type, dict[str, Range]] = {
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
}

"""The checks of a scenario's `data` section that need no file: choices, ranges, and partitions
that can give every client its data.min_samples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from nodes.contracts.schema import Check, Dataset, Normalization, Partition, Split, check_ranges
from nodes.data.catalog import available_train
from nodes.data.partition import group_sizes
from nodes.data.quality import validate_quality

if TYPE_CHECKING:
    from nodes.contracts.schema import DataConfig, QualityRule


def validate_data(cfg: DataConfig, n_clients: int, check: Check) -> None:
    """Checks for DataConfig; `check(ok, key, value, expected)` raises on failure. Loads no files."""
    check_ranges(cfg, "data.", check)  # every number in its range, also when called on its own
    check(cfg.dataset in list(Dataset), "data.dataset", cfg.dataset, Dataset.describe())
    validate_quality(cfg.quality, n_clients, image_data=cfg.dataset != Dataset.SYNTHETIC, check=check)
    _validate_quality_order(cfg.quality, check)
    check(
        not cfg.groups or (cfg.dataset != Dataset.SYNTHETIC and cfg.partition == Partition.QUANTITY),
        "data.groups",
        cfg.groups,
        "no groups unless data.partition = quantity on an image dataset",
    )
    if cfg.dataset == Dataset.SYNTHETIC:
        # Every client keeps at least min_samples for training; more than an average client
        # has would multiply the data (and the run time) instead of partitioning it.
        mean_train = max(1, int(cfg.samples_per_client * (1 - cfg.test_fraction)))
        check(
            cfg.min_samples <= mean_train,
            "data.min_samples",
            cfg.min_samples,
            f"at most {mean_train}, the mean training samples of a client "
            f"(data.samples_per_client={cfg.samples_per_client} x (1 - data.test_fraction={cfg.test_fraction:g}))",
        )
        return
    check(cfg.partition in list(Partition), "data.partition", cfg.partition, Partition.describe())
    check(cfg.normalize in list(Normalization), "data.normalize", cfg.normalize, Normalization.describe())
    check(cfg.split in list(Split), "data.split", cfg.split, Split.describe())
    n = available_train(cfg)
    if cfg.partition == Partition.SHARDS:
        _validate_shards(cfg, n_clients, n, check)
    elif cfg.partition == Partition.QUANTITY:
        _validate_groups(cfg, n_clients, n, check)
    else:
        check(
            n_clients * cfg.min_samples <= n,
            "data.min_samples",
            cfg.min_samples,
            f"at most {n // n_clients} ({n} training samples over clients.n={n_clients} clients)",
        )


def _validate_quality_order(rules: Sequence[QualityRule], check: Check) -> None:
    """Rules that cover a common client are listed in from_round order: out of order, a rule
    listed later would silently lose to an earlier one."""
    for j, later in enumerate(rules):
        for earlier in rules[:j]:
            if earlier.from_round > later.from_round and _overlap(_covered(earlier), _covered(later)):
                check(
                    False,
                    f"data.quality[{j}].from_round",
                    later.from_round,
                    f"rules for the same clients in from_round order (>= {earlier.from_round} of an earlier rule)",
                )


def _covered(rule: QualityRule) -> range | set[int]:
    return range(*rule.client_range) if rule.client_range else set(rule.clients)


def _overlap(a: range | set[int], b: range | set[int]) -> bool:
    if isinstance(a, range) and isinstance(b, range):
        return max(a.start, b.start) < min(a.stop, b.stop)
    small, big = (a, b) if isinstance(a, set) else (b, a)
    return any(c in big for c in small)


def _validate_shards(cfg: DataConfig, n_clients: int, n: int, check: Check) -> None:
    s = cfg.shards_per_client
    smallest = (n // (n_clients * s)) * s  # array_split: shards differ by at most one sample
    check(
        smallest >= cfg.min_samples,
        "data.shards_per_client",
        s,
        f"shards that give every client >= data.min_samples={cfg.min_samples} samples "
        f"({n} samples in {n_clients}x{s} shards give {smallest})",
    )


def _validate_groups(cfg: DataConfig, n_clients: int, n: int, check: Check) -> None:
    check(len(cfg.groups) > 0, "data.groups", cfg.groups, "at least one {clients, samples} group")
    for i, g in enumerate(cfg.groups):
        check(
            g.samples >= cfg.min_samples,
            f"data.groups[{i}].samples",
            g.samples,
            f"an integer >= data.min_samples={cfg.min_samples}",
        )
    total_clients = sum(g.clients for g in cfg.groups)
    check(
        total_clients == n_clients,
        "data.groups",
        f"{total_clients} clients",
        f"groups covering clients.n={n_clients} clients",
    )
    total = sum(group_sizes(cfg.groups))
    check(total <= n, "data.groups", f"{total} samples", f"at most the {n} training samples available")

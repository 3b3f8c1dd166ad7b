"""The checks of a scenario's `data` section that need no file: ranges, the dataset, the quality rules,
then the dataset's own (DatasetSpec.validate: choices, and partitions that can give every client its
data.min_samples)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from nodes.contracts.schema import Check, check_ranges
from nodes.data.catalog import DATASETS, dataset_spec
from nodes.data.quality import validate_quality

if TYPE_CHECKING:
    from nodes.contracts.schema import DataConfig, QualityRule


def validate_data(cfg: DataConfig, n_clients: int, check: Check) -> None:
    """Checks for DataConfig; `check(ok, key, value, expected)` raises on failure. Loads no files; a
    user's dataset class that cannot be used is one DatasetLoadError."""
    check_ranges(cfg, "data.", check)  # every number in its range, also when called on its own
    check(DATASETS.admits(cfg.dataset), "data.dataset", cfg.dataset, DATASETS.describe())
    spec = dataset_spec(cfg)
    validate_quality(cfg.quality, n_clients, image_data=spec.pixels, check=check)
    _validate_quality_order(cfg.quality, check)
    spec.validate(n_clients, check)


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

"""What a scenario's `data` section can choose, and what is known of each dataset without reading it.

The choice sets are str Enums: a scenario's plain strings compare equal to their members and
look them up in the tables here, and the schema, the validation and the code name one set.
"""
from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nodes.schema import DataConfig


class _Choice(StrEnum):
    """A choice is its value, as the scenario writes it, also in f-strings."""


class Dataset(_Choice):
    SYNTHETIC = "synthetic"
    FASHION_MNIST = "fashion_mnist"
    MNIST = "mnist"
    CIFAR10 = "cifar10"


class Partition(_Choice):
    IID = "iid"
    DIRICHLET = "dirichlet"
    DIRICHLET_CAPPED = "dirichlet_capped"
    SHARDS = "shards"
    QUANTITY = "quantity"


class Normalization(_Choice):
    STANDARD = "standard"
    HALF = "half"
    NONE = "none"


class Split(_Choice):
    OFFICIAL = "official"
    PER_CLIENT = "per_client"


IDX_DATASETS = (Dataset.FASHION_MNIST, Dataset.MNIST)
TRAIN_SIZES = {"fashion_mnist": 60000, "mnist": 60000, "cifar10": 50000}
TEST_SIZES = {"fashion_mnist": 10000, "mnist": 10000, "cifar10": 10000}
SAMPLE_SHAPES = {"fashion_mnist": (1, 28, 28), "mnist": (1, 28, 28), "cifar10": (3, 32, 32)}
IMAGE_CLASSES = 10


def choices(options: type[_Choice]) -> str:
    """The options as messages and the schema's help list them: "a | b | c"."""
    return " | ".join(options)


def available_train(cfg: DataConfig) -> int:
    """Samples the image dataset's partition will share out, after max_train / max_test (no file
    access): the training set, or training plus test set when data.split = per_client."""
    def capped(full: int, limit: int) -> int:
        return min(limit, full) if limit > 0 else full
    n = capped(TRAIN_SIZES[cfg.dataset], cfg.max_train)
    if cfg.split == Split.PER_CLIENT:
        n += capped(TEST_SIZES[cfg.dataset], cfg.max_test)
    return n


def sample_shape(cfg: DataConfig) -> tuple[int, ...]:
    """The shape of one sample of cfg.dataset (no file access)."""
    return (cfg.dim,) if cfg.dataset == Dataset.SYNTHETIC else SAMPLE_SHAPES[cfg.dataset]


def num_classes(cfg: DataConfig) -> int:
    return cfg.classes if cfg.dataset == Dataset.SYNTHETIC else IMAGE_CLASSES

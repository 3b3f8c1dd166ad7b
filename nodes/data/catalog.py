"""What is known of each dataset without reading it (its choice sets are the schema's)."""

from __future__ import annotations

from nodes.contracts.schema import DataConfig, Dataset, Split

IDX_DATASETS = (Dataset.FASHION_MNIST, Dataset.MNIST)
TRAIN_SIZES = {"fashion_mnist": 60000, "mnist": 60000, "cifar10": 50000}
TEST_SIZES = {"fashion_mnist": 10000, "mnist": 10000, "cifar10": 10000}
SAMPLE_SHAPES = {"fashion_mnist": (1, 28, 28), "mnist": (1, 28, 28), "cifar10": (3, 32, 32)}
IMAGE_CLASSES = 10


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

"""Where a dataset's files are looked for, and the error that says where they were not."""

from __future__ import annotations

import http.client
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nodes.contracts.schema import DataConfig

# Where the system's dataset packages put their files (Debian's dataset-fashion-mnist). The variable
# moves it: pointed at an empty folder, the machine looks like one without them (docs/data-models.md).
SYSTEM_DIR_VARIABLE = "DPFL_SYSTEM_DATASETS"
SYSTEM_DIR = Path(os.environ.get(SYSTEM_DIR_VARIABLE) or "/usr/share/datasets")
# Where the files are looked for after data.root and before data.cache_dir.
STANDARD_DIRS: dict[str, list[str]] = {
    "fashion_mnist": [str(SYSTEM_DIR / "fashion-mnist")],
    "mnist": [str(SYSTEM_DIR / "mnist")],
    "cifar10": [str(SYSTEM_DIR / "cifar-10"), str(SYSTEM_DIR / "cifar10")],
}
# Sub-directories of data.root (and of the standard dirs) that are also tried.
_SUBDIRS: dict[str, list[str]] = {
    "fashion_mnist": ["fashion-mnist", "fashion_mnist", "FashionMNIST/raw"],
    "mnist": ["mnist", "MNIST/raw"],
    "cifar10": ["cifar-10-batches-py"],
}
_HOW_TO_GET: dict[str, str] = {
    "fashion_mnist": "install them with `apt-get install dataset-fashion-mnist` or put the 4 IDX files in data.root",
    "mnist": "put the 4 IDX files (train-images-idx3-ubyte[.gz], ...) in data.root",
    "cifar10": "put cifar-10-python.tar.gz or its extracted cifar-10-batches-py/ in data.root",
}
NETWORK_ERRORS = (OSError, http.client.HTTPException)  # URLError and timeouts are OSErrors


class DatasetNotFound(Exception):
    """The dataset's files are not where we looked; the message says where and how to get them."""


def installed(dataset: str) -> Path | None:
    """The system location that holds `dataset` (a standard directory that exists), else None."""
    return next((Path(d) for d in STANDARD_DIRS[dataset] if Path(d).is_dir()), None)


def search_dirs(cfg: DataConfig) -> list[Path]:
    """data.root and the standard locations, each with its usual sub-directories (not the cache)."""
    bases = ([Path(cfg.root).expanduser()] if cfg.root else []) + [Path(p) for p in STANDARD_DIRS[cfg.dataset]]
    return [d for b in bases for d in [b] + [b / sub for sub in _SUBDIRS[cfg.dataset]]]


def cache_dir(cfg: DataConfig) -> Path:
    return Path(cfg.cache_dir).expanduser() / cfg.dataset


def not_found(cfg: DataConfig, what: str, looked: list[Path], reason: str) -> DatasetNotFound:
    return DatasetNotFound(
        f"dataset {cfg.dataset}: {what} not found in {', '.join(map(str, looked))}; "
        f"{reason}; {_HOW_TO_GET[cfg.dataset]}"
    )


def download_failed(url: str, e: Exception) -> str:
    return f"download from {url} failed ({getattr(e, 'reason', e)})"

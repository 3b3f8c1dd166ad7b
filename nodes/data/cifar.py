"""CIFAR-10: the python batches of cifar-10-python.tar.gz, each md5-verified before an unpickler
that admits numpy arrays only reads it."""

from __future__ import annotations

import codecs
import math
import os
import pickle
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nodes.data.fetch import download, verify_md5
from nodes.data.locate import (
    NETWORK_ERRORS,
    cache_dir,
    download_failed,
    not_found,
    search_dirs,
)

if TYPE_CHECKING:
    from nodes.contracts.schema import DataConfig

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR_TARBALL = "cifar-10-python.tar.gz"
CIFAR_TARBALL_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN_BATCHES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5")
CIFAR_TEST_BATCH = "test_batch"
CIFAR_BATCH_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
CIFAR_SHAPE = (3, 32, 32)


class CIFARFormatError(ValueError):
    """A CIFAR-10 batch or tarball is malformed; the message names the file."""


_NUMPY_RECONSTRUCT = np.zeros(1).__reduce__()[0]  # numpy's _reconstruct, whatever its module path
_PICKLE_ALLOWED = {  # everything a CIFAR-10 python batch refers to, nothing else
    ("numpy.core.multiarray", "_reconstruct"): _NUMPY_RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _NUMPY_RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,  # bytes in protocol-2 pickles written by Python 3
}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _PICKLE_ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR-10 batch") from None


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One md5-verified batch: uint8 images (N, 3, 32, 32), int64 labels (N,)."""
    verify_md5(path, CIFAR_BATCH_MD5[path.name])
    try:
        with open(path, "rb") as f:
            batch = _BatchUnpickler(f, encoding="bytes").load()
        data, labels = np.asarray(batch[b"data"]), np.asarray(batch[b"labels"], dtype=np.int64)
    except (pickle.UnpicklingError, KeyError, TypeError, ValueError, EOFError) as e:
        raise CIFARFormatError(f"{path}: not a CIFAR-10 python batch ({e})") from None
    size = math.prod(CIFAR_SHAPE)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != size or len(labels) != len(data):
        raise CIFARFormatError(
            f"{path}: expected uint8 data (N, {size}) and N labels, "
            f"got data {data.dtype}{data.shape} and {len(labels)} labels"
        )
    return data.reshape((-1,) + CIFAR_SHAPE), labels


def _has_batches(d: Path) -> bool:
    return all((d / name).is_file() for name in CIFAR_BATCH_MD5)


def extract_cifar(tarball: Path, dest: Path) -> Path:
    """Write the six batches of the md5-verified tarball into `dest` (nothing else is extracted)."""
    verify_md5(tarball, CIFAR_TARBALL_MD5)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "r:gz") as tar:
        for name in CIFAR_BATCH_MD5:
            try:
                src = tar.extractfile(f"{CIFAR_DIR}/{name}")
            except KeyError:
                src = None
            if src is None:
                raise CIFARFormatError(f"{tarball}: no regular file {CIFAR_DIR}/{name}")
            part = dest / f"{name}.{os.getpid()}.part"
            part.write_bytes(src.read())
            os.replace(part, dest / name)
    return dest


def find_cifar_dir(cfg: DataConfig) -> Path:
    """A directory holding the six batch files: searched, cached, extracted from a tarball
    found in data.root / the cache, or downloaded and extracted into the cache."""
    dirs = search_dirs(cfg)
    cache = cache_dir(cfg)
    extracted = cache / CIFAR_DIR
    for d in dirs + [extracted]:
        if _has_batches(d):
            return d
    for d in dirs + [cache]:
        if (d / CIFAR_TARBALL).is_file():
            return extract_cifar(d / CIFAR_TARBALL, extracted)
    what = f"{CIFAR_DIR}/ ({', '.join(CIFAR_BATCH_MD5)}) or {CIFAR_TARBALL}"
    if not cfg.download:
        raise not_found(cfg, what, dirs + [cache], "download disabled (data.download=false)")
    try:
        tarball = download(CIFAR_URL, cache / CIFAR_TARBALL, CIFAR_TARBALL_MD5)
    except NETWORK_ERRORS as e:
        raise not_found(cfg, what, dirs + [cache], download_failed(CIFAR_URL, e)) from None
    return extract_cifar(tarball, extracted)


def load_cifar10(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images uint8 (N, 3, 32, 32), train labels, test images, test labels)."""
    d = find_cifar_dir(cfg)
    train = [read_cifar_batch(d / name) for name in CIFAR_TRAIN_BATCHES]
    xtr, ytr = np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])
    xte, yte = read_cifar_batch(d / CIFAR_TEST_BATCH)
    if cfg.max_train > 0:
        xtr, ytr = xtr[: cfg.max_train], ytr[: cfg.max_train]
    if cfg.max_test > 0:
        xte, yte = xte[: cfg.max_test], yte[: cfg.max_test]
    return xtr, ytr, xte, yte

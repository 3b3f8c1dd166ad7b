"""CIFAR-10's python batches (in cifar-10-python.tar.gz), each md5-verified before an unpickler that admits
numpy arrays only reads it: the family of CIFAR-10 (nodes.data.catalog)."""

from __future__ import annotations

import codecs
import math
import os
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from nodes.data.fetch import verify_md5
from nodes.data.images import Arrays, FileImages

CIFAR_TARBALL = "cifar-10-python.tar.gz"
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN_BATCHES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5")
CIFAR_TEST_BATCH = "test_batch"
CIFAR_BATCHES = (*CIFAR_TRAIN_BATCHES, CIFAR_TEST_BATCH)
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


def read_cifar_batch(path: Path, md5: str) -> tuple[np.ndarray, np.ndarray]:
    """One batch, verified against its official `md5`: uint8 images (N, 3, 32, 32), int64 labels (N,)."""
    verify_md5(path, md5)
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
    return all((d / name).is_file() for name in CIFAR_BATCHES)


def extract_cifar(tarball: Path, dest: Path, md5: str) -> Path:
    """Write the six batches of the tarball, verified against its official `md5`, into `dest` (nothing
    else is extracted)."""
    verify_md5(tarball, md5)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "r:gz") as tar:
        for name in CIFAR_BATCHES:
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


class CifarFiles(FileImages):
    """Images and labels in CIFAR's python batches: data_batch_1 .. data_batch_5 and test_batch, in
    cifar-10-batches-py/ or in the cifar-10-python.tar.gz that holds it (md5: by their names)."""

    def find_batches(self) -> Path:
        """A directory holding the six batch files: searched, cached, extracted from a tarball
        found in data.root / the cache, or downloaded and extracted into the cache."""
        dirs, cache = self.search_dirs(), self.cache_dir()
        extracted = cache / CIFAR_DIR
        for d in dirs + [extracted]:
            if _has_batches(d):
                return d
        for d in dirs + [cache]:
            if (d / CIFAR_TARBALL).is_file():
                return extract_cifar(d / CIFAR_TARBALL, extracted, self.md5[CIFAR_TARBALL])
        what = f"{CIFAR_DIR}/ ({', '.join(CIFAR_BATCHES)}) or {CIFAR_TARBALL}"
        if not self.cfg.download:
            raise self.not_found(what, dirs + [cache], "download disabled (data.download=false)")
        tarball = self.downloaded(CIFAR_TARBALL, what, dirs + [cache])
        return extract_cifar(tarball, extracted, self.md5[CIFAR_TARBALL])

    def arrays(self) -> Arrays:
        """(train images uint8 (N, 3, 32, 32), train labels, test images, test labels)."""
        d = self.find_batches()
        train = [read_cifar_batch(d / name, self.md5[name]) for name in CIFAR_TRAIN_BATCHES]
        xtr, ytr = np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])
        xte, yte = read_cifar_batch(d / CIFAR_TEST_BATCH, self.md5[CIFAR_TEST_BATCH])
        return xtr, ytr, xte, yte

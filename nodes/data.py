"""Federated datasets: Synthetic(alpha, beta), MNIST / FashionMNIST (IDX files) and CIFAR-10.

`load_federated(cfg, n_clients, seed)` returns one `FederatedData`: a (X, y) pair per client
and a pooled server-side test set. Everything random comes from named `nodes.rng`
streams, so the same (cfg, n_clients, seed) gives bitwise identical tensors in any process.

* ``synthetic`` (default, no files): Li et al., "Federated optimization in heterogeneous
  networks" (FedProx), Synthetic(alpha, beta). Per client k: u_k ~ N(0, alpha),
  B_k ~ N(0, beta), W_k ~ N(u_k, 1) (dim x classes), b_k ~ N(u_k, 1), v_k ~ N(B_k, 1) per
  feature, x ~ N(v_k, Sigma) with Sigma = diag(j^-1.2), y = argmax(W_k^T x + b_k)
  (= argmax softmax). As in the FedProx generator code, alpha and beta are used as
  *standard deviations*. Client k draws from its own stream, so its data do not depend on
  how many other clients there are. A share `test_fraction` of every client's samples is
  pooled into the server's test set.
* ``fashion_mnist`` / ``mnist``: the four IDX files (gzipped or plain), parsed with numpy;
  one sample is (1, 28, 28).
* ``cifar10``: the python batches of `cifar-10-python.tar.gz` (`data_batch_1..5`,
  `test_batch`), each md5-verified against the official value before it is unpickled by
  an unpickler that admits numpy arrays only; one sample is (3, 32, 32).

Image files are looked for in data.root, then the standard system locations, then
data.cache_dir; a missing dataset is downloaded (md5-verified) into data.cache_dir unless
data.download is false. Pixels are float32, pixel / 255 then normalised by data.normalize:
``standard`` (per-channel mean and std of the training set), ``half`` ((x - 0.5) / 0.5, as the
ALI-DPFL code) or ``none``.

data.split says which samples are partitioned: ``official`` — the training set goes to the
clients (``iid``, ``dirichlet`` label skew, ``dirichlet_capped``, ``shards``, ``quantity``
skew by client group) and the official test set to the server; ``per_client`` — as the
PFL-Non-IID generator the ALI-DPFL code uses, training and test sets are pooled and
partitioned, every client's share is split train/test (client_train_fraction), and the
server tests on the union of the clients' test shares.
"""
from __future__ import annotations

import codecs
import gzip
import http.client
import math
import os
import pickle
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nodes.fetch import ChecksumError, download, verify_md5
from nodes.quality import validate_quality
from nodes.rng import stream
from nodes.schema import check_ranges

DATASETS = ("synthetic", "fashion_mnist", "mnist", "cifar10")
IDX_DATASETS = ("fashion_mnist", "mnist")
PARTITIONS = ("iid", "dirichlet", "dirichlet_capped", "shards", "quantity")
NORMALIZATIONS = ("standard", "half", "none")
SPLITS = ("official", "per_client")
# Per-channel mean and std of each training set's pixel / 255 (the values torchvision's
# examples use; tests recompute them from the files).
CHANNEL_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}

# Where the files are looked for after data.root and before data.cache_dir.
STANDARD_DIRS: dict[str, list[str]] = {
    "fashion_mnist": ["/usr/share/datasets/fashion-mnist"],
    "mnist": ["/usr/share/datasets/mnist"],
    "cifar10": ["/usr/share/datasets/cifar-10", "/usr/share/datasets/cifar10"],
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
TRAIN_SIZES = {"fashion_mnist": 60000, "mnist": 60000, "cifar10": 50000}
SAMPLE_SHAPES = {"fashion_mnist": (1, 28, 28), "mnist": (1, 28, 28), "cifar10": (3, 32, 32)}
IMAGE_CLASSES = 10
TEST_SIZES = {"fashion_mnist": 10000, "mnist": 10000, "cifar10": 10000}
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dimensions
LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dimension

# Official downloads: mirrors tried in order, md5 of each gzipped IDX file.
IDX_MIRRORS: dict[str, list[str]] = {
    "mnist": ["https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"],
    "fashion_mnist": ["https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
                      "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"],
}
IDX_MD5: dict[str, dict[str, str]] = {
    "mnist": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    "fashion_mnist": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
}
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
NETWORK_ERRORS = (OSError, http.client.HTTPException)  # URLError and timeouts are OSErrors


class DatasetNotFound(Exception):
    """The dataset's files are not where we looked; the message says where and how to get them."""


class IDXFormatError(ValueError):
    """An IDX file is malformed; the message names the file."""


class CIFARFormatError(ValueError):
    """A CIFAR-10 batch or tarball is malformed; the message names the file."""


@dataclass
class FederatedData:
    train: list[tuple[torch.Tensor, torch.Tensor]]  # per client i: (X float32, y int64)
    test: tuple[torch.Tensor, torch.Tensor]         # server-side test set
    num_classes: int
    input_shape: tuple[int, ...]                    # shape of one sample

    @property
    def sizes(self) -> list[int]:
        return [len(y) for _, y in self.train]


# --- validation -------------------------------------------------------------------------

def available_train(cfg) -> int:
    """Samples the image dataset's partition will share out, after max_train / max_test (no file
    access): the training set, or training plus test set when data.split = per_client."""
    def capped(full: int, limit: int) -> int:
        return min(limit, full) if limit > 0 else full
    n = capped(TRAIN_SIZES[cfg.dataset], cfg.max_train)
    if cfg.split == "per_client":
        n += capped(TEST_SIZES[cfg.dataset], cfg.max_test)
    return n


def group_sizes(groups) -> list[int]:
    """Per-client sample counts of partition=quantity, in client-id order."""
    return [g.samples for g in groups for _ in range(g.clients)]


def sample_shape(cfg) -> tuple[int, ...]:
    """The shape of one sample of cfg.dataset (no file access)."""
    return (cfg.dim,) if cfg.dataset == "synthetic" else SAMPLE_SHAPES[cfg.dataset]


def num_classes(cfg) -> int:
    return cfg.classes if cfg.dataset == "synthetic" else IMAGE_CLASSES


def validate_data(cfg, n_clients: int, check) -> None:
    """Checks for DataConfig; `check(ok, key, value, expected)` raises on failure. Loads no files."""
    check_ranges(cfg, "data.", check)   # every number in its range, also when called on its own
    check(cfg.dataset in DATASETS, "data.dataset", cfg.dataset, " | ".join(DATASETS))
    validate_quality(cfg.quality, n_clients, image_data=cfg.dataset != "synthetic", check=check)
    _validate_quality_order(cfg.quality, check)
    check(not cfg.groups or (cfg.dataset != "synthetic" and cfg.partition == "quantity"), "data.groups", cfg.groups,
          "no groups unless data.partition = quantity on an image dataset")
    if cfg.dataset == "synthetic":
        # Every client keeps at least min_samples for training; more than an average client
        # has would multiply the data (and the run time) instead of partitioning it.
        mean_train = max(1, int(cfg.samples_per_client * (1 - cfg.test_fraction)))
        check(cfg.min_samples <= mean_train, "data.min_samples", cfg.min_samples,
              f"at most {mean_train}, the mean training samples of a client "
              f"(data.samples_per_client={cfg.samples_per_client} x (1 - data.test_fraction={cfg.test_fraction:g}))")
        return
    check(cfg.partition in PARTITIONS, "data.partition", cfg.partition, " | ".join(PARTITIONS))
    check(cfg.normalize in NORMALIZATIONS, "data.normalize", cfg.normalize, " | ".join(NORMALIZATIONS))
    check(cfg.split in SPLITS, "data.split", cfg.split, " | ".join(SPLITS))
    n = available_train(cfg)
    if cfg.partition == "shards":
        _validate_shards(cfg, n_clients, n, check)
    elif cfg.partition == "quantity":
        _validate_groups(cfg, n_clients, n, check)
    else:
        check(n_clients * cfg.min_samples <= n, "data.min_samples", cfg.min_samples,
              f"at most {n // n_clients} ({n} training samples over clients.n={n_clients} clients)")


def _validate_quality_order(rules, check) -> None:
    """Rules that cover a common client are listed in from_round order: out of order, a rule
    listed later would silently lose to an earlier one."""
    for j, later in enumerate(rules):
        for earlier in rules[:j]:
            if earlier.from_round > later.from_round and _overlap(_covered(earlier), _covered(later)):
                check(False, f"data.quality[{j}].from_round", later.from_round,
                      f"rules for the same clients in from_round order (>= {earlier.from_round} of an earlier rule)")


def _covered(rule) -> range | set[int]:
    return range(*rule.client_range) if rule.client_range else set(rule.clients)


def _overlap(a: range | set[int], b: range | set[int]) -> bool:
    if isinstance(a, range) and isinstance(b, range):
        return max(a.start, b.start) < min(a.stop, b.stop)
    small, big = (a, b) if isinstance(a, set) else (b, a)
    return any(c in big for c in small)


def _validate_shards(cfg, n_clients: int, n: int, check) -> None:
    s = cfg.shards_per_client
    smallest = (n // (n_clients * s)) * s  # array_split: shards differ by at most one sample
    check(smallest >= cfg.min_samples, "data.shards_per_client", s,
          f"shards that give every client >= data.min_samples={cfg.min_samples} samples "
          f"({n} samples in {n_clients}x{s} shards give {smallest})")


def _validate_groups(cfg, n_clients: int, n: int, check) -> None:
    check(len(cfg.groups) > 0, "data.groups", cfg.groups, "at least one {clients, samples} group")
    for i, g in enumerate(cfg.groups):
        check(g.samples >= cfg.min_samples, f"data.groups[{i}].samples", g.samples,
              f"an integer >= data.min_samples={cfg.min_samples}")
    total_clients = sum(g.clients for g in cfg.groups)
    check(total_clients == n_clients, "data.groups", f"{total_clients} clients",
          f"groups covering clients.n={n_clients} clients")
    total = sum(group_sizes(cfg.groups))
    check(total <= n, "data.groups", f"{total} samples", f"at most the {n} training samples available")


# --- entry point ------------------------------------------------------------------------

def load_federated(cfg, n_clients: int, seed: int) -> FederatedData:
    if n_clients < 1:
        raise ValueError(f"n_clients = {n_clients}: expected an integer >= 1")
    if cfg.dataset == "synthetic":
        return synthetic(cfg, n_clients, seed)
    if cfg.dataset in IDX_DATASETS:
        return federate(cfg, n_clients, seed, *load_idx_dataset(cfg))
    if cfg.dataset == "cifar10":
        return federate(cfg, n_clients, seed, *load_cifar10(cfg))
    raise ValueError(f"data.dataset = {cfg.dataset!r}: expected {' | '.join(DATASETS)}")


# --- Synthetic(alpha, beta) --------------------------------------------------------------

def synthetic(cfg, n_clients: int, seed: int) -> FederatedData:
    dim, classes = int(cfg.dim), int(cfg.classes)
    tf, s = float(cfg.test_fraction), float(cfg.size_sigma)
    std_x = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2) ** 0.5  # sqrt(Sigma_jj)
    train, test_x, test_y = [], [], []
    for k in range(n_clients):
        rng = stream(seed, "data", "synthetic", k)
        u = rng.normal(0.0, cfg.alpha)
        B = rng.normal(0.0, cfg.beta)
        W = rng.normal(u, 1.0, (dim, classes))
        b = rng.normal(u, 1.0, classes)
        v = rng.normal(B, 1.0, dim)
        # Lognormal size with mean samples_per_client; at least min_samples stay for training.
        size = int(round(cfg.samples_per_client * math.exp(s * rng.standard_normal() - s * s / 2)))
        n_test = max(1, int(round(tf * size)))
        n_train = max(cfg.min_samples, size - n_test)
        x = v + rng.standard_normal((n_train + n_test, dim)) * std_x
        # einsum without optimize= uses numpy's own loops (no BLAS threading), so labels are
        # bitwise reproducible whatever the thread count of the process.
        logits = np.einsum("nd,dc->nc", x, W)
        logits += b
        y = logits.argmax(axis=1)
        x32 = torch.from_numpy(x.astype(np.float32))
        y64 = torch.from_numpy(y.astype(np.int64))
        train.append((x32[:n_train].clone(), y64[:n_train].clone()))
        test_x.append(x32[n_train:])
        test_y.append(y64[n_train:])
    return FederatedData(train, (torch.cat(test_x), torch.cat(test_y)), classes, (dim,))


# --- where the files are ----------------------------------------------------------------

def search_dirs(cfg) -> list[Path]:
    """data.root and the standard locations, each with its usual sub-directories (not the cache)."""
    bases = ([Path(cfg.root).expanduser()] if cfg.root else []) + [Path(p) for p in STANDARD_DIRS[cfg.dataset]]
    return [d for b in bases for d in [b] + [b / sub for sub in _SUBDIRS[cfg.dataset]]]


def cache_dir(cfg) -> Path:
    return Path(cfg.cache_dir).expanduser() / cfg.dataset


def _not_found(cfg, what: str, looked: list[Path], reason: str) -> DatasetNotFound:
    return DatasetNotFound(f"dataset {cfg.dataset}: {what} not found in {', '.join(map(str, looked))}; "
                           f"{reason}; {_HOW_TO_GET[cfg.dataset]}")


def _download_failed(url: str, e: Exception) -> str:
    return f"download from {url} failed ({getattr(e, 'reason', e)})"


# --- IDX files (MNIST, FashionMNIST) -----------------------------------------------------

def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """Parse one IDX file (gzipped or plain) into a uint8 array; check magic number and size."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise IDXFormatError(f"{path}: corrupt gzip data ({e})") from None
    what = "images" if magic == IMAGES_MAGIC else "labels"
    if len(raw) < 8:
        raise IDXFormatError(f"{path}: too short for an IDX {what} file ({len(raw)} bytes)")
    got = int.from_bytes(raw[:4], "big")
    if got != magic:
        raise IDXFormatError(f"{path}: not an IDX {what} file (magic number {got}, expected {magic})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IDXFormatError(f"{path}: truncated IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expect = int(np.prod(shape))
    if len(raw) - header != expect:
        raise IDXFormatError(f"{path}: header says shape {shape} ({expect} bytes of data), "
                             f"file has {len(raw) - header}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _find_file(d: Path, stem: str) -> Path | None:
    alt = stem.replace("-idx", ".idx")  # e.g. train-images.idx3-ubyte
    for name in (stem + ".gz", stem, alt + ".gz", alt):
        p = d / name
        if p.is_file():
            return p
    return None


def _idx_files_in(d: Path) -> dict[str, Path] | None:
    found = {k: _find_file(d, stem) for k, stem in IDX_FILES.items()}
    return found if all(found.values()) else None  # type: ignore[return-value]


def _verified_or_downloaded(cfg, path: Path) -> Path:
    """An official .gz file in the cache: md5-verified if there, else downloaded from the
    first mirror that serves it with the right md5."""
    expected = IDX_MD5[cfg.dataset][path.name]
    if path.is_file():
        verify_md5(path, expected)
        return path
    failures, checksum_error = [], None
    for base in IDX_MIRRORS[cfg.dataset]:
        try:
            return download(base + path.name, path, expected)
        except ChecksumError as e:
            checksum_error = e
        except NETWORK_ERRORS as e:
            failures.append(_download_failed(base + path.name, e))
    if checksum_error is not None:
        raise checksum_error
    raise _not_found(cfg, f"IDX file {path.name}", search_dirs(cfg) + [path.parent], "; ".join(failures))


def find_idx_files(cfg) -> dict[str, Path]:
    """The four IDX files: from the first searched directory that holds them all, else the
    official .gz files in the cache (md5-verified, the missing ones downloaded)."""
    dirs = search_dirs(cfg)
    for d in dirs:
        found = _idx_files_in(d)
        if found:
            return found
    cache = cache_dir(cfg)
    cached = {k: cache / f"{stem}.gz" for k, stem in IDX_FILES.items()}
    if not cfg.download and not all(p.is_file() for p in cached.values()):
        raise _not_found(cfg, f"IDX files ({', '.join(s + '[.gz]' for s in IDX_FILES.values())})",
                         dirs + [cache], "download disabled (data.download=false)")
    return {k: _verified_or_downloaded(cfg, p) for k, p in cached.items()}


def load_idx_split(images_path, labels_path, limit: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (N, H, W) and int64 labels (N,), the first `limit` of them if limit > 0."""
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC)
    if images.ndim != 3:
        raise IDXFormatError(f"{images_path}: expected 3 dimensions (N, rows, cols), got shape {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise IDXFormatError(f"{labels_path}: {labels.shape[0]} labels for {len(images)} images in {images_path}")
    if limit > 0:
        images, labels = images[:limit], labels[:limit]
    return images, labels.astype(np.int64)


def load_idx_dataset(cfg) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images uint8 (N, 1, H, W), train labels, test images, test labels)."""
    f = find_idx_files(cfg)
    xtr, ytr = load_idx_split(f["train_images"], f["train_labels"], cfg.max_train)
    xte, yte = load_idx_split(f["test_images"], f["test_labels"], cfg.max_test)
    return xtr[:, None], ytr, xte[:, None], yte


# --- CIFAR-10 ---------------------------------------------------------------------------

_NUMPY_RECONSTRUCT = np.zeros(1).__reduce__()[0]  # numpy's _reconstruct, whatever its module path
_PICKLE_ALLOWED = {  # everything a CIFAR-10 python batch refers to, nothing else
    ("numpy.core.multiarray", "_reconstruct"): _NUMPY_RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _NUMPY_RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,  # bytes in protocol-2 pickles written by Python 3
}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
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
        raise CIFARFormatError(f"{path}: expected uint8 data (N, {size}) and N labels, "
                               f"got data {data.dtype}{data.shape} and {len(labels)} labels")
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


def find_cifar_dir(cfg) -> Path:
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
        raise _not_found(cfg, what, dirs + [cache], "download disabled (data.download=false)")
    try:
        tarball = download(CIFAR_URL, cache / CIFAR_TARBALL, CIFAR_TARBALL_MD5)
    except NETWORK_ERRORS as e:
        raise _not_found(cfg, what, dirs + [cache], _download_failed(CIFAR_URL, e)) from None
    return extract_cifar(tarball, extracted)


def load_cifar10(cfg) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images uint8 (N, 3, 32, 32), train labels, test images, test labels)."""
    d = find_cifar_dir(cfg)
    train = [read_cifar_batch(d / name) for name in CIFAR_TRAIN_BATCHES]
    xtr, ytr = np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])
    xte, yte = read_cifar_batch(d / CIFAR_TEST_BATCH)
    if cfg.max_train > 0:
        xtr, ytr = xtr[:cfg.max_train], ytr[:cfg.max_train]
    if cfg.max_test > 0:
        xte, yte = xte[:cfg.max_test], yte[:cfg.max_test]
    return xtr, ytr, xte, yte


# --- federating an image dataset ---------------------------------------------------------

def _to_tensor(images_u8: np.ndarray, dataset: str, normalize: str) -> torch.Tensor:
    x = images_u8.astype(np.float32)
    x /= np.float32(255.0)  # exactly pixel / 255, as torchvision's ToTensor
    if normalize == "half":
        x -= np.float32(0.5)
        x /= np.float32(0.5)
    elif normalize == "standard":
        mean, std = (np.asarray(v, np.float32).reshape(-1, 1, 1) for v in CHANNEL_STATS[dataset])
        x -= mean
        x /= std
    return torch.from_numpy(x)


def pixel_extremes(cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(black, white): pixels 0 and 255 after data.normalize, per channel, shape (C, 1, 1);
    0 and 1 for synthetic data, which has no pixels (salt-and-pepper is refused there)."""
    if cfg.dataset == "synthetic":
        return torch.tensor(0.0), torch.tensor(1.0)
    channels = sample_shape(cfg)[0]
    both = _to_tensor(np.array([0, 255], dtype=np.uint8).repeat(channels).reshape(2, channels, 1, 1),
                      cfg.dataset, cfg.normalize)
    return both[0], both[1]


def partition_rng(cfg, seed: int):
    """The run's own partition stream, or (data.partition_seed >= 0) numpy's legacy global-style
    RandomState, with which the PFL-Non-IID generator (np.random.seed(1)) draws its files."""
    if cfg.partition_seed >= 0:
        return np.random.RandomState(cfg.partition_seed)
    return stream(seed, "partition")


def federate(cfg, n_clients: int, seed: int, xtr: np.ndarray, ytr: np.ndarray,
             xte: np.ndarray, yte: np.ndarray) -> FederatedData:
    """Partition uint8 (N, C, H, W) images across clients, and make the server's test set (see data.split)."""
    num_classes = int(max(ytr.max(), yte.max())) + 1
    if cfg.split == "per_client":
        xtr, ytr = np.concatenate([xtr, xte]), np.concatenate([ytr, yte])
    rng = partition_rng(cfg, seed)
    parts = partition(cfg, ytr, n_clients, rng)
    short = [i for i, p in enumerate(parts) if len(p) < cfg.min_samples]
    if short:
        raise ValueError(f"data.min_samples = {cfg.min_samples}: client {short[0]} gets only "
                         f"{len(parts[short[0]])} of {len(ytr)} samples")
    if cfg.split == "per_client":
        shares = [split_share(p, cfg.client_train_fraction, rng) for p in parts]
        parts = [train for train, _ in shares]
        test_idx = np.concatenate([test for _, test in shares])
        xte, yte = xtr[test_idx], ytr[test_idx]

    def tensors(idx_or_all, x, y):
        return _to_tensor(x[idx_or_all], cfg.dataset, cfg.normalize), torch.from_numpy(y[idx_or_all])
    train = [tensors(p, xtr, ytr) for p in parts]
    test = tensors(slice(None), xte, yte)
    return FederatedData(train, test, num_classes, tuple(xtr.shape[1:]))


def split_share(idx: np.ndarray, train_fraction: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) of one client's share, as sklearn's train_test_split(train_size=f, shuffle=True)
    that PFL-Non-IID calls: floor(f n) for training, the rest for test, one permutation drawn."""
    n_train = int(math.floor(train_fraction * len(idx)))
    perm = rng.permutation(len(idx))
    n_test = len(idx) - n_train
    return idx[perm[n_test:]], idx[perm[:n_test]]


# --- partitions -------------------------------------------------------------------------

def partition(cfg, labels: np.ndarray, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Sample indices per client, by data.partition."""
    if cfg.partition == "iid":
        return partition_iid(len(labels), n_clients, rng)
    if cfg.partition == "dirichlet":
        return partition_dirichlet(labels, n_clients, cfg.dirichlet_beta, cfg.min_samples, rng)
    if cfg.partition == "dirichlet_capped":
        return partition_dirichlet_capped(labels, n_clients, cfg.dirichlet_beta, cfg.min_samples, rng)
    if cfg.partition == "shards":
        return partition_shards(labels, n_clients, cfg.shards_per_client, rng)
    if cfg.partition == "quantity":
        sizes = group_sizes(cfg.groups)
        if len(sizes) != n_clients:
            raise ValueError(f"data.groups cover {len(sizes)} clients: expected clients.n={n_clients}")
        return partition_quantity(len(labels), sizes, rng)
    raise ValueError(f"data.partition = {cfg.partition!r}: expected {' | '.join(PARTITIONS)}")


def partition_iid(n_samples: int, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation split into n_clients near-equal parts (sizes differ by at most 1)."""
    return [p.copy() for p in np.array_split(rng.permutation(n_samples), n_clients)]


def partition_shards(labels: np.ndarray, n_clients: int, shards_per_client: int,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """Pathological non-IID split of McMahan et al. (2017), "Communication-efficient learning
    of deep networks from decentralized data", Sec. 3: sort by label, cut into
    n_clients * shards_per_client near-equal shards, give every client shards_per_client
    random shards. Every sample goes to exactly one client."""
    labels = np.asarray(labels)
    n_shards = n_clients * shards_per_client
    if n_shards > len(labels):
        raise ValueError(f"cannot cut {len(labels)} samples into {n_clients}x{shards_per_client} shards")
    shuffled = rng.permutation(len(labels))  # random order within a label
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(by_label, n_shards)
    owners = rng.permutation(n_shards).reshape(n_clients, shards_per_client)
    return [rng.permutation(np.concatenate([shards[s] for s in row])) for row in owners]


def partition_quantity(n_samples: int, sizes: list[int], rng: np.random.Generator) -> list[np.ndarray]:
    """Quantity skew (Talaei & Izadi, Table I scenario 3): client i gets exactly sizes[i]
    samples, a random subset disjoint from every other client's; the rest go unused."""
    if sum(sizes) > n_samples or any(s < 0 for s in sizes):
        raise ValueError(f"cannot give clients {sum(sizes)} samples in all from {n_samples}")
    chosen = rng.permutation(n_samples)[:sum(sizes)]
    return [p.copy() for p in np.split(chosen, np.cumsum(sizes)[:-1])]


def partition_dirichlet(labels: np.ndarray, n_clients: int, beta: float, min_samples: int,
                        rng: np.random.Generator, attempts: int = 10) -> list[np.ndarray]:
    """Label skew after Hsu et al. (2019): for every class, the class's samples are split across
    clients in proportions drawn from Dir(beta, ..., beta).

    The draw is repeated (up to `attempts` times) until every client has at least
    `min_samples`; if that never happens, the poorest clients are topped up with random
    samples taken from the richest ones. Every sample goes to exactly one client.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if n_clients * min_samples > n:
        raise ValueError(f"cannot give {n_clients} clients {min_samples} samples each from {n} samples")
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(max(1, attempts)):
        buckets: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(n_clients, float(beta)))
            if not np.all(np.isfinite(p)) or p.sum() <= 0:  # guard against degenerate draws
                p = np.full(n_clients, 1.0 / n_clients)
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for j, part in enumerate(np.split(idx, cuts)):
                buckets[j].append(part)
        parts = [np.concatenate(b) for b in buckets]
        if min(len(p) for p in parts) >= min_samples:
            break
    else:
        parts = _top_up(parts, min_samples, rng)
    return [rng.permutation(p) for p in parts]


def partition_dirichlet_capped(labels: np.ndarray, n_clients: int, beta: float, min_samples: int,
                               rng, attempts: int = 1000) -> list[np.ndarray]:
    """Label skew as the PFL-Non-IID generator (used by the ALI-DPFL code) draws it: class by
    class (0, 1, ...), shuffle the class's samples, draw p ~ Dir(beta), zero the share of every
    client that already holds N / n_clients samples or more, renormalise, and cut. The whole
    draw is repeated until every client holds at least `min_samples`. The cap is what keeps
    client sizes within about N / n_clients, unlike `dirichlet`. With a legacy RandomState the
    draws are those of the generator, call for call."""
    labels = np.asarray(labels)
    n = len(labels)
    if n_clients * min_samples > n:
        raise ValueError(f"cannot give {n_clients} clients {min_samples} samples each from {n} samples")
    classes = int(labels.max()) + 1
    for _ in range(attempts):
        buckets: list[list[int]] = [[] for _ in range(n_clients)]
        for k in range(classes):
            idx = np.where(labels == k)[0]
            rng.shuffle(idx)
            p = rng.dirichlet(np.repeat(float(beta), n_clients))
            p = np.array([pj * (len(b) < n / n_clients) for pj, b in zip(p, buckets)])
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for b, part in zip(buckets, np.split(idx, cuts)):
                b.extend(part.tolist())
        if min(len(b) for b in buckets) >= min_samples:
            return [np.asarray(b, dtype=np.int64) for b in buckets]
    raise ValueError(f"data.partition = dirichlet_capped: no draw in {attempts} gave every client "
                     f"data.min_samples = {min_samples} samples (lower it or raise data.dirichlet_beta)")


def _top_up(parts: list[np.ndarray], min_samples: int, rng: np.random.Generator) -> list[np.ndarray]:
    parts = [p.copy() for p in parts]
    for j in range(len(parts)):
        while len(parts[j]) < min_samples:
            donor = int(np.argmax([len(p) for p in parts]))
            take = min(min_samples - len(parts[j]), len(parts[donor]) - min_samples)
            pick = rng.permutation(len(parts[donor]))
            parts[j] = np.concatenate([parts[j], parts[donor][pick[:take]]])
            parts[donor] = np.delete(parts[donor], pick[:take])
    return parts

"""Federated datasets: the LEAF/FedProx Synthetic(alpha, beta) generator and MNIST-style IDX files.

`load_federated(cfg, n_clients, seed)` returns one `FederatedData`: a (X, y) pair per client
and a pooled server-side test set. Everything random comes from named `emulator.rng`
streams, so the same (cfg, n_clients, seed) gives bitwise identical tensors in any process.

* ``synthetic`` (default, no files): Li et al., "Federated optimization in heterogeneous
  networks" (FedProx), Synthetic(alpha, beta). Per client k: u_k ~ N(0, alpha),
  B_k ~ N(0, beta), W_k ~ N(u_k, 1) (dim x classes), b_k ~ N(u_k, 1), v_k ~ N(B_k, 1) per
  feature, x ~ N(v_k, Sigma) with Sigma = diag(j^-1.2), y = argmax(W_k^T x + b_k)
  (= argmax softmax). As in the FedProx generator code, alpha and beta are used as
  *standard deviations*. Client k draws from its own stream, so its data do not depend on
  how many other clients there are. A share `test_fraction` of every client's samples is
  pooled into the server's test set.
* ``fashion_mnist`` / ``mnist``: the four IDX files (gzipped or plain), parsed with numpy,
  scaled to float32 in [0, 1] (no mean/std normalisation), one sample is (1, 28, 28). The
  training set is partitioned across clients (``iid`` or ``dirichlet`` label skew); the
  official test set is the server's test set.
"""
from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from emulator.rng import stream

DATASETS = ("synthetic", "fashion_mnist", "mnist")
PARTITIONS = ("iid", "dirichlet")

# Where the IDX files are looked for when data.root is empty.
STANDARD_DIRS: dict[str, list[str]] = {
    "fashion_mnist": ["/usr/share/datasets/fashion-mnist"],
    "mnist": ["/usr/share/datasets/mnist"],
}
# Sub-directories of data.root that are also tried (plain, Debian-style, torchvision-style).
_ROOT_SUBDIRS: dict[str, list[str]] = {
    "fashion_mnist": ["fashion-mnist", "fashion_mnist", "FashionMNIST/raw"],
    "mnist": ["mnist", "MNIST/raw"],
}
_HOW_TO_GET: dict[str, str] = {
    "fashion_mnist": "install them with `apt-get install dataset-fashion-mnist` or put the 4 IDX files in data.root",
    "mnist": "put the 4 IDX files (train-images-idx3-ubyte[.gz], ...) in data.root or /usr/share/datasets/mnist",
}
TRAIN_SIZES = {"fashion_mnist": 60000, "mnist": 60000}
TEST_SIZES = {"fashion_mnist": 10000, "mnist": 10000}
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dimensions
LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dimension


class DatasetNotFound(Exception):
    """The dataset's files are not where we looked; the message says where and how to get them."""


class IDXFormatError(ValueError):
    """An IDX file is malformed; the message names the file."""


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
    """Training samples the image dataset will have after `max_train` (no file access)."""
    full = TRAIN_SIZES[cfg.dataset]
    return min(cfg.max_train, full) if cfg.max_train > 0 else full


def validate_data(cfg, n_clients: int, check) -> None:
    """Range checks for DataConfig; `check(ok, key, value, expected)` raises on failure. Loads no files."""
    check(cfg.dataset in DATASETS, "data.dataset", cfg.dataset, " | ".join(DATASETS))
    check(cfg.min_samples >= 1, "data.min_samples", cfg.min_samples, "an integer >= 1")
    if cfg.dataset == "synthetic":
        check(cfg.alpha >= 0, "data.alpha", cfg.alpha, "a number >= 0")
        check(cfg.beta >= 0, "data.beta", cfg.beta, "a number >= 0")
        check(cfg.dim >= 1, "data.dim", cfg.dim, "an integer >= 1")
        check(cfg.classes >= 2, "data.classes", cfg.classes, "an integer >= 2")
        check(cfg.samples_per_client >= 1, "data.samples_per_client", cfg.samples_per_client, "an integer >= 1")
        check(cfg.size_sigma >= 0, "data.size_sigma", cfg.size_sigma, "a number >= 0")
        check(0 < cfg.test_fraction < 1, "data.test_fraction", cfg.test_fraction, "a number in (0, 1)")
        return
    check(cfg.partition in PARTITIONS, "data.partition", cfg.partition, " | ".join(PARTITIONS))
    check(cfg.dirichlet_beta > 0, "data.dirichlet_beta", cfg.dirichlet_beta, "a number > 0")
    check(cfg.max_train >= 0, "data.max_train", cfg.max_train, "an integer >= 0 (0 = all)")
    check(cfg.max_test >= 0, "data.max_test", cfg.max_test, "an integer >= 0 (0 = all)")
    n = available_train(cfg)
    check(n_clients * cfg.min_samples <= n, "data.min_samples", cfg.min_samples,
          f"at most {n // n_clients} ({n} training samples over clients.n={n_clients} clients)")


# --- entry point ------------------------------------------------------------------------

def load_federated(cfg, n_clients: int, seed: int) -> FederatedData:
    if n_clients < 1:
        raise ValueError(f"n_clients = {n_clients}: expected an integer >= 1")
    if cfg.dataset == "synthetic":
        return synthetic(cfg, n_clients, seed)
    if cfg.dataset in ("fashion_mnist", "mnist"):
        return _image_dataset(cfg, n_clients, seed)
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


# --- IDX files --------------------------------------------------------------------------

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


def search_dirs(cfg) -> list[Path]:
    if cfg.root:
        root = Path(cfg.root).expanduser()
        return [root] + [root / sub for sub in _ROOT_SUBDIRS[cfg.dataset]]
    return [Path(p) for p in STANDARD_DIRS[cfg.dataset]]


def find_idx_files(cfg) -> dict[str, Path]:
    """The four IDX files of the first searched directory that holds them all."""
    dirs = search_dirs(cfg)
    for d in dirs:
        found = {k: _find_file(d, stem) for k, stem in IDX_FILES.items()}
        if all(found.values()):
            return found  # type: ignore[return-value]
    raise DatasetNotFound(
        f"dataset {cfg.dataset}: IDX files ({', '.join(s + '[.gz]' for s in IDX_FILES.values())}) "
        f"not found in {', '.join(map(str, dirs))}; {_HOW_TO_GET[cfg.dataset]}")


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


def _to_tensor(images_u8: np.ndarray) -> torch.Tensor:
    x = images_u8.astype(np.float32)
    x /= np.float32(255.0)  # exactly pixel / 255, as torchvision's ToTensor
    return torch.from_numpy(x).unsqueeze(1)  # (N, 1, H, W)


def _image_dataset(cfg, n_clients: int, seed: int) -> FederatedData:
    f = find_idx_files(cfg)
    xtr, ytr = load_idx_split(f["train_images"], f["train_labels"], cfg.max_train)
    xte, yte = load_idx_split(f["test_images"], f["test_labels"], cfg.max_test)
    num_classes = int(max(ytr.max(), yte.max())) + 1
    rng = stream(seed, "partition")
    if cfg.partition == "iid":
        parts = partition_iid(len(ytr), n_clients, rng)
    elif cfg.partition == "dirichlet":
        parts = partition_dirichlet(ytr, n_clients, cfg.dirichlet_beta, cfg.min_samples, rng)
    else:
        raise ValueError(f"data.partition = {cfg.partition!r}: expected {' | '.join(PARTITIONS)}")
    short = [i for i, p in enumerate(parts) if len(p) < cfg.min_samples]
    if short:
        raise ValueError(f"data.min_samples = {cfg.min_samples}: client {short[0]} gets only "
                         f"{len(parts[short[0]])} of {len(ytr)} training samples")
    train = [(_to_tensor(xtr[p]), torch.from_numpy(ytr[p])) for p in parts]
    test = (_to_tensor(xte), torch.from_numpy(yte))
    return FederatedData(train, test, num_classes, (1,) + tuple(xtr.shape[1:]))


# --- partitions -------------------------------------------------------------------------

def partition_iid(n_samples: int, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation split into n_clients near-equal parts (sizes differ by at most 1)."""
    return [p.copy() for p in np.array_split(rng.permutation(n_samples), n_clients)]


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

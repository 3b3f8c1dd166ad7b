"""Image datasets: uint8 images in arrays (`ImageArrays`, the family a user's own image dataset subclasses),
those read from files found on this machine or downloaded (`FileImages`: the IDX and CIFAR readers'
families, nodes.data.idx and nodes.data.cifar), and `ImageData`, the federated dataset over the arrays."""

from __future__ import annotations

import math
from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from nodes.contracts.schema import Normalization, Partition, Split
from nodes.data import locate
from nodes.data.federated import FederatedData, Samples
from nodes.data.fetch import ChecksumError, download
from nodes.data.locate import NETWORK_ERRORS, DatasetNotFound, download_failed
from nodes.data.normalize import ChannelStats, to_float
from nodes.data.partition import group_sizes, partition, partition_rng, split_share
from nodes.data.spec import INT64, DatasetMismatch, DatasetSpec

if TYPE_CHECKING:
    from nodes.contracts.schema import Check, DataConfig

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # x_train, y_train, x_test, y_test
UINT8 = 1  # bytes of a pixel as read


class ImageArrays(DatasetSpec):
    """Declare a dataset of uint8 images that `arrays` returns, shared out and normalised as the shipped ones.

    The clients' shares follow data.partition and data.split, pixels are scaled by data.normalize, and
    data.quality's salt-and-pepper and label noise apply: as for MNIST, FashionMNIST and CIFAR-10. A
    subclass sets the class attributes below, which answer what a run asks before any array is made,
    and writes `arrays`.

    Attributes:
        train_size: the training samples `arrays` returns (at most: the estimates count these).
        test_size: the test samples (at most).
        sample_shape: one image's (channels, height, width).
        classes: the number of classes; labels are 0 .. classes - 1.
        channel_stats: per channel, the (means, standard deviations) of the training images' pixel / 255,
            which data.normalize=standard subtracts and divides by; None: only half and none apply.
    """

    pixels = True
    channel_stats: ChannelStats | None = None

    @property
    @abstractmethod
    def train_size(self) -> int:
        """The training samples `arrays` returns, at most."""

    @property
    @abstractmethod
    def test_size(self) -> int:
        """The test samples `arrays` returns, at most."""

    @abstractmethod
    def arrays(self) -> Arrays:
        """Return the dataset's images and labels, the same in every process.

        Returns:
            (x_train, y_train, x_test, y_test): uint8 images of shape (N, *sample_shape) and N integer
            labels each; data.max_train and data.max_test keep the first of them.
        """

    def validate(self, n_clients: int, check: Check) -> None:
        cfg = self.cfg
        check(
            not cfg.groups or cfg.partition == Partition.QUANTITY,
            "data.groups",
            cfg.groups,
            "no groups unless data.partition = quantity on an image dataset",
        )
        check(cfg.partition in list(Partition), "data.partition", cfg.partition, Partition.describe())
        check(cfg.normalize in list(Normalization), "data.normalize", cfg.normalize, Normalization.describe())
        check(
            cfg.normalize != Normalization.STANDARD or self.channel_stats is not None,
            "data.normalize",
            cfg.normalize,
            f"half | none: data.dataset={cfg.dataset} declares no channel_stats",
        )
        check(cfg.split in list(Split), "data.split", cfg.split, Split.describe())
        n = self.client_samples(n_clients)
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

    def client_samples(self, n_clients: int) -> int:
        """The samples the partition shares out, after max_train / max_test: the training set, or training
        plus test set when data.split = per_client."""
        n = _capped(self.train_size, self.cfg.max_train)
        if self.cfg.split == Split.PER_CLIENT:
            n += _capped(self.test_size, self.cfg.max_test)
        return n

    def largest_client(self, n_clients: int) -> int:
        d, samples = self.cfg, self.client_samples(n_clients)
        if d.partition == Partition.QUANTITY and d.groups:
            return max(g.samples for g in d.groups)
        if d.partition == Partition.SHARDS:
            return math.ceil(samples / (n_clients * d.shards_per_client)) * d.shards_per_client
        return math.ceil(samples / n_clients)  # iid; dirichlet sizes are drawn with the labels: their mean

    def test_samples(self, n_clients: int) -> int:
        return _capped(self.test_size, self.cfg.max_test)

    def source_bytes(self, n_clients: int) -> int:
        """The pixels and int64 labels as read (data.split = per_client: the test set pooled with the rest)."""
        pooled = self.cfg.split == Split.PER_CLIENT
        read = self.client_samples(n_clients) + (0 if pooled else self.test_samples(n_clients))
        return read * (math.prod(self.sample_shape) * UINT8 + INT64)

    def pixel_extremes(self) -> tuple[np.ndarray, np.ndarray]:
        """Pixels 0 and 255 after data.normalize, per channel, float32 of shape (C, 1, 1)."""
        channels = self.sample_shape[0]
        both = to_float(
            np.array([0, 255], dtype=np.uint8).repeat(channels).reshape(2, channels, 1, 1),
            self.channel_stats,
            self.cfg.normalize,
        )
        return both[0], both[1]

    def load(self, n_clients: int, seed: int) -> FederatedData:
        xtr, ytr, xte, yte = self.arrays()
        if self.cfg.max_train > 0:
            xtr, ytr = xtr[: self.cfg.max_train], ytr[: self.cfg.max_train]
        if self.cfg.max_test > 0:
            xte, yte = xte[: self.cfg.max_test], yte[: self.cfg.max_test]
        self._check("training", xtr, ytr, self.train_size)
        self._check("test", xte, yte, self.test_size)
        return ImageData(self, n_clients, seed, xtr, ytr, xte, yte)

    def _check(self, which: str, x: np.ndarray, y: np.ndarray, size: int) -> None:
        """`arrays` gave what the class declares: a run's estimates and its model were sized by it."""
        labels_ok = np.issubdtype(y.dtype, np.integer) and (len(y) == 0 or (0 <= y.min() and y.max() < self.classes))
        shaped = x.dtype == np.uint8 and x.shape[1:] == tuple(self.sample_shape) and y.shape == x.shape[:1]
        if shaped and labels_ok and len(y) <= size:
            return
        raise DatasetMismatch(
            f"data.dataset = {self.cfg.dataset!r}: its {which} set is {x.dtype} images {x.shape} and {y.dtype} "
            f"labels {y.shape}; expected at most {size} uint8 images of shape {tuple(self.sample_shape)} "
            f"and as many labels in [0, {self.classes})"
        )


class FileImages(ImageArrays):
    """Images read from files: looked for in data.root, then where the system installs them, then in
    data.cache_dir, where the official files are downloaded (md5-verified) when data.download is true.

    Attributes:
        system_dirs: the folders, in the system's datasets folder (locate.SYSTEM_DIR), its package installs.
        subdirs: sub-folders of data.root and of the system folders that are searched too.
        how_to_get: what the error says to do where the files are nowhere.
        mirrors: where the official files are downloaded from, tried in order.
        md5: the official files' md5, by file name.
    """

    system_dirs: tuple[str, ...]
    subdirs: tuple[str, ...]
    how_to_get: str
    mirrors: tuple[str, ...]
    md5: ClassVar[dict[str, str]]

    @classmethod
    def standard_dirs(cls) -> list[Path]:
        """Where the system's package puts the files (read from locate.SYSTEM_DIR when asked)."""
        return [locate.SYSTEM_DIR / d for d in cls.system_dirs]

    @classmethod
    def installed(cls) -> Path | None:
        """The system location that holds the dataset (a standard directory that exists), else None."""
        return next((d for d in cls.standard_dirs() if d.is_dir()), None)

    def search_dirs(self) -> list[Path]:
        """data.root and the standard locations, each with its usual sub-directories (not the cache)."""
        bases = ([Path(self.cfg.root).expanduser()] if self.cfg.root else []) + self.standard_dirs()
        return [d for b in bases for d in [b] + [b / sub for sub in self.subdirs]]

    def cache_dir(self) -> Path:
        return Path(self.cfg.cache_dir).expanduser() / self.cfg.dataset

    def not_found(self, what: str, looked: list[Path], reason: str) -> DatasetNotFound:
        return DatasetNotFound(
            f"dataset {self.cfg.dataset}: {what} not found in {', '.join(map(str, looked))}; "
            f"{reason}; {self.how_to_get}"
        )

    def downloaded(self, name: str, what: str, looked: list[Path]) -> Path:
        """The official file `name` in the cache, downloaded from the first mirror that serves it with its md5."""
        failures, checksum_error = [], None
        for base in self.mirrors:
            try:
                return download(base + name, self.cache_dir() / name, self.md5[name])
            except ChecksumError as e:
                checksum_error = e
            except NETWORK_ERRORS as e:
                failures.append(download_failed(base + name, e))
        if checksum_error is not None:
            raise checksum_error
        raise self.not_found(what, looked, "; ".join(failures))


def _capped(full: int, limit: int) -> int:
    return min(limit, full) if limit > 0 else full


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


class ImageData(FederatedData):
    """uint8 (N, C, H, W) images partitioned across clients by their labels (see data.split); a
    client's pixels are converted to float only when it is built."""

    def __init__(
        self,
        spec: ImageArrays,
        n_clients: int,
        seed: int,
        xtr: np.ndarray,
        ytr: np.ndarray,
        xte: np.ndarray,
        yte: np.ndarray,
    ) -> None:
        cfg = self.cfg = spec.cfg
        self.n_clients, self.channel_stats = n_clients, spec.channel_stats
        self.num_classes = int(max(ytr.max(), yte.max())) + 1
        self.input_shape = tuple(xtr.shape[1:])
        if cfg.split == Split.PER_CLIENT:
            xtr, ytr = np.concatenate([xtr, xte]), np.concatenate([ytr, yte])
        rng = partition_rng(cfg, seed)
        parts = partition(cfg, ytr, n_clients, rng)
        short = [i for i, p in enumerate(parts) if len(p) < cfg.min_samples]
        if short:
            raise ValueError(
                f"data.min_samples = {cfg.min_samples}: client {short[0]} gets only "
                f"{len(parts[short[0]])} of {len(ytr)} samples"
            )
        test_idx: np.ndarray | slice = slice(None)
        self.test_parts: list[np.ndarray] = []
        if cfg.split == Split.PER_CLIENT:
            shares = [split_share(p, cfg.client_train_fraction, rng) for p in parts]
            parts = [train for train, _ in shares]
            self.test_parts = [test for _, test in shares]
            test_idx = np.concatenate(self.test_parts)
            xte, yte = xtr, ytr
        self.parts, self.xtr, self.ytr = parts, xtr, ytr
        self.test_idx, self.xte, self.yte = test_idx, xte, yte

    @property
    def sizes(self) -> list[int]:
        return [len(p) for p in self.parts]

    def _build(self, k: int) -> Samples:
        return self._samples(self.xtr, self.ytr, self.parts[k])

    def test(self) -> Samples:
        return self._samples(self.xte, self.yte, self.test_idx)

    def client_test(self, k: int) -> Samples:
        """Client k's test share (data.split = per_client); `test()` is their union, in client order."""
        if not self.test_parts:
            raise ValueError(f"data.split = {self.cfg.split!r}: clients hold test shares only with per_client")
        if not 0 <= k < self.n_clients:
            raise IndexError(f"client {k}: expected an id in [0, {self.n_clients})")
        return self._samples(self.xte, self.yte, self.test_parts[k])

    def _samples(self, x: np.ndarray, y: np.ndarray, idx: np.ndarray | slice) -> Samples:
        # copies both (a slice would hand out a view of the dataset's own labels)
        return to_float(x[idx], self.channel_stats, self.cfg.normalize), y[idx].astype(np.int64, order="C")

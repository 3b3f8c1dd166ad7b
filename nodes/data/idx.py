"""MNIST and FashionMNIST: the four IDX files (gzipped or plain), found, fetched and parsed with numpy."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nodes.data.fetch import ChecksumError, download, verify_md5
from nodes.data.locate import (
    NETWORK_ERRORS,
    cache_dir,
    download_failed,
    not_found,
    search_dirs,
)

if TYPE_CHECKING:
    from nodes.contracts.schema import DataConfig

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
    "fashion_mnist": [
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    ],
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


class IDXFormatError(ValueError):
    """An IDX file is malformed; the message names the file."""


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
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expect = int(np.prod(shape))
    if len(raw) - header != expect:
        raise IDXFormatError(
            f"{path}: header says shape {shape} ({expect} bytes of data), file has {len(raw) - header}"
        )
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


def _verified_or_downloaded(cfg: DataConfig, path: Path) -> Path:
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
            failures.append(download_failed(base + path.name, e))
    if checksum_error is not None:
        raise checksum_error
    raise not_found(cfg, f"IDX file {path.name}", search_dirs(cfg) + [path.parent], "; ".join(failures))


def find_idx_files(cfg: DataConfig) -> dict[str, Path]:
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
        raise not_found(
            cfg,
            f"IDX files ({', '.join(s + '[.gz]' for s in IDX_FILES.values())})",
            dirs + [cache],
            "download disabled (data.download=false)",
        )
    return {k: _verified_or_downloaded(cfg, p) for k, p in cached.items()}


def load_idx_split(images_path: str | Path, labels_path: str | Path, limit: int = 0) -> tuple[np.ndarray, np.ndarray]:
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


def load_idx_dataset(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images uint8 (N, 1, H, W), train labels, test images, test labels)."""
    f = find_idx_files(cfg)
    xtr, ytr = load_idx_split(f["train_images"], f["train_labels"], cfg.max_train)
    xte, yte = load_idx_split(f["test_images"], f["test_labels"], cfg.max_test)
    return xtr[:, None], ytr, xte[:, None], yte

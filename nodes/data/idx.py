"""Images in the four IDX files of MNIST's layout (gzipped or plain), found, fetched and parsed with numpy:
the family of MNIST and FashionMNIST (nodes.data.catalog)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from nodes.data.fetch import verify_md5
from nodes.data.images import Arrays, FileImages

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dimensions
LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dimension


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


def load_idx_split(images_path: str | Path, labels_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (N, H, W) and int64 labels (N,)."""
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC)
    if images.ndim != 3:
        raise IDXFormatError(f"{images_path}: expected 3 dimensions (N, rows, cols), got shape {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise IDXFormatError(f"{labels_path}: {labels.shape[0]} labels for {len(images)} images in {images_path}")
    return images, labels.astype(np.int64)


class IdxFiles(FileImages):
    """Images and labels in the four IDX files: train-images-idx3-ubyte, train-labels-idx1-ubyte,
    t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, gzipped or not; the official .gz files in the
    cache (md5: by their names)."""

    def find_files(self) -> dict[str, Path]:
        """The four IDX files: from the first searched directory that holds them all, else the
        official .gz files in the cache (md5-verified, the missing ones downloaded)."""
        dirs = self.search_dirs()
        for d in dirs:
            found = _idx_files_in(d)
            if found:
                return found
        cached = {k: self.cache_dir() / f"{stem}.gz" for k, stem in IDX_FILES.items()}
        if not self.cfg.download and not all(p.is_file() for p in cached.values()):
            raise self.not_found(
                f"IDX files ({', '.join(s + '[.gz]' for s in IDX_FILES.values())})",
                dirs + [self.cache_dir()],
                "download disabled (data.download=false)",
            )
        return {k: self._verified_or_downloaded(p) for k, p in cached.items()}

    def _verified_or_downloaded(self, path: Path) -> Path:
        """An official .gz file in the cache: md5-verified if there, else downloaded."""
        if path.is_file():
            verify_md5(path, self.md5[path.name])
            return path
        return self.downloaded(path.name, f"IDX file {path.name}", self.search_dirs() + [path.parent])

    def arrays(self) -> Arrays:
        """(train images uint8 (N, 1, H, W), train labels, test images, test labels)."""
        f = self.find_files()
        xtr, ytr = load_idx_split(f["train_images"], f["train_labels"])
        xte, yte = load_idx_split(f["test_images"], f["test_labels"])
        return xtr[:, None], ytr, xte[:, None], yte

"""Checksummed files: md5 of a file, and a download that lands only if its md5 matches.

A download streams into `<dest>.part` with a tqdm progress bar, is checked against the
expected md5, and only then renamed to `dest` (atomic on one filesystem), so a reader
never sees a half-written or unverified file, even with several processes racing.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CHUNK = 1 << 20
TIMEOUT_S = 60


class ChecksumError(ValueError):
    """A file's md5 is not the official one; the message names the file."""


def md5_of(path: str | Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_md5(path: str | Path, expected: str) -> None:
    got = md5_of(path)
    if got != expected:
        raise ChecksumError(
            f"{path}: md5 {got} does not match the official {expected} "
            f"(corrupted or not the official file; delete it and retry)"
        )


def download(url: str, dest: Path, expected_md5: str) -> Path:
    """Fetch `url` into `dest` (md5-verified). Raises OSError (incl. URLError) or ChecksumError."""
    # here: every process imports this module with its dataset's declaration (nodes.data.catalog)
    import urllib.request

    from tqdm import tqdm

    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f"{dest.name}.{os.getpid()}.part")
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(part, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name, leave=False) as bar:
                for chunk in iter(lambda: response.read(CHUNK), b""):
                    out.write(chunk)
                    bar.update(len(chunk))
        got = md5_of(part)
        if got != expected_md5:
            raise ChecksumError(
                f"{dest.name} downloaded from {url}: md5 {got} does not match the official {expected_md5}; not kept"
            )
        os.replace(part, dest)
        return dest
    finally:
        part.unlink(missing_ok=True)

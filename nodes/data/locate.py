"""Where the system's dataset packages put their files, and the error that says where a dataset's files
were not (nodes.data.images.FileImages looks for them)."""

from __future__ import annotations

import http.client
import os
from pathlib import Path

# Where the system's dataset packages put their files (Debian's dataset-fashion-mnist). The variable
# moves it: pointed at an empty folder, the machine looks like one without them (docs/data-models.md).
SYSTEM_DIR_VARIABLE = "DPFL_SYSTEM_DATASETS"
SYSTEM_DIR = Path(os.environ.get(SYSTEM_DIR_VARIABLE) or "/usr/share/datasets")
NETWORK_ERRORS = (OSError, http.client.HTTPException)  # URLError and timeouts are OSErrors


class DatasetNotFound(Exception):
    """The dataset's files are not where we looked; the message says where and how to get them."""


def download_failed(url: str, e: Exception) -> str:
    return f"download from {url} failed ({getattr(e, 'reason', e)})"

"""`python -m emulator` as a user runs it: from a directory of theirs, with the project on PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def emulator(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `python -m emulator ARGS` in `cwd`, its output captured."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "emulator", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )

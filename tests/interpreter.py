"""`python` and `python3` commands that start the interpreter running the tests, in its own installation.

A symlink to sys.executable is not enough: a virtualenv's interpreter finds its packages through the
pyvenv.cfg beside the path it was started from, so a link in another folder starts the base interpreter
without them. A script that execs sys.executable starts it from its own path, whatever the installation
(venv, conda, pipx, system). Standard library only: tests/e2e/test_doc_snippets.py runs it in a venv.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

NAMES = ("python", "python3")


def write_commands(folder: Path) -> None:
    """`folder`/python and `folder`/python3: scripts that exec this interpreter with their arguments."""
    for name in NAMES:
        script = folder / name
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        script.chmod(0o755)

"""Workers whose setup fails on their node (tests/refusing_worker.py) refuse it once, are not restarted,
and the run ends at once in one line, exit 1, that says what they said; run.json `failed` with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.conftest import FAST, REPO
from tests.refusing_worker import DETAIL

# `python -m emulator ARGS` whose local workers are tests.refusing_worker
SERVER = (
    "import sys; from nodes.transport import supervisor; from tests.refusing_worker import COMMAND; "
    "supervisor.WORKER_COMMAND = COMMAND; from emulator.__main__ import main; sys.exit(main())"
)
QUICK_S = 60.0  # two worker starts, no restart: transport.worker_timeout_s is 600 s


def test_workers_that_refuse_the_setup_are_not_restarted_and_the_last_line_says_why(tmp_path):
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SERVER, *FAST, "transport.max_restarts=3", f"output.dir={tmp_path}", "output.name=run"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert time.monotonic() - started < QUICK_S
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    said = f"setup_failed: FileNotFoundError: {DETAIL}"
    error = f"no workers left: every local worker refused the setup ({said}), and no remote worker is ready"
    assert done.stderr.strip().splitlines()[-1] == f"error: {error}", done.stderr
    m = json.loads((tmp_path / "run" / "run.json").read_text())
    assert m["status"] == "failed" and m["error"] == f"NoWorkersLeft: {error}"
    t = m["transport"]
    assert (t["worker_deaths"], t["death_causes"], t["restarts"], sorted(t["retired_slots"])) == (
        2,
        {"refused": 2},
        0,
        [0, 1],
    )
    assert len(m["workers"]) == 2  # the two first started, none since

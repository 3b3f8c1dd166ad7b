"""Shared helpers: run the real emulator (server + worker processes) on tiny scenarios."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from emulator.config import load
from emulator.output import checkpoint
from emulator.output.results import WALL_CLOCK_COLUMNS, read_table
from nodes.transport.pool import WorkerPool
from tests.slow import SLOW

REPO = Path(__file__).resolve().parents[1]


def python_stdout(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """What `python -c code args...` prints, run from the repository by an interpreter of its own (which
    imports only what `code` does); it must exit 0. `env` is added to this process's environment."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


# Small and fast: 2 local workers, logistic regression on Synthetic(1, 1), one client at a time (a
# bundle's runs: tests/e2e/test_bundle_e2e.py; the default, train.bundle = auto: the golden results).
FAST = [
    "workers=2",
    "train.bundle=1",
    "output.progress=false",
    "clients.n=6",
    "budget.rounds=3",
    "dp.tau=2",
    "data.samples_per_client=60",
]


@pytest.fixture
def emulate(tmp_path):
    """emulate(*overrides, scenario=None) -> run directory of a finished run."""
    from emulator.run.lifecycle import run

    counter = iter(range(1000))

    def _emulate(*overrides: str, scenario: str | None = None) -> Path:
        cfg = load(scenario, [*FAST, f"output.dir={tmp_path}", f"output.name=run{next(counter)}", *overrides])
        return run(cfg)

    return _emulate


def gone(pid: int) -> bool:
    """No process `pid`, not even a zombie: it ended and was waited for."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def killed_after_round(overrides: list[str], run_dir: Path, rnd: int) -> None:
    """`python -m emulator OVERRIDES` (its output.dir/output.name naming `run_dir`) SIGKILLed as soon as
    round `rnd` has its rows; it must still be running then."""
    cmd = [sys.executable, "-m", "emulator", *overrides]
    server = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (run_dir / "rounds" / f"round-{rnd:06d}.parquet").exists():
        assert server.poll() is None and time.monotonic() < deadline, "the run ended before the kill point"
        time.sleep(0.01)
    server.send_signal(signal.SIGKILL)
    server.wait()


def killed_runs_checkpoint_state(run_dir: Path) -> dict[str, Any]:
    """The state of the checkpoint a resume of `run_dir` takes: checkpoint.npz, or the one before where a kill
    fell between checkpoint.save's two renames (as killed_after_round's kill, right after a round's rows, may)."""
    path = next(p for p in (run_dir / checkpoint.FILE, run_dir / checkpoint.PREVIOUS) if p.is_file())
    return checkpoint._read(path)[1]


def bare_pool(tmp_path: Path, *overrides: str) -> WorkerPool:
    """A server socket with no local workers, on a private ipc path, set up for seed 0."""
    p = WorkerPool(f"ipc://{tmp_path}/s.sock", load(None, list(overrides)).transport)
    p.set_up({"seed": 0})
    return p


@pytest.fixture
def pool(tmp_path):
    """bare_pool(), closed after the test."""
    p = bare_pool(tmp_path)
    yield p
    p.close()


@pytest.fixture
def torch_settings():
    """Every setting nodes.training.determinism.set_up_torch changes, restored after the test, which sets them in
    the test's own process."""
    import torch

    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (torch.get_deterministic_debug_mode(), cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32)
    threads = torch.get_num_threads()
    yield
    mode, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = saved
    torch.set_deterministic_debug_mode(mode)
    torch.set_num_threads(threads)


def needs_gpu() -> list[pytest.MarkDecorator]:
    """The marks of a test that needs a CUDA GPU: `gpu` (python -m bench.gpu_check runs them), skipped
    without one. Asking torch initialises CUDA in this test process only, never in a zygote."""
    import torch

    return [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture
def faulty_workers(monkeypatch):
    """Local workers act out the DPFL_FAULT_* variables (tests/faulty_worker.py)."""
    from nodes.transport import supervisor
    from tests.faulty_worker import COMMAND

    monkeypatch.setattr(supervisor, "WORKER_COMMAND", COMMAND)


def table(run_dir: Path, name: str) -> pa.Table:
    """A per-round table (wall-clock columns left out) or a static one (clients, privacy)."""
    from emulator.output.results import STATIC, read_static

    if name in STATIC:
        return read_static(run_dir, name)
    t = read_table(run_dir, name)
    return t.drop_columns(WALL_CLOCK_COLUMNS.get(name, []))


def privacy_ledgers(run_dir: Path) -> dict[int, dict]:
    """The run's privacy table as client id -> its ledger (the accountant's document of what it was charged)."""
    from emulator.output.results import read_privacy

    return {r["client"]: json.loads(r["ledger"]) for r in read_privacy(run_dir).to_pylist()}


def rows(run_dir: Path, name: str) -> list[dict]:
    """Rows as dicts, NaN written as the string 'nan' so that equal tables compare equal."""
    return [
        {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
        for r in table(run_dir, name).to_pylist()
    ]


def sigint_as_in_a_terminal() -> None:
    """preexec_fn for an emulator a test will Ctrl-C: SIGINT at its default, as a shell's foreground
    job has it. A background job of a non-interactive shell (`make test &`, `nohup … &`) inherits it
    ignored, Python keeps that, and the SIGINT would do nothing (measured: a CI run started so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `slow` the tests tests/slow.py lists: `make test-fast` leaves them out."""
    for item in items:
        slow = SLOW.get(item.nodeid.split("::")[0], {})
        if item.originalname in slow or item.name in slow:  # type: ignore[attr-defined]
            item.add_marker(pytest.mark.slow)


SKIPPED_LOG_VARIABLE = "DPFL_SKIPPED_TESTS"  # .ci/run: the newcomer's skips, run again with everything installed


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With DPFL_SKIPPED_TESTS=FILE, append the node id of each skipped test to FILE, one a line (what
    `pytest @FILE` runs). Only the main process writes: under xdist it receives every worker's reports."""
    path = os.environ.get(SKIPPED_LOG_VARIABLE)
    if path and report.skipped and not hasattr(report, "wasxfail") and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a") as f:
            f.write(report.nodeid + "\n")

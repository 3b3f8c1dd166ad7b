"""The golden runs: every shipped scenario for ROUNDS rounds at each of SEEDS, and one run killed
with SIGKILL and resumed, each through the real command line (`python -m emulator`); and what of
a run is its result: its tables less the wall-clock columns, and run.json's result fields.

`python -m tests.golden.record` writes them to tests/golden/expected/; tests/e2e/test_golden_results.py
runs them again and compares. MNIST and CIFAR-10 are not installable offline: their scenarios run
on small generated files (tests/unit/test_data.py's writers) found through data.root.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from emulator.config import SCENARIO_DIR, load
from emulator.output import checkpoint
from emulator.output.results import SCHEMAS, STATIC, WALL_CLOCK_COLUMNS, read_static, read_table
from nodes.data.cifar import CIFAR_DIR
from tests.unit.test_data import write_cifar, write_dataset

REPO = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).parent / "expected"
ROUNDS = 3
SEEDS = (0, 1)
TABLES = (*SCHEMAS, *STATIC)  # the per-round tables and the static ones: clients, privacy
# run.json's results: not its times, pids, paths, host or package versions
RUN_RESULT_KEYS = ("status", "stop_reason", "virtual_time_s", "privacy", "privacy_mechanism", "derived_budgets")
RUN_TIMEOUT_S = 600

# Generated stand-ins for the datasets not installable offline: enough samples for mnist.yaml's
# Dir(0.05) split with 100 samples a client and padpfl_quality.yaml's 60 clients of 150.
GENERATED_TRAIN, GENERATED_TEST = 10_000, 2_000
# Imported first by every Python process of a CIFAR-10 run (server, zygote, workers, evaluator):
# the generated batches cannot have the official md5s that nodes.data.cifar checks.
CIFAR_SITE = Path(__file__).parent / "cifar_site"
CIFAR_BATCHES_VARIABLE = "DPFL_GOLDEN_CIFAR_BATCHES"

# The resumed run: dropout.yaml, killed once its checkpoint holds round KILL_AFTER_ROUND. The rounds
# after it leave a poll of the checkpoint that a loaded machine delays time to land mid-run (with a
# few rounds after it, one such run had ended before its kill; tests/e2e/test_resume.py leaves margin too).
RESUMED_ROUNDS = 30
KILL_AFTER_ROUND = 2


@dataclass(frozen=True)
class Case:
    scenario: str  # relative to scenarios/
    seed: int
    rounds: int = ROUNDS
    resumed: bool = False  # SIGKILLed mid-run, then `python -m emulator resume`

    @property
    def name(self) -> str:
        stem = self.scenario.removesuffix(".yaml").replace("/", "-")
        return f"{stem}-seed{self.seed}" + ("-resumed" if self.resumed else "")

    @property
    def dataset(self) -> str:
        return str(load(self.scenario).data.dataset)


SCENARIOS = sorted(str(p.relative_to(SCENARIO_DIR)) for p in SCENARIO_DIR.rglob("*.yaml"))
RESUMED = Case("dropout.yaml", seed=0, rounds=RESUMED_ROUNDS, resumed=True)
CASES = [Case(s, seed) for s in SCENARIOS for seed in SEEDS] + [RESUMED]


@dataclass
class Result:
    """What a run is compared by: its tables (wall-clock columns dropped) and run.json's results."""

    tables: dict[str, pa.Table]
    run: dict[str, Any]


def generate_datasets(root: Path) -> None:
    """The generated MNIST and CIFAR-10 files under `root` (the same bytes every time)."""
    write_dataset(root / "mnist", n_train=GENERATED_TRAIN, n_test=GENERATED_TEST, gz=False)
    write_cifar(root / "cifar10" / CIFAR_DIR, n=GENERATED_TEST)  # five training batches and one test batch


def data_overrides(case: Case, datasets: Path) -> list[str]:
    """The overrides that point a generated dataset's scenario at its files, and never download."""
    if case.dataset in ("mnist", "cifar10"):
        return [f"data.root={datasets / case.dataset}", "data.download=false"]
    return []


def environment(case: Case, datasets: Path) -> dict[str, str]:
    """This process's environment with this checkout first on the Python path (and, for CIFAR-10,
    the generated batches' md5s registered in every process)."""
    path = [str(REPO), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ)
    if case.dataset == "cifar10":
        path.insert(0, str(CIFAR_SITE))
        env[CIFAR_BATCHES_VARIABLE] = str(datasets / "cifar10" / CIFAR_DIR)
    return {**env, "PYTHONPATH": os.pathsep.join(path)}


class Emulator:
    """`python -m emulator ARGS` in a process of its own, its stderr kept for the error it may end with."""

    def __init__(self, args: list[str], env: dict[str, str], new_session: bool = False) -> None:
        self.command = f"python -m emulator {' '.join(args)}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "emulator", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=new_session,
        )

    def finish(self) -> None:
        """Wait for it; an exit other than 0 raises with the command and its stderr's tail."""
        _, err = self.proc.communicate(timeout=RUN_TIMEOUT_S)
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.command}: exit {self.proc.returncode}\n{err.decode()[-3000:]}")


def run_case(case: Case, out: Path, datasets: Path) -> Path:
    """Run `case` into out/<case.name> through the command line; the run directory."""
    env = environment(case, datasets)
    args = [
        f"scenario={case.scenario}",
        f"budget.rounds={case.rounds}",
        f"seed={case.seed}",
        f"output.dir={out}",
        f"output.name={case.name}",
        "output.progress=false",
        *data_overrides(case, datasets),
    ]
    run_dir = out / case.name
    # a process group of its own, so that the kill takes its zygote, workers and evaluator with it
    run = Emulator(args, env, new_session=case.resumed)
    if case.resumed:
        kill_after_checkpoint(run, run_dir)
        run = Emulator(["resume", str(run_dir)], env)
    run.finish()
    return run_dir


def checkpointed_round(run_dir: Path) -> int:
    """The last round the run's checkpoint holds, -1 before its first (or between the two renames of
    checkpoint.save, when the file is briefly absent: the caller polls again)."""
    try:
        return int(checkpoint._read(run_dir / checkpoint.FILE)[1]["next_round"]) - 1
    except FileNotFoundError:
        return -1


def kill_after_checkpoint(run: Emulator, run_dir: Path) -> None:
    """SIGKILL the run's process group once its checkpoint holds round KILL_AFTER_ROUND, before its last."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while checkpointed_round(run_dir) < KILL_AFTER_ROUND:
        if run.proc.poll() is not None:
            run.finish()  # raises with the run's error, if it had one
            raise RuntimeError(f"{run.command}: ended before its checkpoint held round {KILL_AFTER_ROUND}")
        if time.monotonic() > deadline:
            os.killpg(run.proc.pid, signal.SIGKILL)
            raise RuntimeError(f"{run.command}: no checkpoint of round {KILL_AFTER_ROUND} in {RUN_TIMEOUT_S} s")
        time.sleep(0.01)
    os.killpg(run.proc.pid, signal.SIGKILL)
    run.proc.wait()
    if checkpointed_round(run_dir) >= RESUMED_ROUNDS - 1:
        raise RuntimeError(f"{run.command}: killed after its last round: nothing was left to resume")


def result_of(run_dir: Path) -> Result:
    tables = {name: read_table(run_dir, name).drop_columns(WALL_CLOCK_COLUMNS.get(name, [])) for name in SCHEMAS}
    manifest = json.loads((run_dir / "run.json").read_text())
    static = {name: read_static(run_dir, name) for name in STATIC}
    return Result({**tables, **static}, {k: manifest.get(k) for k in RUN_RESULT_KEYS})


def save(result: Result, test_samples: int, case_dir: Path) -> None:
    case_dir.mkdir(parents=True)
    for name, table in result.tables.items():
        pq.write_table(table, case_dir / f"{name}.parquet", compression="zstd")
    document = {"run": result.run, "test_samples": test_samples}
    (case_dir / "results.json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")


def expected(case: Case) -> tuple[Result, int]:
    """The recorded result of `case` and the size of its test set."""
    case_dir = EXPECTED / case.name
    document = json.loads((case_dir / "results.json").read_text())
    tables = {name: pq.read_table(case_dir / f"{name}.parquet") for name in TABLES}
    return Result(tables, document["run"]), int(document["test_samples"])


# Prints the size of the server's test set for scenario argv[1] with overrides argv[2:].
TEST_SET_SIZE = """
import sys
from emulator.config import load
from nodes.data import load_federated
cfg = load(sys.argv[1], sys.argv[2:])
print(len(load_federated(cfg.data, cfg.clients.n, cfg.seed).test()[1]))
"""


def test_set_size(case: Case, datasets: Path) -> int:
    """The size of the case's test set: an accuracy is a multiple of its inverse."""
    args = [case.scenario, f"seed={case.seed}", *data_overrides(case, datasets)]
    out = subprocess.run(
        [sys.executable, "-c", TEST_SET_SIZE, *args],
        cwd=REPO,
        env=environment(case, datasets),
        capture_output=True,
        text=True,
        check=True,
        timeout=RUN_TIMEOUT_S,
    )
    return int(out.stdout.strip().splitlines()[-1])

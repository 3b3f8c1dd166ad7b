"""python -m bench.gpu_check [--device cuda] [--budget-s 420] [--out DIR] [--data DIR] [--only a,b] [--small]

What a lent GPU machine is for, in one command: each line below is a row of one table, a measured
number or why there is none. Lines run in order within a time budget: one that would not finish in
what is left is skipped, and the table says so; every command it starts ends by the budget's end,
and the reproduction, cut short there, reports what it completed (`partial`).

* env: torch, the GPU and its driver, and the memory one worker's CUDA context takes (against the
  allowance emulator.run.devices.CUDA_CONTEXT_BYTES);
* tests: the test-suite's `gpu` tests (tests/unit/test_gpu_training.py, tests/e2e/test_gpu_runs.py,
  tests/e2e/test_cuda_init.py: the zygote forks with CUDA uninitialised, the server imports no torch);
* dropout: `python -m emulator scenario=dropout.yaml device=cuda` completes and names the GPU;
* determinism: FashionMNIST with cnn_fmnist and with cnn_fedavg, whose conv layers have cnn_cifar's
  widths (32 and 64 channels; cnn_cifar itself takes 3 x 32 x 32 images only, and CIFAR-10's 170 MB
  exceed what a call carries: the tests line trains it on random images), each run with 1 worker, 4,
  and 4 again: identical tables, wall-clock columns aside;
* cpu_vs_gpu: W1 (python -m bench's FashionMNIST workload) on the CPU and on the GPU: final accuracy
  within 1 point, the curves overlaid in curves.png (each device draws its own DP-SGD noise);
* speed_w1, speed_table2: W1, and ALI-DPFL Table II's setting (its fixed tau = 1 row), on the GPU
  with 1, 4 and 8 workers sharing it, each against a one-process GPU floor (bench.floor: the same
  DP-SGD steps and evaluations, with Opacus's per-sample gradients, and with the trainer's own), and
  the GPU's utilisation while it ran (nvidia-smi, sampled);
* windows: the book-keeping path's three ways to take a conv layer's per-sample gradients, timed on
  the GPU (python -m bench.dp_step --windows): what nodes.training.dp_step.CONV_RULES' cuda rule awaits;
* bundles: W2 and W1 (python -m bench's) with 1 worker on the GPU and train.bundle = K for a few K
  (BUNDLES; a few rounds each, W1 evaluated after its last only): the clients trained a second in
  steady state, the median over the rounds after the first (bench's steady_rounds) of the updates
  that arrived over the round's wall_s; the best K and its ratio to K = 1;
* reproduce: `python -m bench.reproduce ali_dpfl_table2 --seeds 0`, capped at the rounds that fit
  in what is left of the budget (`--rounds N`), against the CPU times in bench/README.md. The other
  lines' estimates fill the default budget: last, it runs with what they leave unused, and is skipped
  when that is under its estimate (rerun it alone with `--only reproduce`).

`--device cpu --small` is a dry run of every line on a machine without a GPU (small sizes, the GPU's
part on the CPU). FashionMNIST is read where the emulator finds it, else from `--data` (the four .gz
files), which is linked as its standard location while the check runs (a lent machine's user is root).

Writes to --out ($OUT when set, else runs/gpu_check/): gpu_check.md (the table, then each line's
numbers), results.json, log.txt (every command's output), curves.png, utilisation.csv and the
reproduction's report; the runs themselves go to --runs (a temporary directory by default).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bench.__main__ import REPRODUCTION, W1, W2, steady_rounds
from emulator.config import load
from emulator.output.results import WALL_CLOCK_COLUMNS, read_table
from emulator.run.devices import CUDA_CONTEXT_BYTES
from nodes.transport.zygote import PROJECT_ROOT, worker_env

BUDGET_S = 420.0  # with pip's install of the wheels before it, under the 8 minutes a lent machine's call is sized to
FMNIST = "data.dataset=fashion_mnist"
DETERMINISM = [FMNIST, "clients.n=8", "dp.q=0.02", "dp.tau=4", "budget.rounds=3"]
DETERMINISM_MODELS = ("cnn_fmnist", "cnn_fedavg")  # Table V's CNN, and conv layers of cnn_cifar's widths
# The bundles line: W2 and W1 with 1 worker, each K of theirs (1 first, the ratios' base), few rounds;
# W1's one evaluation after its last round, which no round's wall_s includes
BUNDLES = {
    "W2": ([*W2, "budget.rounds=4"], (1, 10, 50, 100)),
    "W1": ([*W1, "budget.rounds=3", "eval.every=3"], (1, 5, 10)),
}
BUNDLES_SMALL = {
    "W2": ([*W2, "clients.n=200", "clients.per_round=20", "budget.rounds=2"], (1, 10)),
    "W1": ([*W1, "dp.tau=4", "budget.rounds=2", "eval.every=2"], (1, 5)),
}
TABLE2 = ["policy=fedavg_dp", "dp.tau=1", "budget.rounds=20"]  # Table II's first row, 20 of its rounds
TABLE2_RUNS = 7  # the runs of one seed of bench.reproduce ali_dpfl_table2
TABLE2_STEPS = 23  # their local steps a round, all 7 together: tau = 1, 2, 3, 5, 10 and two ALI-DPFL rows at 1
REPRODUCE_JOBS = 4  # runs at once on the one GPU
# bench/README.md's CPU times of the same reproduction (2 cores, --jobs 2)
CPU_TABLE2 = "1 h 44 min for all 3 seeds (2026-11-22), 4.1 min for --seeds 0 --rounds 1 (2026-11-26)"
# One worker's context: a process that sets CUDA up as a worker does and runs a cuBLAS product and a
# cuDNN convolution; it prints what torch's allocator holds and waits, while nvidia-smi reads the GPU.
CONTEXT_PROBE = """
import sys, torch
from nodes.training.determinism import set_up_torch
set_up_torch(torch.device("cuda", 0))
x = torch.randn(64, 64, device="cuda")
(x @ x).sum().item()
torch.nn.functional.conv2d(x.view(1, 1, 64, 64), torch.randn(1, 1, 3, 3, device="cuda")).sum().item()
print(torch.cuda.memory_reserved(), flush=True)
sys.stdin.readline()
"""
ENV_PROBE = (
    "import json, torch; ok = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
    "'cuda': torch.version.cuda, 'gpu': torch.cuda.get_device_name(0) if ok else None, "
    "'gpus': torch.cuda.device_count() if ok else 0}))"
)


class Failed(Exception):
    """A line's check did not hold, or a command it ran failed: the message says which, in one line."""


class Partial(Exception):
    """A line the budget's end cut short, with what it had measured by then: the message, in one line."""


@dataclass
class Ran:
    """A command that ran: its exit status, wall seconds, output, and the GPU's utilisation meanwhile."""

    rc: int
    wall: float
    output: str
    utilisation: list[float] = field(default_factory=list)

    @property
    def util(self) -> str:
        """The GPU's utilisation while it ran, as ', GPU x % mean, y % peak' ('' without nvidia-smi)."""
        if not self.utilisation:
            return ""
        mean = sum(self.utilisation) / len(self.utilisation)
        return f", GPU {mean:.0f} % mean, {max(self.utilisation):.0f} % peak"


class Check:
    """The lines' shared state: where things go, the budget, and how commands are run and logged."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.device, self.small = args.device, args.small
        self.out, self.runs = Path(args.out), Path(args.runs)
        self.deadline = time.monotonic() + args.budget_s
        self.budget_s = args.budget_s
        self.log = open(self.out / "log.txt", "a")  # noqa: SIM115  # open for the whole check
        self.util_rows: list[str] = []
        self.numbers: dict[str, dict] = {}  # per line, what results.json keeps
        self.env = worker_env({"PYTHONUNBUFFERED": "1"})

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, label: str, argv: list[str]) -> Ran:
        """`argv` to its end or the budget's, its output logged and the GPU's utilisation sampled meanwhile."""
        sampler = Utilisation(label)
        start = time.perf_counter()
        try:
            with tempfile.TemporaryFile("w+") as log:
                rc = self.wait(self.start(argv, log))
                log.seek(0)
                output = log.read()
        except OSError as e:  # no such program (nvidia-smi without a GPU driver)
            rc, output = 127, str(e)
        ran = Ran(rc, time.perf_counter() - start, output, sampler.stop())
        self.util_rows += [f"{label},{i},{u}" for i, u in enumerate(ran.utilisation)]
        self.log.write(f"\n$ {' '.join(argv)}   # {label}: exit {rc}, {ran.wall:.1f} s{ran.util}\n{output}")
        self.log.flush()
        return ran

    def start(self, argv: list[str], log: IO[str]) -> subprocess.Popen[str]:
        """`argv` in a session of its own, so that the budget's end stops its children too."""
        return subprocess.Popen(
            argv,
            cwd=PROJECT_ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            text=True,
            start_new_session=True,
        )

    def wait(self, proc: subprocess.Popen[str]) -> int:
        """Its exit status; at the budget's end its whole session is killed (exit -9)."""
        try:
            return proc.wait(timeout=max(1.0, self.left()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return -9

    def emulator(self, name: str, overrides: list[str], scenario: str | None = None) -> tuple[Ran, Path]:
        """A run of `python -m emulator` in the runs directory; Failed unless it completes."""
        run_dir = self.runs / name
        argv = [sys.executable, "-m", "emulator", *([f"scenario={scenario}"] if scenario else []), *overrides]
        argv += [f"output.dir={self.runs}", f"output.name={name}", "output.progress=false"]
        ran = self.run(name, argv)
        if ran.rc != 0:
            raise Failed(f"{name}: exit {ran.rc}: {_last_line(ran.output)}")
        return ran, run_dir

    def concurrently(self, runs: dict[str, list[str]]) -> dict[str, Path]:
        """Several emulator runs at once (timing nothing); Failed unless each completes."""
        failed = []
        with contextlib.ExitStack() as stack:
            started = []
            for name, overrides in runs.items():
                argv = [sys.executable, "-m", "emulator", *overrides]
                argv += [f"output.dir={self.runs}", f"output.name={name}", "output.progress=false"]
                log = stack.enter_context(tempfile.TemporaryFile("w+"))
                started.append((name, argv, log, self.start(argv, log)))
            for name, argv, log, proc in started:
                rc = self.wait(proc)
                log.seek(0)
                output = log.read()
                self.log.write(f"\n$ {' '.join(argv)}   # {name}: exit {rc}\n{output}")
                if rc != 0:
                    failed.append(f"{name}: exit {rc}: {_last_line(output)}")
        self.log.flush()
        if failed:
            raise Failed("; ".join(failed))
        return {name: self.runs / name for name in runs}


class Utilisation:
    """nvidia-smi's GPU utilisation, sampled every 200 ms in the background until stop(); nothing
    where nvidia-smi is absent."""

    def __init__(self, label: str) -> None:
        self.samples: list[float] = []
        try:
            self.proc: subprocess.Popen[str] | None = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        except OSError:
            self.proc = None
            return
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.samples.append(float(line.split(",")[0]))

    def stop(self) -> list[float]:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
            self.reader.join(timeout=5)
        return self.samples


def _last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def _rows(run_dir: Path, table: str) -> list[dict]:
    """A table's rows without its wall-clock columns, NaN as a string so that equal tables compare equal."""
    t = read_table(run_dir, table).drop_columns(WALL_CLOCK_COLUMNS.get(table, []))
    return [{k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in t.to_pylist()]


def _difference(a: Path, b: Path) -> str:
    """'' if the runs' tables are identical, else where they first differ."""
    for table in ("rounds", "client_rounds", "events"):
        ra, rb = _rows(a, table), _rows(b, table)
        if len(ra) != len(rb):
            return f"{table}: {len(ra)} rows against {len(rb)}"
        for x, y in zip(ra, rb):
            if x != y:
                column = next(k for k in x if x[k] != y[k])
                return f"{table}, round {x.get('round')}: {column} {x[column]!r} against {y[column]!r}"
    return ""


# --- the lines ----------------------------------------------------------------------------------------


def env_line(c: Check) -> str:
    ran = c.run("env", [sys.executable, "-c", ENV_PROBE])
    if ran.rc != 0:
        raise Failed(f"torch: {_last_line(ran.output)}")
    seen = json.loads(ran.output.strip().splitlines()[0])
    smi = c.run("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    c.numbers["env"] = dict(seen, nvidia_smi=smi.output.strip() if smi.rc == 0 else None)
    if not seen["gpus"]:
        return f"torch {seen['torch']}: no CUDA GPU, so no CUDA context to measure"
    context = _context_bytes(c)
    c.numbers["env"]["context_bytes"] = context
    return (
        f"torch {seen['torch']} (CUDA {seen['cuda']}), {seen['gpus']} x {seen['gpu']}, driver "
        f"{smi.output.split(',')[1].strip() if smi.rc == 0 else '?'}; a worker's CUDA context "
        f"{context / 2**20:.0f} MiB (allowance {CUDA_CONTEXT_BYTES / 2**20:.0f} MiB)"
    )


def _gpu_used_mib() -> float:
    out = subprocess.run(
        ["nvidia-smi", "--id=0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip())


def _context_bytes(c: Check) -> int:
    """GPU 0's memory in use with a worker-like process holding its context, less before it and less
    what torch's allocator holds."""
    before = _gpu_used_mib()
    proc = subprocess.Popen(
        [sys.executable, "-c", CONTEXT_PROBE],
        cwd=PROJECT_ROOT,
        env=c.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        reserved = int(proc.stdout.readline())
        time.sleep(0.5)  # nvidia-smi's reading lags the allocation
        during = _gpu_used_mib()
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    return int((during - before) * 2**20) - reserved


def tests_line(c: Check) -> str:
    files = ["tests/unit/test_gpu_training.py", "tests/e2e/test_gpu_runs.py", "tests/e2e/test_cuda_init.py"]
    ran = c.run("tests", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files])
    summary = _last_line(ran.output)
    c.numbers["tests"] = {"summary": summary}
    if ran.rc not in (0, 5):  # 5: every test deselected or skipped
        raise Failed(f"pytest -m gpu: {summary}")
    return f"pytest -m gpu: {summary}"


def dropout_line(c: Check) -> str:
    ran, run_dir = c.emulator("dropout", [f"device={c.device}"], scenario="dropout.yaml")
    devices = _manifest(run_dir)["devices"]
    gpus = [line for line in ran.output.splitlines() if line.startswith("gpus")]
    c.numbers["dropout"] = {"wall_s": ran.wall, "devices": devices}
    if c.device != "cpu" and not gpus:
        raise Failed(f"completed in {ran.wall:.1f} s, but the summary names no GPU (run.json: {devices})")
    where = gpus[0].split(None, 1)[1] if gpus else f"device {devices['device']}"
    return f"completes in {ran.wall:.1f} s on {where} (run.json devices: {devices['device']}{ran.util})"


def determinism_line(c: Check) -> str:
    size = ["budget.rounds=2", "clients.n=4", "dp.q=0.005"] if c.small else []
    four = 2 if c.small else 4
    runs: dict[str, list[str]] = {}
    for model in DETERMINISM_MODELS:
        base = [*DETERMINISM, f"model.name={model}", f"device={c.device}", *size]
        runs |= {
            f"det-{model}-1": [*base, "workers=1"],
            f"det-{model}-{four}": [*base, f"workers={four}"],
            f"det-{model}-{four}-again": [*base, f"workers={four}"],
        }
    dirs = c.concurrently(runs)
    results, broken = [], []
    for model in DETERMINISM_MODELS:
        one, many, again = (dirs[f"det-{model}-{s}"] for s in ("1", str(four), f"{four}-again"))
        across, rerun = _difference(one, many), _difference(many, again)
        results.append(f"{model}: 1 vs {four} workers {across or 'identical'}, rerun {rerun or 'identical'}")
        broken += [f"{model} {what}" for what, d in (("across workers", across), ("on a rerun", rerun)) if d]
    c.numbers["determinism"] = {"results": results}
    if broken:
        raise Failed("; ".join(results))
    return "; ".join(results)


def w1(c: Check) -> list[str]:
    small = ["budget.rounds=3", "dp.tau=4"] if c.small else []
    return [*W1, *small]


def cpu_vs_gpu_line(c: Check) -> str:
    _, on_cpu = c.emulator("w1-cpu", [*w1(c), "device=cpu", f"workers={2 if c.small else 8}"])
    gpu_run, on_gpu = c.emulator("w1-gpu-4", [*w1(c), f"device={c.device}", f"workers={2 if c.small else 4}"])
    c.numbers.setdefault("speed_w1", {})["emulator"] = {2 if c.small else 4: (gpu_run.wall, gpu_run.util)}
    accuracy = {d: _column(r, "rounds", "test_accuracy") for d, r in (("cpu", on_cpu), ("gpu", on_gpu))}
    gap = 100 * abs(accuracy["cpu"][-1] - accuracy["gpu"][-1])
    _plot(c.out / "curves.png", {"CPU": on_cpu, f"GPU ({c.device})": on_gpu})
    c.numbers["cpu_vs_gpu"] = {"final_accuracy": {d: a[-1] for d, a in accuracy.items()}, "gap_points": gap}
    text = (
        f"final accuracy CPU {100 * accuracy['cpu'][-1]:.2f} %, GPU {100 * accuracy['gpu'][-1]:.2f} %: "
        f"{gap:.2f} points apart (curves.png)"
    )
    if gap > 1:
        raise Failed(text + ", more than 1")
    return text


def _column(run_dir: Path, table: str, name: str) -> list[float]:
    return [float(v) for v in read_table(run_dir, table).sort_by("round").column(name).to_pylist()]


def _plot(path: Path, runs: dict[str, Path]) -> None:
    """Per round: the mean training loss of the clients, the test loss and the test accuracy, one
    line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for label, run_dir in runs.items():
        clients = read_table(run_dir, "client_rounds")
        by_round: dict[int, list[float]] = {}
        for r, loss in zip(clients.column("round").to_pylist(), clients.column("train_loss").to_pylist()):
            if loss is not None and not math.isnan(loss):
                by_round.setdefault(r, []).append(loss)
        rounds = sorted(by_round)
        axes[0].plot(rounds, [sum(by_round[r]) / len(by_round[r]) for r in rounds], label=label)
        for ax, name in ((axes[1], "test_loss"), (axes[2], "test_accuracy")):
            ax.plot(_column(run_dir, "rounds", "round"), _column(run_dir, "rounds", name), label=label)
    for ax, title in zip(axes, ("clients' training loss (mean)", "test loss", "test accuracy")):
        ax.set_title(title)
        ax.set_xlabel("round")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def speed(c: Check, key: str, overrides: list[str], scenario: str | None) -> str:
    """The emulator with 1, 4 and 8 workers on the device against two one-process floors."""
    counts = (1, 2) if c.small else (1, 4, 8)
    timed = c.numbers.setdefault(key, {}).setdefault("emulator", {})
    for n in counts:
        if n not in timed:
            ran, _ = c.emulator(f"{key}-{n}", [*overrides, f"device={c.device}", f"workers={n}"], scenario)
            timed[n] = (ran.wall, ran.util)
    floors = {}
    for path, label in (("hooks", "Opacus's per-sample gradients"), ("bk", "the trainer's own")):
        argv = [sys.executable, "-m", "bench.floor", "--device", c.device, "--evaluate"]
        argv += [f"--scenario={scenario}"] if scenario else []
        ran = c.run(f"{key}-floor-{path}", [*argv, *overrides, f"dp.per_sample={path}"])
        if ran.rc != 0:
            raise Failed(f"floor ({path}): exit {ran.rc}: {_last_line(ran.output)}")
        floors[path] = (ran.wall, label)
    c.numbers[key]["floors"] = {k: wall for k, (wall, _) in floors.items()}
    hooks, own = floors["hooks"][0], floors["bk"][0]
    best = min(timed, key=lambda n: timed[n][0])
    rows = ", ".join(
        f"{n} worker{'s' if n > 1 else ''} {wall:.1f} s = {wall / hooks:.2f}x / {wall / own:.2f}x{util}"
        for n, (wall, util) in sorted(timed.items())
    )
    floor_text = "; ".join(f"{wall:.1f} s with {label}" for wall, label in floors.values())
    return f"{rows} (x the floors: {floor_text}); fastest with {best}"


def speed_w1_line(c: Check) -> str:
    return speed(c, "speed_w1", w1(c), None)


def table2(c: Check) -> list[str]:
    return [*TABLE2, *(["budget.rounds=2"] if c.small else [])]


def speed_table2_line(c: Check) -> str:
    return speed(c, "speed_table2", table2(c), REPRODUCTION)


def windows_line(c: Check) -> str:
    argv = [sys.executable, "-m", "bench.dp_step", "--windows", "--device", c.device]
    ran = c.run("windows", argv + (["--repeats", "1", "--steps", "2", "--batch", "8"] if c.small else []))
    if ran.rc != 0:
        raise Failed(f"bench.dp_step --windows: exit {ran.rc}: {_last_line(ran.output)}")
    rows = [line.split() for line in ran.output.splitlines() if line.startswith("cnn_")]
    fastest = [min(zip(map(float, r[-6:-3]), ("strided", "indexed", "grouped")))[1] for r in rows]
    chosen = [r[-1] for r in rows]
    agree = sum(f == ch for f, ch in zip(fastest, chosen))
    c.numbers["windows"] = {"fastest": fastest, "chosen": chosen}
    return f"{len(rows)} conv layers: the rule's way was the fastest on {agree} (the table is in log.txt)"


def clients_per_s(rows: list[dict]) -> tuple[float, int, int]:
    """Steady rounds' (bench's steady_rounds) clients trained a second: the median over the rounds of
    the updates that arrived over the round's wall_s; and how many arrived of how many selected."""
    if not rows:
        raise Failed("no round after the first to measure")
    rate = statistics.median(r["arrived"] / r["wall_s"] for r in rows)
    return rate, sum(r["arrived"] for r in rows), sum(r["selected"] for r in rows)


def bundle_rates(c: Check, name: str, overrides: list[str], ks: tuple[int, ...]) -> tuple[str, bool]:
    """`name` with 1 worker on the device for each K: its clients a second, the best K and its ratio
    to K = 1, as a part of the row; and whether every K's run completed."""
    measured: dict[int, dict] = {}
    parts, failed = [], False
    for k in ks:
        try:
            ran, run_dir = c.emulator(
                f"bundles-{name.lower()}-{k}", [*overrides, f"device={c.device}", "workers=1", f"train.bundle={k}"]
            )
            rate, arrived, selected = clients_per_s(steady_rounds(run_dir))
        except Failed as e:
            parts.append(f"K={k} failed ({e})")
            failed = True
            continue
        measured[k] = dict(clients_per_s=rate, arrived=arrived, selected=selected, wall_s=ran.wall, util=ran.util)
        short = f" ({arrived} of {selected} arrived)" if arrived < selected else ""
        parts.append(f"K={k} {rate:.0f}{short}")
    c.numbers.setdefault("bundles", {})[name] = {"overrides": overrides, "k": measured}
    text = f"{name} {', '.join(parts)}"
    if measured:
        best = max(measured, key=lambda k: measured[k]["clients_per_s"])
        base = measured.get(1, {}).get("clients_per_s")
        ratio = measured[best]["clients_per_s"] / base if base else None
        c.numbers["bundles"][name] |= {"best": best, "ratio_to_1": ratio}
        text += f": best K={best}, " + (f"{ratio:.2f}x K=1" if ratio is not None else "no ratio to K=1")
    return text, not failed


def bundles_line(c: Check) -> str:
    """W2 and W1 with 1 worker on the device and each of their K (BUNDLES): clients trained a second."""
    parts, ok = [], True
    for name, (overrides, ks) in (BUNDLES_SMALL if c.small else BUNDLES).items():
        text, completed = bundle_rates(c, name, overrides, ks)
        parts.append(text)
        ok &= completed
    text = f"clients trained a second, 1 worker on {c.device}, rounds after the first: " + "; ".join(parts)
    if not ok:
        raise Failed(text)
    return text


def reproduce_line(c: Check) -> str:
    """As many rounds of each of the 7 runs as fit, from speed_table2's 1-worker time a round (its
    start-up included, which overestimates a round): their local steps one after another, halved for
    the REPRODUCE_JOBS runs at once on the one GPU."""
    timed = c.numbers.get("speed_table2", {}).get("emulator", {}).get(1)
    rounds_timed = 2 if c.small else 20
    step_round = (timed[0] if timed else 60.0) / rounds_timed  # a round of tau = 1
    rounds = max(1, min(158, int((c.left() - 30) / (step_round * TABLE2_STEPS / 2))))
    out = c.runs / "reproduce"
    argv = [sys.executable, "-m", "bench.reproduce", "ali_dpfl_table2", "--seeds", "0", "--jobs", str(REPRODUCE_JOBS)]
    ran = c.run("reproduce", [*argv, "--rounds", str(rounds), "--out", str(out)])
    report = out / "ali_dpfl_table2.md"
    if report.is_file():
        (c.out / "ali_dpfl_table2.md").write_text(report.read_text())
    c.numbers["reproduce"] = {"rounds": rounds, "wall_s": ran.wall, "rc": ran.rc}
    done = sum(1 for m in out.rglob("run.json") if json.loads(m.read_text()).get("status") == "complete")
    c.numbers["reproduce"]["complete"] = done
    if ran.rc == -9 and done:
        raise Partial(
            f"--rounds {rounds} (of 158): {done} of {TABLE2_RUNS} runs complete in {ran.wall / 60:.1f} min, "
            f"when the budget ended; on 2 CPU cores: {CPU_TABLE2}"
        )
    if ran.rc != 0:
        raise Failed(f"--rounds {rounds}: exit {ran.rc} after {ran.wall:.0f} s, {done} of {TABLE2_RUNS} runs complete")
    return (
        f"--seeds 0 --rounds {rounds} (of 158) --jobs {REPRODUCE_JOBS}: {ran.wall / 60:.1f} min "
        f"(ali_dpfl_table2.md); on 2 CPU cores: {CPU_TABLE2}"
    )


@dataclass
class Line:
    key: str
    title: str
    estimate_s: float  # on an H100: an estimate until this check has timed it there (results.json)
    run: Callable[[Check], str]


LINES = [
    Line("env", "torch, GPU, CUDA context", 20, env_line),
    Line("tests", "GPU tests", 60, tests_line),
    Line("dropout", "dropout.yaml on the GPU", 30, dropout_line),
    Line("determinism", "same seed, same tables", 40, determinism_line),
    Line("cpu_vs_gpu", "W1: CPU against GPU", 45, cpu_vs_gpu_line),
    Line("speed_w1", "W1 speed against a floor", 70, speed_w1_line),
    Line("speed_table2", "Table II setting speed", 70, speed_table2_line),
    Line("windows", "conv per-sample ways", 20, windows_line),
    Line("bundles", "clients a second against K", 60, bundles_line),
    Line("reproduce", "ali_dpfl_table2, seed 0", 60, reproduce_line),
]


@contextlib.contextmanager
def fashion_mnist(data: Path) -> Iterator[str]:
    """Where FashionMNIST is found. Where it is found nowhere (a lent machine), `data` is linked as its
    standard location, which every run, sweep and reproduction searches, until the block ends. Not into
    the dataset cache: that holds the official .gz files only (md5-verified), and a copy of the
    dataset recompressed by its package, as /usr/share/datasets' is, is not those."""
    from nodes.data.catalog import FashionMNIST
    from nodes.data.idx import IDX_FILES

    cfg = load(None, [FMNIST, "data.download=false"]).data
    try:
        found = str(FashionMNIST(cfg).find_files()["train_images"].parent)
    except Exception as e:  # not found, or a cached copy that fails its checksum
        found, missing = "", f"FashionMNIST: {e}"[:300]
    if found:
        yield found
        return
    standard = FashionMNIST.standard_dirs()[0]
    if not all((data / f"{name}.gz").is_file() for name in IDX_FILES.values()):
        yield f"{missing}; nor in --data {data}: its lines will fail"
        return
    try:
        standard.parent.mkdir(parents=True, exist_ok=True)
        standard.symlink_to(data.resolve(), target_is_directory=True)
    except OSError as e:
        yield f"{missing}; {data} could not be linked as {standard} ({e.strerror}): its lines will fail"
        return
    try:
        yield f"{data}, linked as {standard} while the check ran"
    finally:
        standard.unlink()


def table(results: list[dict]) -> str:
    lines = ["| line | result | s | |", "|---|---|---|---|"]
    for r in results:
        text = r["result"].replace("|", "/")
        lines.append(f"| {r['title']} | {text} | {r['seconds']:.0f} | {r['status']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.gpu_check", description="The GPU check, one row a line (docs/gpu.md)."
    )
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run on a machine without a GPU")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="seconds for every line together")
    ap.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu_check", help="where the table and logs go")
    ap.add_argument("--runs", default="", help="where the runs go (default: a temporary directory)")
    ap.add_argument("--data", default=".data/fashion-mnist", help="FashionMNIST's four .gz files, if not installed")
    ap.add_argument("--only", default="", help=f"these lines only, comma-separated: {','.join(x.key for x in LINES)}")
    ap.add_argument("--small", action="store_true", help="small sizes: a dry run of every line (--device cpu)")
    args = ap.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp, fashion_mnist(Path(args.data)) as found:
        args.runs = args.runs or tmp
        c = Check(args)
        c.numbers["data"] = {"fashion_mnist": found}
        chosen = set(filter(None, args.only.split(","))) or {x.key for x in LINES}
        results = []
        for line in (x for x in LINES if x.key in chosen):
            left, start = c.left(), time.perf_counter()
            if left < line.estimate_s:
                status, result = (
                    "skipped",
                    f"{left:.0f} s of the {args.budget_s:.0f} s budget left, needs ~{line.estimate_s:.0f} s",
                )
            else:
                try:
                    status, result = "ok", line.run(c)
                except Failed as e:
                    status, result = "FAILED", str(e)
                except Partial as e:
                    status, result = "partial", str(e)
                except Exception as e:  # the check goes on to its next line: say what broke, in one line
                    status, result = "FAILED", f"{type(e).__name__}: {e}"
            results.append(
                dict(key=line.key, title=line.title, status=status, result=result, seconds=time.perf_counter() - start)
            )
            print(f"{line.key}: {status}: {result}", flush=True)
        c.log.close()
    skipped = [str(r["key"]) for r in results if r["status"] == "skipped"]
    header = f"# GPU check ({args.device}{', small' if args.small else ''}): {time.strftime('%Y-%m-%d %H:%M %Z')}\n\n"
    footer = f"\n\nSkipped for time: {', '.join(skipped)}.\n" if skipped else "\n"
    text = header + table(results) + footer
    (Path(args.out) / "gpu_check.md").write_text(text)
    (Path(args.out) / "results.json").write_text(
        json.dumps({"lines": results, "numbers": c.numbers}, indent=1, default=str)
    )
    if c.util_rows:
        (Path(args.out) / "utilisation.csv").write_text("run,sample,utilization_gpu\n" + "\n".join(c.util_rows) + "\n")
    print("\n" + text)
    return 1 if any(r["status"] == "FAILED" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

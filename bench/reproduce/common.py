"""What every reproduction target shares: run a sweep through `python -m emulator --multirun`,
read its runs back, and format paper-vs-ours Markdown tables."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analysis.load import Run, discover
from analysis.summary import run_numbers
from emulator.cli.hydra_app import quoted
from emulator.cli.reuse import NO_RUN, prepare
from emulator.config import load


@dataclass
class Options:
    seeds: list[int]
    jobs: int
    out: Path
    rounds_cap: int = 0  # > 0: a smoke run, every run capped at this many rounds
    run: bool = True  # False: report on the runs already complete, start none


def sweep(
    opts: Options, name: str, scenario: str, grid: dict[str, list] | None = None, overrides: Sequence[str] = ()
) -> Path:
    """Run scenario over `grid` (key -> values) x opts.seeds as one hive-partitioned sweep
    `<out>/<name>`; runs already complete are skipped. Returns the sweep directory."""
    if not opts.run:
        return opts.out / name
    args = [
        sys.executable,
        "-m",
        "emulator",
        "--multirun",
        f"scenario={scenario}",
        *overrides,
        *(f"{k}={','.join(map(str, v))}" for k, v in (grid or {}).items()),
        f"seed={','.join(map(str, opts.seeds))}",
        "hydra/launcher=joblib",
        f"hydra.launcher.n_jobs={opts.jobs}",
        f"output.dir={opts.out}",
        f"output.name={name}",
        "output.progress=false",
    ]
    if opts.rounds_cap:
        args.append(f"budget.rounds={opts.rounds_cap}")
    subprocess.run(args, check=True)
    return opts.out / name


@dataclass
class Point:
    """One run of a reproduction: `<out>/<sweep>/<k=v>/.../seed=S/`, the layout sweeps write."""

    sweep: str
    scenario: str
    seed: int
    hive: dict[str, str] = field(default_factory=dict)  # the run's own keys (also passed as overrides)
    overrides: list[str] = field(default_factory=list)  # more overrides, not part of the path

    def dir(self, out: Path) -> Path:
        return out.joinpath(self.sweep, *(f"{k}={v}" for k, v in self.hive.items()), f"seed={self.seed}")


def run_points(opts: Options, points: list[Point]) -> None:
    """Run the points not yet complete, `opts.jobs` at a time, in the order given (so a list
    ordered seed by seed fills whole seeds first); a run interrupted after a completed round is
    resumed from its checkpoint. A run that fails is reported, not fatal."""
    if not opts.run:
        return

    def one(p: Point) -> None:
        d = p.dir(opts.out)
        overrides = [
            f"seed={p.seed}",
            *(f"{k}={v}" for k, v in p.hive.items()),
            *p.overrides,
            f"output.dir={quoted(str(d.parent))}",  # quoted: a hive directory holds '='
            f"output.name={quoted(d.name)}",
            "output.progress=false",
            *([f"budget.rounds={opts.rounds_cap}"] if opts.rounds_cap else []),
        ]
        action, why = prepare(d, load(p.scenario, overrides), opts.out)
        if action == "reuse":
            return
        if action == "resume":
            args = [sys.executable, "-m", "emulator", "resume", str(d)]
        else:
            if why != NO_RUN:
                print(f"starting over: {d} ({why})", file=sys.stderr, flush=True)
            d.parent.mkdir(parents=True, exist_ok=True)
            args = [sys.executable, "-m", "emulator", f"scenario={p.scenario}", *overrides]
        with open(d.parent / f"{d.name}.log", "a") as log:
            rc = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT).returncode
        print(f"{'done' if rc == 0 else f'FAILED (exit {rc})'}: {d}", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        list(pool.map(one, points))


def runs(sweep_dir: Path) -> list[Run]:
    return discover([str(sweep_dir)]).runs


def column(run: Run, table: str, name: str) -> list:
    return run.table(table).column(name).to_pylist()


def best_accuracy(run: Run) -> float:
    """The highest test accuracy over the run's evaluated rounds (what ALI-DPFL's result_utils reports)."""
    return max(a for a in column(run, "rounds", "test_accuracy") if not math.isnan(a))


def final_accuracy(run: Run) -> float:
    """The last evaluated round's (the run's last: every run ends with an evaluation)."""
    return [a for a in column(run, "rounds", "test_accuracy") if not math.isnan(a)][-1]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def pct(mean: float, std: float | None = None) -> str:
    """A fraction as percent with two decimals, `mean ± std` when std is given."""
    return f"{100 * mean:.2f}" + ("" if std is None else f" ± {100 * std:.2f}")


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --- helpers for the Fu / Talaei / Wei targets (appended) ---------------------------------


def group(rs: list[Run], *keys: str) -> dict[tuple[str, ...], list[Run]]:
    """Runs grouped by the values of hive `keys` (as written in their paths), seeds together."""
    out: dict[tuple[str, ...], list[Run]] = {}
    for r in rs:
        out.setdefault(tuple(r.keys.get(k, "") for k in keys), []).append(r)
    return out


def final(run: Run, name: str):
    """The last round's value of a `rounds` column."""
    return column(run, "rounds", name)[-1]


def fmt(mean: float, std: float | None = None, digits: int = 3) -> str:
    """`mean ± std` with `digits` significant digits (std to two)."""
    return f"{mean:.{digits}g}" + ("" if std is None else f" ± {std:.2g}")


def accuracy_curve(run: Run, grid_s: np.ndarray) -> np.ndarray:
    """Test accuracy known at each of the virtual times `grid_s`: the last evaluated round (or version)
    that ended by then (0 before the first)."""
    acc = np.array(column(run, "rounds", "test_accuracy"), dtype=float)
    ends = np.array(column(run, "rounds", "t_end"), dtype=float)[~np.isnan(acc)]
    acc = acc[~np.isnan(acc)]
    k = np.searchsorted(ends, grid_s, side="right") - 1
    return np.where(k >= 0, acc[np.maximum(k, 0)], 0.0)


def time_to(values: np.ndarray, target: float, grid_s: np.ndarray) -> float:
    """The first of `grid_s` at which `values` reach `target` (inf: never)."""
    hit = np.flatnonzero(values >= target)
    return float(grid_s[hit[0]]) if len(hit) else math.inf


def seed_time(run: Run, target: float) -> float:
    """One seed's virtual time to the target: the end of its first round at or above it (analysis's rule)."""
    t = run_numbers(run, target).time_to_target_s
    return math.inf if math.isnan(t) else t


def seconds(t: float) -> str:
    return "not reached" if math.isinf(t) else f"{t:.1f} s"

"""Summary table: one row per configuration, each number a mean (± sample std) over its seeds.

Per run: final accuracy = test accuracy of the last evaluated round read; best = the highest
over the evaluated rounds (with eval.every > 1 the rounds between have NaN test accuracy);
time/rounds to target = virtual end time and 1-based count of the first evaluated round at or
above the target accuracy (runs that never reach it are counted in `reached`, not in the
means); bytes and updates are totals over the run; final ε = max_epsilon of the last round,
in the column of the run's privacy kind: sample-level (DP-SGD) or client-level (output noise on
the upload), whose ε protect different things and are never compared in one column.
Default target: 90 % of the best configuration's mean final accuracy.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from analysis.load import Dataset, Run
from emulator.output.summary import privacy_kind

PRIVACY_KINDS = ("sample-level", "client-level")

TARGET_SHARE = 0.9


@dataclass
class RunNumbers:
    final_accuracy: float
    best_accuracy: float
    rounds_to_target: float  # nan when the target was never reached
    time_to_target_s: float
    bytes_total: float
    delivered: float
    lost: float
    late: float
    failed: float
    final_max_epsilon: float
    privacy_kind: str


@dataclass
class ConfigRow:
    config: str
    seeds: int
    final_accuracy_mean: float
    final_accuracy_std: float
    best_accuracy_mean: float
    best_accuracy_std: float
    target_accuracy: float
    reached_target: int
    rounds_to_target_mean: float
    time_to_target_s_mean: float
    bytes_total_mean: float
    delivered_mean: float
    lost_mean: float
    late_mean: float
    failed_mean: float
    sample_level_max_epsilon_mean: float  # nan for a configuration of the other kind
    client_level_max_epsilon_mean: float


def column(run: Run, table: str, name: str) -> np.ndarray:
    return run.table(table)[name].to_numpy(zero_copy_only=False).astype(float)


def evaluated_accuracy(run: Run) -> np.ndarray:
    """The test accuracy of the rounds that were evaluated, in round order (eval.every > 1 leaves NaN between)."""
    acc = column(run, "rounds", "test_accuracy")
    return acc[~np.isnan(acc)]


def run_numbers(run: Run, target: float) -> RunNumbers:
    acc, evaluated = column(run, "rounds", "test_accuracy"), evaluated_accuracy(run)
    hits = np.flatnonzero(acc >= target)  # a NaN round never reaches it
    first = int(hits[0]) if hits.size else None
    return RunNumbers(
        final_accuracy=float(evaluated[-1]) if evaluated.size else math.nan,
        best_accuracy=float(evaluated.max()) if evaluated.size else math.nan,
        rounds_to_target=math.nan if first is None else float(column(run, "rounds", "round")[first] + 1),
        time_to_target_s=math.nan if first is None else float(column(run, "rounds", "t_end")[first]),
        bytes_total=float(column(run, "rounds", "bytes_total").sum()),
        delivered=float(column(run, "rounds", "arrived").sum()),
        lost=float(column(run, "rounds", "lost").sum()),
        late=float(column(run, "rounds", "late").sum()),
        failed=float(column(run, "rounds", "failed").sum()),
        final_max_epsilon=float(column(run, "rounds", "max_epsilon")[-1]),
        privacy_kind=privacy_kind(run.manifest),
    )


def mean(values: list[float]) -> float:
    v = [x for x in values if not math.isnan(x)]
    return float(np.mean(v)) if v else math.nan


def std(values: list[float]) -> float:
    v = [x for x in values if not math.isnan(x)]
    return float(np.std(v, ddof=1)) if len(v) > 1 else math.nan


def analysed_runs(ds: Dataset) -> dict[str, list[Run]]:
    """Configurations and their runs that have at least one round to summarise."""
    groups = {}
    for config, runs in ds.configs.items():
        with_rounds = []
        for r in runs:
            if r.table("rounds").num_rows == 0:
                ds.warn(f"{r.dir}: no rounds; left out of the summary")
                continue
            if r.status != "complete":
                ds.warn(f"{r.dir}: status {r.status!r}; summarised with the rounds it has")
            with_rounds.append(r)
        if with_rounds:
            groups[config] = with_rounds
    return groups


def default_target(groups: dict[str, list[Run]]) -> float:
    finals = [mean([run_numbers(r, math.nan).final_accuracy for r in runs]) for runs in groups.values()]
    return TARGET_SHARE * max(finals)


def summarise(groups: dict[str, list[Run]], target: float) -> list[ConfigRow]:
    rows = []
    for config, runs in groups.items():
        n = [run_numbers(r, target) for r in runs]
        col = {f.name: [getattr(x, f.name) for x in n] for f in fields(RunNumbers)}
        epsilon = {kind: mean([x.final_max_epsilon for x in n if x.privacy_kind == kind]) for kind in PRIVACY_KINDS}
        rows.append(
            ConfigRow(
                config=config,
                seeds=len(runs),
                final_accuracy_mean=mean(col["final_accuracy"]),
                final_accuracy_std=std(col["final_accuracy"]),
                best_accuracy_mean=mean(col["best_accuracy"]),
                best_accuracy_std=std(col["best_accuracy"]),
                target_accuracy=target,
                reached_target=sum(not math.isnan(x) for x in col["rounds_to_target"]),
                rounds_to_target_mean=mean(col["rounds_to_target"]),
                time_to_target_s_mean=mean(col["time_to_target_s"]),
                bytes_total_mean=mean(col["bytes_total"]),
                delivered_mean=mean(col["delivered"]),
                lost_mean=mean(col["lost"]),
                late_mean=mean(col["late"]),
                failed_mean=mean(col["failed"]),
                sample_level_max_epsilon_mean=epsilon["sample-level"],
                client_level_max_epsilon_mean=epsilon["client-level"],
            )
        )
    return rows


def write_csv(rows: list[ConfigRow], path: Path) -> Path:
    names = [f.name for f in fields(ConfigRow)]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        for row in rows:
            w.writerow(["" if isinstance(v, float) and math.isnan(v) else v for v in (getattr(row, n) for n in names)])
    return path


def _pm(m: float, s: float) -> str:
    return "—" if math.isnan(m) else f"{m:.3f}" if math.isnan(s) else f"{m:.3f} ± {s:.3f}"


def _num(x: float, fmt: str) -> str:
    return "—" if math.isnan(x) else format(x, fmt)


def markdown(rows: list[ConfigRow]) -> str:
    head = [
        "configuration",
        "seeds",
        "final accuracy",
        "best accuracy",
        "rounds to target",
        "virtual time to target (s)",
        "reached",
        "total MB",
        "delivered",
        "lost",
        "late",
        "failed",
        "final max ε, sample-level (DP-SGD)",
        "final max ε, client-level (output or aggregate noise)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for r in rows:
        cells = [
            r.config,
            str(r.seeds),
            _pm(r.final_accuracy_mean, r.final_accuracy_std),
            _pm(r.best_accuracy_mean, r.best_accuracy_std),
            _num(r.rounds_to_target_mean, ".1f"),
            _num(r.time_to_target_s_mean, ".2f"),
            f"{r.reached_target}/{r.seeds}",
            _num(r.bytes_total_mean / 1e6, ".3f"),
            _num(r.delivered_mean, ".1f"),
            _num(r.lost_mean, ".1f"),
            _num(r.late_mean, ".1f"),
            _num(r.failed_mean, ".1f"),
            _num(r.sample_level_max_epsilon_mean, ".3f"),
            _num(r.client_level_max_epsilon_mean, ".3f"),
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_markdown(rows: list[ConfigRow], target: float, target_source: str, path: Path) -> Path:
    path.write_text(
        f"Target accuracy {target:.4f} ({target_source}). Means over seeds ± sample std; "
        "'reached' counts the seeds that reached the target, and only those enter the "
        "time/rounds-to-target means. Updates are totals per run.\n\n" + markdown(rows)
    )
    return path

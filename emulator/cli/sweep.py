"""python -m emulator -m key=a,b other=x,y [hydra/launcher=joblib]: a sweep through Hydra's sweeper
and launcher, in one hive-partitioned directory.

Before anything runs, the sweep is expanded as Hydra's basic sweeper expands it (every key given a
comma list, range(), choice() or glob() is swept; the grid is their product) and every point's
scenario is loaded and validated. Hydra then launches every point with the configured launcher
(basic: one after another; joblib: in parallel on this machine; submitit: Slurm; ray: a Ray
cluster); a point is `run_point`, which runs `python -m emulator` in
`<output.dir>/<sweep name>/<swept key=value>/.../seed=S/` (run.json + tables + the run's console
output in emulator.log). A point whose complete run computed what the point asks for
(emulator.cli.reuse) is reused, an interrupted one that did is resumed from its checkpoint; any other
is run again, saying why, the earlier run (if any) moved to <sweep dir>/.replaced/<time>/.
sweep.json records every point and keeps the records of earlier invocations under "earlier".
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from hydra.types import RunMode

from emulator.cli import hydra_app
from emulator.cli.reuse import prepare, why_not_reused
from emulator.config import ConfigError, load, parse_override, split_args

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override
    from omegaconf import DictConfig

EMULATOR = [sys.executable, "-m", "emulator"]  # the command one point runs, with its overrides
SET_PER_RUN = ("output.dir", "output.name", "output.progress")  # the sweep decides these for every run
LOG_NAME = "emulator.log"
ERROR_TAIL_LINES = 20


@dataclass
class PointRecord:
    """What became of one point (a sweep.json entry). As a number, what an optimising sweeper
    (Optuna) maximises or minimises: the run's final test accuracy (NaN when it has none)."""

    path: str  # the run directory relative to the sweep directory: policy=p/seed=0
    overrides: dict[str, str]  # its swept key=value pairs
    status: str = "pending"  # pending | complete | failed | interrupted
    ran: bool = False
    returncode: int | None = None
    wall_s: float | None = None
    error: str = ""
    objective: float = field(default=math.nan, repr=False)

    def __float__(self) -> float:
        return self.objective


def hive_segment(key: str, value: str) -> str:
    return f"{key}={quote(value, safe='')}"


def _key_value(item: str) -> tuple[str, str]:
    """An override's key and its value as a path shows it: the value Hydra parsed (`tcp://h:1`, not
    its escaped `tcp\\://h\\:1`), booleans and null as YAML writes them."""
    o = parse_override(item)
    value = o.value()
    if isinstance(value, str):
        return o.key_or_group, value
    yaml_like = value is None or isinstance(value, bool)
    return o.key_or_group, json.dumps(value) if yaml_like else o.get_value_element_as_str()


def point_of(items: list[str], fixed: set[str], seed: int | None) -> PointRecord:
    """A job's point: its overrides whose keys are not `fixed` (the swept ones, in the order given),
    the seed last, swept or not (seeds added later join the same configuration)."""
    swept = [(k, v) for k, v in map(_key_value, items) if k not in fixed]
    seeds = [(k, v) for k, v in swept if k == "seed"] or ([("seed", str(seed))] if seed is not None else [])
    swept = [(k, v) for k, v in swept if k != "seed"] + seeds
    return PointRecord(path="/".join(hive_segment(k, v) for k, v in swept), overrides=dict(swept))


def _run_status(run_dir: Path) -> str:
    try:
        status: str = json.loads((run_dir / "run.json").read_text()).get("status", "unknown")
        return status
    except (OSError, ValueError, AttributeError):
        return "missing"


def _final_accuracy(run_dir: Path) -> float:
    from emulator.output.results import read_table

    try:
        accuracy = read_table(run_dir, "rounds").column("test_accuracy").to_pylist()
    except (OSError, ValueError, KeyError):
        return math.nan
    return float(next((a for a in reversed(accuracy) if a is not None), math.nan))


def run_point(_: DictConfig) -> PointRecord:
    """Hydra's task for one point of a sweep, wherever the launcher runs it: reuse the point's run
    or run it in its own process (a crash costs this point only)."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    items = list(hydra.overrides.task)
    kept = [i for i in items if _key_value(i)[0] not in SET_PER_RUN]  # the sweep sets these per run
    cfg = load(*split_args(kept))
    point = point_of(items, set(hydra.job.config.override_dirname.exclude_keys), cfg.seed)
    run_dir = Path(hydra.sweep.dir) / point.path
    action = prepare(run_dir, cfg, Path(hydra.sweep.dir))[0]  # why: sweep() printed it
    if action == "reuse":
        point.status, point.objective = "complete", _final_accuracy(run_dir)
        return point
    if action == "resume":  # an interrupted run of this very point: on from its checkpoint
        args = ["resume", str(run_dir)]
    else:
        run_dir.mkdir(parents=True)
        args = kept + [
            f"output.dir={hydra_app.quoted(str(run_dir.parent))}",
            f"output.name={hydra_app.quoted(run_dir.name)}",
            "output.progress=false",
        ]
    started = time.monotonic()
    with open(run_dir / LOG_NAME, "ab") as out:
        code = subprocess.run([*EMULATOR, *args], stdout=out, stderr=subprocess.STDOUT).returncode
    point.ran, point.returncode, point.wall_s = True, code, round(time.monotonic() - started, 3)
    status = _run_status(run_dir)
    if code == 0 and status == "complete":
        point.status, point.objective = "complete", _final_accuracy(run_dir)
    else:
        point.status = "interrupted" if code in (130, 143) else "failed"  # Ctrl-C, SIGTERM
        tail = (run_dir / LOG_NAME).read_text(errors="replace").splitlines()[-ERROR_TAIL_LINES:]
        point.error = "\n".join(tail) or f"exit status {code}, run.json status {status}"
    last = point.error.splitlines()[-1] if point.error else ""
    print(f"{point.status:<8} {point.path} ({point.wall_s:.1f} s){'  ' + last if last else ''}", flush=True)
    return point


class Record:
    """sweep.json: the sweep and what became of every point, written atomically; the document of
    each earlier invocation is kept under "earlier", oldest first."""

    def __init__(self, sweep_dir: Path, argv: list[str], base: list[str], swept: dict[str, list[str]]):
        self.path, self.runs = sweep_dir / "sweep.json", list[PointRecord]()
        self.head: dict[str, Any] = {
            "argv": argv,
            "base_overrides": base,
            "swept": swept,
            "started": datetime.now(UTC).isoformat(),
        }
        self.earlier: list[dict[str, Any]] = []
        try:
            previous = json.loads(self.path.read_text())
            self.earlier = [*previous.pop("earlier", []), previous]
        except (OSError, ValueError, AttributeError):
            pass  # none yet (or unreadable: it is rewritten whole below)

    def write(self) -> None:
        doc = {
            **self.head,
            "updated": datetime.now(UTC).isoformat(),
            "runs": [{k: v for k, v in asdict(r).items() if k != "objective"} for r in self.runs],
            "earlier": self.earlier,
        }
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2))
        os.replace(tmp, self.path)


def expand(parsed: list[Override]) -> tuple[list[list[str]], list[str], dict[str, list[str]]]:
    """The points' override lists as Hydra's basic sweeper makes them, the overrides every point
    shares, and the swept keys with their values (in the order given)."""
    task = [o for o in parsed if not o.is_hydra_override()]
    for o in task:
        key = o.key_or_group
        if key == "jobs":
            raise ConfigError("jobs: parallel runs are the launcher's: hydra/launcher=joblib hydra.launcher.n_jobs=N")
        if key in SET_PER_RUN and o.is_sweep_override():
            raise ConfigError(f"{key}: cannot be swept (the sweep sets it for every run)")
    # an interval() has no values to list: an optimising sweeper (Optuna) draws them
    listed = [o for o in task if not o.is_sweep_override() or o.is_discrete_sweep()]
    points = hydra_app.grid(listed)
    swept = {
        o.key_or_group: list(o.sweep_string_iterator())
        if o.is_discrete_sweep()
        else [(o.input_line or "=").split("=", 1)[1]]
        for o in task
        if o.is_sweep_override()
    }
    base = [o.input_line or "" for o in task if not o.is_sweep_override()]
    return points, base, swept


def _runs_under(sweep_dir: Path, since: float) -> list[PointRecord]:
    """A record of every run in the sweep directory (an optimising sweeper returns none of its own)."""
    records = []
    for manifest in sorted(sweep_dir.rglob("run.json")):
        path = manifest.parent.relative_to(sweep_dir)
        swept = (part.partition("=") for part in path.parts)
        record = PointRecord(path=str(path), overrides={k: unquote(v) for k, _, v in swept})
        record.status, record.ran = _run_status(manifest.parent), manifest.stat().st_mtime >= since
        records.append(record)
    return records


def sweep(parsed: list[Override], argv: list[str]) -> int:
    """Validate every point, decide the sweep directory, then let Hydra sweep and launch."""
    points, base, swept = expand(parsed)
    fixed = {_key_value(b)[0] for b in base}
    records, outputs = [], []
    for items in points:
        try:
            cfg = load(*split_args(items))
        except ConfigError as e:
            raise ConfigError(f"grid point {point_of(items, fixed, None).path}: {e}") from None
        records.append((point_of(items, fixed, cfg.seed), cfg))
        outputs.append(cfg.output)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    sweep_dir = (Path(outputs[0].dir) / (outputs[0].name or f"sweep-{stamp}")).resolve()
    overrides = [o.input_line or "" for o in parsed] + [
        f"hydra.sweep.dir={hydra_app.quoted(str(sweep_dir))}",
        f"hydra.job.config.override_dirname.exclude_keys=[{','.join(sorted(fixed | set(SET_PER_RUN)))}]",
    ]
    scenario = split_args(base)[0]  # the one every point reads, unless it is swept
    with hydra_app.instance(scenario=scenario) as hydra:
        hydra.compose_config(hydra_app.APP, overrides, run_mode=RunMode.MULTIRUN)  # Hydra's own keys, checked
    sweep_dir.mkdir(parents=True, exist_ok=True)
    record = Record(sweep_dir, argv, base, swept)
    stale = []
    # an optimising sweeper (Optuna) chooses its own points: the grid only checked the listed values
    optimising = any(o.key_or_group == "hydra/sweeper" and o.value() != "basic" for o in parsed)
    for point, cfg in [] if optimising else records:
        reason = why_not_reused(sweep_dir / point.path, cfg)
        if not reason:
            point.status = "complete"
        elif _run_status(sweep_dir / point.path) == "complete":
            stale.append(f"{point.path}: {reason}")
        record.runs.append(point)
    record.write()
    done = sum(p.status == "complete" for p in record.runs)
    print(
        f"sweep {sweep_dir}: {len(record.runs) or 'its sweeper chooses the'} runs, {done} already complete", flush=True
    )
    for line in stale:
        print(f"re-running {line}", flush=True)
    started = time.time()
    try:
        with hydra_app.instance(scenario=scenario) as hydra:
            returns = hydra.multirun(hydra_app.APP, run_point, overrides)
    except KeyboardInterrupt:
        for p in record.runs:
            if p.status != "complete":
                p.status = "interrupted" if _run_status(sweep_dir / p.path) != "complete" else "complete"
        record.write()
        print(f"interrupted; re-run the same command to finish {sweep_dir}", file=sys.stderr)
        return 130
    # a grid sweep returns its points; an optimising one (Optuna) chose its own: they are on disk
    record.runs = [r.return_value for batch in returns for r in batch] if returns else _runs_under(sweep_dir, started)
    record.write()
    failed = [p for p in record.runs if p.status != "complete"]
    ran = sum(p.ran for p in record.runs)
    print(
        f"sweep {sweep_dir}: {ran} ran, {len(record.runs) - ran} reused, {len(failed)} failed"
        + (f" ({', '.join(p.path for p in failed)}; see sweep.json)" if failed else "")
    )
    return 1 if failed else 0

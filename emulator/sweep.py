"""python -m emulator --multirun key=a,b other=x,y [jobs=N]: a grid of runs in one hive-partitioned directory.

Every key given a comma list is swept; the grid is their product, in the order given, and
every other override applies to all points. Point `policy=p, seed=0` lands in
`<output.dir>/<sweep name>/policy=p/seed=0/` (run.json + tables), so the sweep reads as
one dataset. Every point's config is loaded and validated before anything runs. Each run
is its own `python -m emulator` subprocess (at most `jobs` at a time); a failed run is
recorded in `sweep.json` with the tail of its log and does not stop the others. Running
the same sweep again reuses the points whose run is complete and computed what the point now
asks for (emulator.reuse: its resolved scenario), and re-runs the rest, saying why; sweep.json
keeps the records of earlier invocations under "earlier".
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from emulator.config import ConfigError, load, split_args
from emulator.reuse import why_not_reused
from nodes.schema import Scenario

EMULATOR = [sys.executable, "-m", "emulator"]  # the command one grid point runs, with its overrides
SET_PER_RUN = ("output.dir", "output.name", "output.progress")  # the sweep decides these for every run
LOG_NAME = "emulator.log"
ERROR_TAIL_LINES = 20


@dataclass
class Point:
    """One grid point: its swept key=value pairs and the run directory they name."""

    swept: list[tuple[str, str]]
    cfg: Scenario | None = None  # its resolved scenario, once loaded
    dir: Path = Path()  # <sweep dir>/<label>, set once the sweep directory is known
    status: str = "pending"  # pending | complete | failed | interrupted
    ran: bool = False
    returncode: int | None = None
    wall_s: float | None = None
    error: str = ""

    @property
    def label(self) -> str:
        """The run directory relative to the sweep directory: policy=p/seed=0."""
        return "/".join(hive_segment(k, v) for k, v in self.swept)


@dataclass
class Sweep:
    base: list[str]  # overrides applied to every point (scenario=... included)
    axes: list[tuple[str, list[str]]]  # swept keys in the order given, with their values
    jobs: int = 1
    dir: Path = Path()
    points: list[Point] = field(default_factory=list)


def hive_segment(key: str, value: str) -> str:
    return f"{key}={quote(value, safe='')}"


def split_values(text: str) -> list[str]:
    """Split a Hydra-style comma list, keeping commas inside [], {}, () and quotes: 'a,[1,2]' -> ['a', '[1,2]']."""
    values, depth, quote_char, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote_char:
            quote_char = "" if ch == quote_char else quote_char
        elif ch in "'\"":
            quote_char = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(text[start:i])
            start = i + 1
    values.append(text[start:])
    return values


def parse(argv: list[str]) -> Sweep:
    base: list[str] = []
    axes: list[tuple[str, list[str]]] = []
    jobs = 1
    for arg in argv:
        if "=" not in arg:
            raise ConfigError(f"{arg}: expected key=value or key=a,b,c")
        key, text = arg.split("=", 1)
        if key == "jobs":
            if not text.isdigit() or int(text) < 1:
                raise ConfigError(f"jobs = {text!r}: expected an integer >= 1 (runs in parallel)")
            jobs = int(text)
            continue
        values = split_values(text)
        if len(values) == 1:
            base.append(arg)
            continue
        if key in SET_PER_RUN:
            raise ConfigError(f"{key}: cannot be swept (the sweep sets it for every run)")
        if any(k == key for k, _ in axes):
            raise ConfigError(f"{key}: swept twice")
        if any(v == "" for v in values):
            raise ConfigError(f"{key} = {text!r}: empty value in the comma list")
        axes.append((key, values))
    return Sweep(base=base, axes=axes, jobs=jobs)


def run_args(sweep: Sweep, point: Point) -> list[str]:
    """The `python -m emulator` arguments of one point."""
    kept = [a for a in sweep.base if a.split("=", 1)[0] not in SET_PER_RUN]
    return (
        kept
        + [f"{k}={v}" for k, v in point.swept]
        + [f"output.dir={point.dir.parent}", f"output.name={point.dir.name}", "output.progress=false"]
    )


def expand(sweep: Sweep) -> None:
    """Load every grid point's config (ConfigError names the point and the key), then fill sweep.dir and points."""
    keys = [k for k, _ in sweep.axes]
    outputs = []  # output.dir and output.name cannot be swept: every point agrees, the first one is used
    for combo in itertools.product(*(values for _, values in sweep.axes)):
        point = Point(swept=list(zip(keys, combo)))
        try:
            cfg = load(*split_args(sweep.base + [f"{k}={v}" for k, v in point.swept]))
        except ConfigError as e:
            raise ConfigError(f"grid point {point.label}: {e}") from None
        outputs.append(cfg.output)
        point.cfg = cfg
        if "seed" not in keys:  # every run of a sweep sits in .../seed=S/, whether seeds are swept or not
            point.swept.append(("seed", str(cfg.seed)))
        sweep.points.append(point)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    sweep.dir = Path(outputs[0].dir) / (outputs[0].name or f"sweep-{stamp}")
    for point in sweep.points:
        point.dir = sweep.dir / point.label


def run_status(run_dir: Path) -> str:
    try:
        status: str = json.loads((run_dir / "run.json").read_text()).get("status", "unknown")
        return status
    except (OSError, ValueError):
        return "missing"


def run_point(sweep: Sweep, point: Point) -> Point:
    """Run one point in its own process; a previous incomplete attempt is removed first."""
    if point.dir.exists():
        shutil.rmtree(point.dir)
    point.dir.mkdir(parents=True)
    log = point.dir / LOG_NAME
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.run([*EMULATOR, *run_args(sweep, point)], stdout=out, stderr=subprocess.STDOUT)
    point.ran, point.returncode = True, proc.returncode
    point.wall_s = round(time.monotonic() - started, 3)
    status = run_status(point.dir)
    if proc.returncode == 0 and status == "complete":
        point.status = "complete"
    else:
        point.status = "interrupted" if proc.returncode in (130, 143) else "failed"  # Ctrl-C, SIGTERM
        tail = log.read_text(errors="replace").splitlines()[-ERROR_TAIL_LINES:]
        point.error = "\n".join(tail) or f"exit status {proc.returncode}, run.json status {status}"
    return point


class Record:
    """sweep.json: the grid and what became of every point, rewritten (atomically) as points finish."""

    def __init__(self, sweep: Sweep, argv: list[str]):
        self.sweep, self.argv = sweep, argv
        self.started = datetime.now(UTC).isoformat()
        self.earlier: list[dict[str, object]] = []  # the sweep.json of each earlier invocation, oldest first
        try:
            previous = json.loads((sweep.dir / "sweep.json").read_text())
            self.earlier = [*previous.pop("earlier", []), previous]
        except (OSError, ValueError, AttributeError):
            pass  # none yet (or unreadable: it is rewritten whole below)

    def write(self) -> None:
        s = self.sweep
        doc = {
            "argv": self.argv,
            "base_overrides": s.base,
            "swept": dict(s.axes),
            "jobs": s.jobs,
            "started": self.started,
            "updated": datetime.now(UTC).isoformat(),
            "runs": [
                {
                    "path": p.label,
                    "overrides": dict(p.swept),
                    "status": p.status,
                    "ran": p.ran,
                    "returncode": p.returncode,
                    "wall_s": p.wall_s,
                    "error": p.error,
                }
                for p in s.points
            ],
            "earlier": self.earlier,
        }
        tmp = s.dir / "sweep.json.tmp"
        tmp.write_text(json.dumps(doc, indent=2))
        os.replace(tmp, s.dir / "sweep.json")


def execute(sweep: Sweep, todo: list[Point], record: Record) -> None:
    done = 0
    with ThreadPoolExecutor(max_workers=sweep.jobs) as pool:
        futures = [pool.submit(run_point, sweep, p) for p in todo]
        try:
            for future in as_completed(futures):
                p = future.result()
                done += 1
                record.write()
                last = p.error.splitlines()[-1] if p.error else ""
                print(
                    f"[{done}/{len(todo)}] {p.status:<8} {p.label} ({p.wall_s:.1f} s){'  ' + last if last else ''}",
                    flush=True,
                )
        except KeyboardInterrupt:
            for f in futures:
                f.cancel()
            raise


def main(argv: list[str]) -> int:
    try:
        sweep = parse(argv)
        expand(sweep)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sweep.dir.mkdir(parents=True, exist_ok=True)
    stale = []
    for p in sweep.points:
        assert p.cfg is not None  # expand loaded it
        reason = why_not_reused(p.dir, p.cfg)
        if not reason:
            p.status = "complete"
        elif run_status(p.dir) == "complete":
            stale.append(f"{p.label}: {reason}")
    todo = [p for p in sweep.points if p.status == "pending"]
    record = Record(sweep, argv)
    record.write()
    print(
        f"sweep {sweep.dir}: {len(sweep.points)} runs, {len(sweep.points) - len(todo)} already complete, "
        f"jobs={sweep.jobs}",
        flush=True,
    )
    for line in stale:
        print(f"re-running {line}", flush=True)
    try:
        execute(sweep, todo, record)
    except KeyboardInterrupt:
        for p in sweep.points:
            if p.status == "pending":
                p.status = "interrupted"
        record.write()
        print(f"interrupted; re-run the same command to finish {sweep.dir}", file=sys.stderr)
        return 130
    failed = [p for p in sweep.points if p.status != "complete"]
    ran = sum(p.ran for p in sweep.points)
    print(
        f"sweep {sweep.dir}: {ran} ran, {len(sweep.points) - ran} reused, {len(failed)} failed"
        + (f" ({', '.join(p.label for p in failed)}; see sweep.json)" if failed else "")
    )
    return 1 if failed else 0

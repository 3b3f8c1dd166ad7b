"""Find the runs under the PATHs given and read their Parquet tables as one dataset.

A run is a directory holding run.json. Its configuration comes from the hive segments
of its path (`policy=p/links.dropout.p=0.1/seed=0`, as sweeps write them): every
`key=value` ancestor except seed. The first ancestor without `=` is the run's root (the
sweep, or the run itself). Tables are read one per-round file at a time, so a missing or
corrupt file costs a warning naming it and that round, not the analysis.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from analysis.labels import label_configs
from emulator.output.results import SCHEMAS, STATIC, read_static

TABLES = tuple(SCHEMAS)  # rounds, client_rounds, events
# one file per run (join on client): the clients as drawn for it; the privacy each charged client spent
STATIC_TABLES = tuple(STATIC)
ROUND_FILE = re.compile(r"round-(\d+)\.parquet$")


class BadPath(ValueError):
    """A PATH that holds no run; the message is one line naming it."""


class Warnings:
    """Problems found while reading: printed to stderr as they happen, listed again in the report."""

    def __init__(self):
        self.messages: list[str] = []

    def __call__(self, message: str) -> None:
        print(f"warning: {message}", file=sys.stderr)
        self.messages.append(message)


@dataclass
class Run:
    dir: Path
    root: Path  # the sweep directory (or the run itself when it is not in one)
    keys: dict[str, str]  # hive keys of the path, seed included
    manifest: dict
    warn: Warnings
    config: str = ""
    _tables: dict[str, pa.Table] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.dir)

    @property
    def seed(self) -> int | None:
        seed = self.manifest.get("seed", self.keys.get("seed"))
        return None if seed is None else int(seed)

    @property
    def status(self) -> str:
        return self.manifest.get("status", "unknown")

    @property
    def byte_budget(self) -> float:
        return float(self.manifest.get("scenario", {}).get("budget", {}).get("bytes", math.inf))

    def table(self, name: str) -> pa.Table:
        """One table of this run, with run / config / seed columns in front (read once, then cached)."""
        if name not in self._tables:
            t = self._read(name)
            for i, (col, typ, value) in enumerate(
                (("run", pa.string(), self.name), ("config", pa.string(), self.config), ("seed", pa.int64(), self.seed))
            ):
                t = t.add_column(i, pa.field(col, typ), pa.array([value] * t.num_rows, typ))
            self._tables[name] = t
        return self._tables[name]

    def _read(self, name: str) -> pa.Table:
        if name in STATIC:
            return self._read_static(name)
        schema = SCHEMAS[name]
        folder = self.dir / name
        if not folder.is_dir():
            self.warn(f"{folder}: table directory missing; run read without it")
            return schema.empty_table()
        files = {int(m.group(1)): f for f in folder.iterdir() if (m := ROUND_FILE.search(f.name))}
        parts = []
        for rnd in range(self._last_round() + 1):
            f = files.get(rnd, folder / f"round-{rnd:06d}.parquet")
            if rnd not in files:
                self.warn(f"{f}: missing; round {rnd} skipped in {name}")
                continue
            try:
                parts.append(pq.read_table(f, schema=schema))
            except (OSError, pa.ArrowException) as e:
                self.warn(
                    f"{f}: unreadable Parquet ({type(e).__name__}: {str(e).splitlines()[0]}); "
                    f"round {rnd} skipped in {name}"
                )
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def _read_static(self, name: str) -> pa.Table:
        file, schema = STATIC[name]
        f = self.dir / file
        if not f.is_file():  # runs written before the table existed have none
            return schema.empty_table()
        try:
            return read_static(self.dir, name)
        except (OSError, pa.ArrowException) as e:
            self.warn(f"{f}: unreadable Parquet ({type(e).__name__}: {str(e).splitlines()[0]}); run read without it")
            return schema.empty_table()

    def _last_round(self) -> int:
        """Every round writes one file to each table, so the highest round any table has is the run's last."""
        rounds = [
            int(m.group(1))
            for name in TABLES
            if (self.dir / name).is_dir()
            for f in (self.dir / name).iterdir()
            if (m := ROUND_FILE.search(f.name))
        ]
        return max(rounds, default=-1)


@dataclass
class Dataset:
    paths: list[Path]
    runs: list[Run]
    warn: Warnings

    @property
    def configs(self) -> dict[str, list[Run]]:
        """Runs grouped by configuration, in run order."""
        groups: dict[str, list[Run]] = {}
        for r in self.runs:
            groups.setdefault(r.config, []).append(r)
        return groups

    def table(self, name: str) -> pa.Table:
        """All runs' rows of one table (rounds | client_rounds | events | clients | privacy | runs)."""
        if name == "runs":
            return self.runs_table()
        parts = [r.table(name) for r in self.runs]
        empty = STATIC[name][1] if name in STATIC else SCHEMAS[name]
        return pa.concat_tables(parts) if parts else empty.empty_table()

    def runs_table(self) -> pa.Table:
        """One row per run: identity, status, budgets and its configuration keys (as text)."""
        fixed = [
            ("run", pa.string()),
            ("config", pa.string()),
            ("seed", pa.int64()),
            ("root", pa.string()),
            ("policy", pa.string()),
            ("status", pa.string()),
            ("stop_reason", pa.string()),
            ("rounds", pa.int64()),
            ("virtual_time_s", pa.float64()),
            ("R_s", pa.int64()),
            ("byte_budget", pa.float64()),
        ]
        keys = sorted({k for r in self.runs for k in r.keys} - {name for name, _ in fixed})
        rows = []
        for r in self.runs:
            rows.append(
                {
                    "run": r.name,
                    "config": r.config,
                    "seed": r.seed,
                    "root": r.root.name,
                    "policy": r.manifest.get("scenario", {}).get("policy"),
                    "status": r.status,
                    "stop_reason": r.manifest.get("stop_reason"),
                    "rounds": r.table("rounds").num_rows,
                    "virtual_time_s": r.manifest.get("virtual_time_s"),
                    "R_s": r.manifest.get("derived_budgets", {}).get("R_s"),
                    "byte_budget": r.byte_budget,
                    **{k: r.keys.get(k) for k in keys},
                }
            )
        return pa.Table.from_pylist(rows, schema=pa.schema(fixed + [(k, pa.string()) for k in keys]))


def _natural(path: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def _hive(run_dir: Path) -> tuple[Path, dict[str, str]]:
    """(root, keys) of a run directory: the key=value ancestors, outermost first, and the first one that is not."""
    keys, d = [], run_dir.resolve()
    while "=" in d.name:
        k, v = d.name.split("=", 1)
        keys.append((k, unquote(v)))
        d = d.parent
    return (d if keys else run_dir.resolve()), dict(reversed(keys))


def _manifest(run_dir: Path, warn: Warnings) -> dict:
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError) as e:
        warn(f"{run_dir / 'run.json'}: unreadable ({e}); run read without its manifest")
        return {}


def discover(paths: list[str]) -> Dataset:
    """Every run below the PATHs, in natural path order; BadPath for a PATH that holds none. Runs in a
    hidden directory below a PATH are not read: a sweep's earlier runs set aside (.replaced/,
    emulator.cli.reuse), a launcher's own files; give such a directory as the PATH to read it."""
    warn = Warnings()
    runs, seen = [], set()
    for p in map(Path, paths):
        if not p.is_dir():
            raise BadPath(f"{p}: not a directory (expected a run or sweep directory)")
        found = sorted((m.parent for m in p.rglob("run.json") if not _hidden(m.parent.relative_to(p))), key=_natural)
        if not found:
            raise BadPath(f"{p}: no run.json below it (expected a run or sweep directory)")
        for d in found:
            if d.resolve() not in seen:
                seen.add(d.resolve())
                root, keys = _hive(d)
                runs.append(Run(dir=d, root=root, keys=keys, manifest=_manifest(d, warn), warn=warn))
    label_configs(runs)
    return Dataset(paths=[Path(p) for p in paths], runs=runs, warn=warn)

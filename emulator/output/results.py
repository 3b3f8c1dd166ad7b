"""Run directory: `run.json` plus Parquet tables `rounds`, `client_rounds`, `events`, and two written once:
`clients.parquet`, the static per-client table (links and compute as drawn for the run, data size), and
`privacy.parquet`, one row per client the accountant charged (its epsilon and ledger), as the run ends.

Each table is a directory of one Parquet file per round, written to a temporary name and
renamed, so completed rounds are on disk as the run goes and a kill never leaves a torn
file. `pyarrow.parquet.read_table(run_dir / "rounds")` reads a table whole. One process at a
time writes a run directory: it holds an fcntl lock on `.lock` in it while it does.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import platform
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from itertools import islice
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

f64, i32, i64, s = pa.float64(), pa.int32(), pa.int64(), pa.string()

SCHEMAS: dict[str, pa.Schema] = {
    "rounds": pa.schema(
        [
            ("round", i32),
            ("t_start", f64),
            ("t_end", f64),
            ("deadline", f64),
            ("selected", i32),
            ("unavailable", i32),  # candidates left out at the start as unavailable (on_unavailable=exclude)
            ("arrived", i32),
            ("late", i32),
            ("lost", i32),
            ("failed", i32),
            ("bytes_down", i64),
            ("bytes_up", i64),
            ("bytes_total", i64),
            ("tau", f64),
            ("sigma", f64),
            ("mu", f64),
            ("horizon", f64),
            ("policy_state", s),
            ("test_loss", f64),
            ("test_accuracy", f64),
            ("train_loss", f64),
            ("max_epsilon", f64),
            ("energy_j", f64),  # the joules of the round's tasks (null: energy is not modelled)
            ("wall_s", f64),
        ]
    ),
    "client_rounds": pa.schema(
        [
            ("round", i32),
            ("client", i32),
            ("outcome", s),
            ("impact_planned", f64),
            ("impact_factor", f64),
            ("t_download_start", f64),
            ("t_download_end", f64),
            ("t_compute_end", f64),
            ("t_upload_end", f64),
            ("t_end", f64),  # when the task ended: arrival, loss, failure or cut
            ("bytes_down", i64),
            ("bytes_up", i64),
            ("local_steps", i32),
            ("q", f64),
            ("sigma", f64),
            ("clip", f64),
            ("lr", f64),
            ("epsilon", f64),
            ("epsilon_spent", f64),
            ("train_loss", f64),
            ("update_norm", f64),
            ("failure", s),
            ("output_noise_scale", f64),
            ("salt_pepper", f64),
            ("label_noise", f64),
            ("version_start", i32),
            ("staleness", i32),
            ("energy_radio_down_j", f64),  # the task's joules (emulator.energy; null: energy is not modelled)
            ("energy_radio_up_j", f64),
            ("energy_tail_j", f64),
            ("energy_compute_j", f64),
            ("battery_start_j", f64),  # the charge at the task's start and end (null: no battery modelled)
            ("battery_end_j", f64),
        ]
    ),
    "events": pa.schema([("round", i32), ("t", f64), ("client", i32), ("kind", s), ("nbytes", i64)]),
}
# Written once per run: join it with client_rounds on `client`.
CLIENTS_SCHEMA = pa.schema(
    [
        ("client", i32),
        ("data_size", i64),
        ("down_bps", f64),
        ("up_bps", f64),
        ("latency_s", f64),
        ("step_s", f64),
        ("trace", s),
        ("battery_capacity_j", f64),  # null: no battery modelled
        ("battery_initial_j", f64),  # the charge at t = 0
    ]
)
CLIENTS_FILE = "clients.parquet"
BATTERY_COLUMNS = ("battery_capacity_j", "battery_initial_j")  # of the clients table: null without batteries
PRIVACY_SCHEMA = pa.schema(
    [
        ("client", i64),
        ("epsilon", f64),
        ("epsilon_unamplified", f64),  # client-level DP's epsilon without amplification by sampling, else null
        ("charges", i64),  # the rounds it was charged for (null: the accountant does not say)
        ("ledger", s),  # the accountant's document of the client (JSON): its (q, sigma, steps) runs, its releases
    ]
)
PRIVACY_FILE = "privacy.parquet"
STATIC = {"clients": (CLIENTS_FILE, CLIENTS_SCHEMA), "privacy": (PRIVACY_FILE, PRIVACY_SCHEMA)}  # written once
CLIENT_ROWS = 65536  # rows of a static table per row group, as written
WALL_CLOCK_COLUMNS = {"rounds": ["wall_s"]}  # everything else is a function of scenario + seed


def read_table(run_dir: Path | str, name: str) -> pa.Table:
    d = Path(run_dir) / name
    return (
        pq.read_table(d, schema=SCHEMAS[name])
        if d.is_dir() and any(d.glob("*.parquet"))
        else SCHEMAS[name].empty_table()
    )


def read_static(run_dir: Path | str, name: str) -> pa.Table:
    """A table written once (STATIC: clients, privacy); empty where the run has none."""
    file, schema = STATIC[name]
    f = Path(run_dir) / file
    return pq.read_table(f, schema=schema) if f.is_file() else schema.empty_table()


def read_clients(run_dir: Path | str) -> pa.Table:
    return read_static(run_dir, "clients")


def read_privacy(run_dir: Path | str) -> pa.Table:
    return read_static(run_dir, "privacy")


class ResultsWriteError(OSError):
    """Results could not be written (disk full, permissions); completed rounds stay readable."""


RESERVE = ".reserve"  # room kept for run.json's last write, should the disk fill up during the run
RESERVE_BYTES = 1 << 20  # run.json's last write (it holds nothing per client: privacy.parquet does)


class RunWriter:
    def __init__(self, run_dir: Path):
        self.dir = run_dir
        for name in SCHEMAS:
            (run_dir / name).mkdir(parents=True, exist_ok=True)
        self._reserve()

    def _reserve(self) -> None:
        """Allocate RESERVE: a disk that fills during the run still takes run.json's `failed` once it is
        freed (`write_final_manifest`). Best effort: a file system that cannot allocate it goes without."""
        try:
            fd = os.open(self.dir / RESERVE, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError:
            (self.dir / RESERVE).unlink(missing_ok=True)

    def write_round(self, rnd: int, rows: dict[str, list[dict[str, Any]]]) -> None:
        for name, table_rows in rows.items():
            table = pa.Table.from_pylist(table_rows, schema=SCHEMAS[name])
            self._write(
                table,
                self.dir / name / f"round-{rnd:06d}.parquet",
                f"rounds 0-{rnd - 1} are complete on disk (python -m emulator resume {self.dir})",
            )

    def last_round_unevaluated(self) -> int | None:
        """The last round on disk when its row has no evaluation (NaN test accuracy), else None."""
        files = sorted((self.dir / "rounds").glob("round-*.parquet"))
        if not files:
            return None
        accuracy = pq.read_table(files[-1], schema=SCHEMAS["rounds"])["test_accuracy"][0].as_py()
        return int(files[-1].stem.split("-")[1]) if math.isnan(accuracy) else None

    def write_evaluation(self, rnd: int, test_loss: float, test_accuracy: float) -> None:
        """Round `rnd`'s row with its evaluation filled in (the rest of the round's rows stand)."""
        path = self.dir / "rounds" / f"round-{rnd:06d}.parquet"
        rows = pq.read_table(path, schema=SCHEMAS["rounds"]).to_pylist()
        rows[0].update(test_loss=test_loss, test_accuracy=test_accuracy)
        kept = f"round {rnd} lacks its evaluation (python -m emulator resume {self.dir} adds it)"
        self._write(pa.Table.from_pylist(rows, schema=SCHEMAS["rounds"]), path, kept)

    def write_clients(self, columns: Iterable[dict[str, Any]]) -> None:
        """The static per-client table from chunks of its columns (name -> values), each a row group, a battery
        column left out null; a resumed run rewrites the same rows."""
        schema = STATIC["clients"][1]

        def table(c: dict[str, Any]) -> pa.Table:
            nulls = {k: pa.nulls(len(c["client"]), f64) for k in BATTERY_COLUMNS if k not in c}
            return pa.Table.from_pydict({**c, **nulls}, schema=schema)

        self._write_static("clients", (table(c) for c in columns), "no round has run")

    def write_privacy(self, rows: Iterable[dict[str, Any]]) -> int:
        """The privacy table, as the run ends (a resumed run's rewrites it whole); returns its rows."""
        schema = STATIC["privacy"][1]
        groups = (pa.Table.from_pylist(group, schema=schema) for group in _batched(rows, CLIENT_ROWS))
        return self._write_static("privacy", groups, "run.json says how the run ended")

    def _write_static(self, name: str, groups: Iterable[pa.Table], kept: str) -> int:
        """A table written once, streamed in row groups (a million clients' rows are never all in memory), under
        a temporary name renamed when whole; returns the rows written."""
        file, schema = STATIC[name]
        final = self.dir / file
        tmp = final.with_suffix(".tmp")
        written = 0
        try:
            with pq.ParquetWriter(tmp, schema) as out:
                for group in groups:
                    out.write_table(group)
                    written += len(group)
            os.replace(tmp, final)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise ResultsWriteError(f"cannot write {final}: {e.strerror or e}; {kept}") from e
        return written

    @staticmethod
    def _write(table: pa.Table, final: Path, kept: str) -> None:
        """Written to a temporary name and renamed: a kill never leaves a torn file. The temporary is hidden
        (a leading dot), which directory readers (pyarrow's datasets, pandas, polars) skip, so a table
        stays readable after a kill mid-write, before discard_from removes the temporary."""
        tmp = final.with_name(f".{final.stem}.tmp")
        try:
            pq.write_table(table, tmp)
            os.replace(tmp, final)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise ResultsWriteError(f"cannot write {final}: {e.strerror or e}; {kept}") from e

    def discard_from(self, rnd: int) -> None:
        """Drop what a killed run wrote past its last checkpoint: rounds >= rnd and torn temporaries."""
        for name in SCHEMAS:
            for f in (self.dir / name).iterdir():
                if f.suffix == ".tmp" or (f.suffix == ".parquet" and int(f.stem.split("-")[1]) >= rnd):
                    f.unlink()

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        tmp = self.dir / "run.json.tmp"
        try:
            tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
            os.replace(tmp, self.dir / "run.json")
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def write_final_manifest(self, manifest: dict[str, Any]) -> None:
        """run.json as the run ends, however it ends: on a full disk, into the room RESERVE kept (run.json holds
        nothing per client). The reserve is freed either way."""
        try:
            self.write_manifest(manifest)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            (self.dir / RESERVE).unlink(missing_ok=True)
            self.write_manifest(manifest)
        finally:
            (self.dir / RESERVE).unlink(missing_ok=True)

    def discard_temporaries(self) -> None:
        """Remove what a write cut short (a full disk, an error) left under a temporary name."""
        from emulator.output.checkpoint import (
            FILE as CHECKPOINT,  # here: its imports (the config's) are this module's many
        )

        static = (Path(file).with_suffix(".tmp").name for file, _ in STATIC.values())
        for tmp in ("run.json.tmp", f"{CHECKPOINT}.tmp", *static):
            (self.dir / tmp).unlink(missing_ok=True)
        for name in SCHEMAS:
            for f in (self.dir / name).glob(".*.tmp"):
                f.unlink(missing_ok=True)


def _batched(rows: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    it = iter(rows)
    while group := list(islice(it, size)):
        yield group


LOCK = ".lock"


class RunDirError(RuntimeError):
    """The run directory is another process's, or already holds a run."""


@contextmanager
def new_run_dir(parent: str, name: str) -> Iterator[Path]:
    """A directory for a new run, locked for the block."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-%f")
    d = Path(parent) / (name or stamp)
    d.mkdir(parents=True, exist_ok=True)
    with locked(d):
        if (d / "run.json").exists():  # checked under the lock: a run that ended a moment ago counts too
            status = _status(d)
            hint = "" if status == "complete" else f"; continue it with python -m emulator resume {d}"
            raise RunDirError(f"output.name={name!r}: {d} already holds a run ({status}){hint}")
        yield d


def _status(run_dir: Path) -> str:
    try:
        status: str = json.loads((run_dir / "run.json").read_text()).get("status", "no status")
        return status
    except (OSError, ValueError, AttributeError):
        return "unreadable run.json"


@contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """Hold the run directory's lock for the block; the system releases it however the process
    ends, so a killed run never leaves its directory locked."""
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            raise RunDirError(f"{run_dir}: another process is writing this run (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


def provenance() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for pkg in ("torch", "opacus", "numpy", "pyzmq", "msgpack", "simpy", "pyarrow", "omegaconf"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    commit: str | None
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "python": platform.python_version(),
        "packages": versions,
        "git_commit": commit,
        "host": platform.node(),
        "started": datetime.now(UTC).isoformat(),
    }

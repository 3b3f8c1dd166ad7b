"""The site's figures, drawn from real runs of the shipped scenarios: a MkDocs hook (mkdocs.yml), also a script.

`mkdocs build` and `mkdocs serve` call on_pre_build, which writes docs/figures/NAME.png for every figure of
JOBS; `python docs/figures.py [--out DIR] [--work DIR]` does the same by hand. Each job goes through the
command lines only (`python -m emulator`, then `python -m analysis`), in its own directory of the work folder
(default build/figures/), and is run again only when its key changes: its commands and the files of
emulator/, nodes/, analysis/ and scenarios/. A command that fails stops the build in one line.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("emulator", "nodes", "analysis", "scenarios")  # what the figures are drawn by and from
QUIET = ("output.progress=false",)  # appended to every run: changes nothing in its results
log = logging.getLogger("mkdocs.hooks.figures")


class FigureError(Exception):
    """A figure could not be drawn: its one-line reason."""


@dataclass(frozen=True)
class Analysis:
    options: tuple[str, ...]  # `python -m analysis` options beside the job's runs
    figures: dict[str, str]  # docs/figures/NAME.png -> the analysis figure it is


@dataclass(frozen=True)
class Job:
    name: str
    runs: dict[str, tuple[str, ...]]  # run name (runs/NAME) -> its `python -m emulator` overrides
    analyses: tuple[Analysis, ...]

    def commands(self) -> list[list[str]]:
        """Every command of the job, in order, as run from its directory."""
        runs = [["emulator", *args, f"output.name={name}", *QUIET] for name, args in self.runs.items()]
        paths = [f"runs/{name}" for name in self.runs]
        return runs + [["analysis", *paths, "--out", f"analysis-{i}", *a.options] for i, a in enumerate(self.analyses)]


JOBS = (
    Job(  # the tutorial's first run, as it runs it
        "tutorial",
        {"first": ("scenario=dropout.yaml",)},
        (
            Analysis(
                (),
                {
                    "tutorial-accuracy": "accuracy_vs_round.png",
                    "tutorial-epsilon": "epsilon_per_client.png",
                    "tutorial-gantt": "gantt.png",
                    "analysis-outcomes": "arrivals_per_round.png",
                },
            ),
            Analysis(("--gantt-rounds", "2-2"), {"time-model-round": "gantt.png"}),
        ),
    ),
    Job(  # 300 applied updates each: 30 versions of 10, 300 of one
        "async",
        {
            "fedbuff": ("scenario=async_cellular.yaml", "budget.rounds=30"),
            "fedasync": ("scenario=async_cellular.yaml", "budget.rounds=300", "round.mode=async"),
        },
        (Analysis((), {"async-staleness": "staleness.png"}),),
    ),
    Job(  # bench.reproduce compressed_bytes's codecs but QSGD (the slowest run), each until the byte budget stops it
        "compression",
        {
            "none": ("scenario=compressed.yaml", "compression.kind=none", "compression.error_feedback=false"),
            "topk": ("scenario=compressed.yaml",),
            "sign": ("scenario=compressed.yaml", "compression.kind=sign", "compression.error_feedback=false"),
        },
        (Analysis((), {"compression-bytes": "accuracy_vs_bytes_up.png"}),),
    ),
)


def sources_digest(root: Path = ROOT) -> str:
    h = hashlib.sha256()
    for top in SOURCES:
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def job_key(job: Job, sources: str) -> str:
    return hashlib.sha256(repr((job.commands(), sources)).encode()).hexdigest()


def _run(job: Job, command: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    r = subprocess.run([sys.executable, "-m", *command], cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        lines = [line for line in (r.stderr + r.stdout).splitlines() if line.strip()]
        why = lines[-1].strip() if lines else "no output"
        raise FigureError(f"docs figures, job {job.name}: `python -m {' '.join(command)}` exited {r.returncode}: {why}")


def _copy_if_changed(source: Path, target: Path) -> None:
    """Copy unless the target holds the same bytes (mkdocs serve rebuilds on every write to docs/)."""
    if not (target.exists() and target.read_bytes() == source.read_bytes()):
        shutil.copyfile(source, target)


def build(jobs: tuple[Job, ...], out: Path, work: Path) -> list[str]:
    """Write out/NAME.png for every figure of `jobs` (and remove any other PNG there), running the jobs
    whose key changed; the names of the jobs run."""
    out.mkdir(parents=True, exist_ok=True)
    names = {f"{name}.png" for job in jobs for a in job.analyses for name in a.figures}
    for stale in out.glob("*.png"):
        if stale.name not in names:
            stale.unlink()
    sources = sources_digest()
    ran = []
    for job in jobs:
        folder, key = work / job.name, job_key(job, sources)
        stamp = folder / "key"
        if not (stamp.exists() and stamp.read_text() == key):
            started = time.monotonic()
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            for command in job.commands():
                _run(job, command, folder)
            stamp.write_text(key)
            ran.append(job.name)
            log.info(f"docs figures: job {job.name} run in {time.monotonic() - started:.1f} s")
        for i, analysis in enumerate(job.analyses):
            for name, drawn in analysis.figures.items():
                source = folder / f"analysis-{i}" / drawn
                if not source.is_file():
                    raise FigureError(f"docs figures, job {job.name}: python -m analysis wrote no {drawn}")
                _copy_if_changed(source, out / f"{name}.png")
    return ran


def on_pre_build(config: Any) -> None:
    """MkDocs hook: the figures into <docs_dir>/figures/, the runs into build/figures/ beside mkdocs.yml."""
    from mkdocs.exceptions import PluginError

    try:
        build(JOBS, Path(config["docs_dir"]) / "figures", Path(config["config_file_path"]).parent / "build" / "figures")
    except FigureError as e:
        raise PluginError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python docs/figures.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "figures", help="where the PNGs go")
    p.add_argument("--work", type=Path, default=ROOT / "build" / "figures", help="where the runs go")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        build(JOBS, args.out, args.work)
    except FigureError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

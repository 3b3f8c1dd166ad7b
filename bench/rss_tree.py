"""python -m bench.rss_tree [OVERRIDES...]

Peak resident memory of a whole `python -m emulator` run: the server, its evaluator and its workers,
read from /proc every 0.1 s (Linux) and summed at each reading. Pages that forked processes share
count once per process, so the sum is an upper bound. Each process's own peak is reported too: what
`emulator.run.guards.memory_estimate` bounds, process by process. The scale benchmark's in-process figures
(`python -m bench --only scale`) hold torch in the server, which the command does not import.

    python -m bench.rss_tree clients.n=10000 clients.per_round=1000 model.name=logreg dp.tau=5 budget.rounds=7
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SAMPLE_S = 0.1


def _rss_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # it ended between the listing and the reading
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0.0)


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4, after the command's parentheses
                kids.append(int(entry))
    return kids


@dataclass
class TreePeak:
    """One run's memory, in MB: `total` the peak of the summed RSS and `at_peak` each process's RSS at
    that reading; `server` the command's own process's peak and `others` every other process's own."""

    total: float
    at_peak: list[float]
    server: float
    others: list[float]
    wall: float
    rounds_cpu: float  # the server process's own CPU seconds from round 0's start to the last round's rows
    rounds: int  # rounds in the rounds table
    startup: float  # wall seconds from the command to run.json's running (every worker ready, round 0 next)


def peak_tree_rss(overrides: list[str]) -> TreePeak:
    """The memory of one run of `python -m emulator overrides`."""
    with tempfile.TemporaryDirectory() as out:
        args = [*overrides, f"output.dir={out}", "output.name=run", "output.progress=false"]
        proc = subprocess.Popen([sys.executable, "-m", "emulator", *args], stdout=subprocess.DEVNULL)
        start, peak, at_peak = time.perf_counter(), 0.0, []
        own: dict[int, float] = {}  # each process's own peak
        cpu = RoundsCpu(Path(out) / "run", proc.pid, _scenario_rounds(overrides))
        while proc.poll() is None:
            cpu.read()
            # 0 for a process that has ended: a zombie (the zygote, once it has forked, until the server
            # waits for it) has no VmRSS and holds no memory
            sizes = {p: mb for p in [proc.pid, *_children(proc.pid)] if (mb := _rss_mb(p)) > 0}
            if sum(sizes.values()) > peak:
                peak, at_peak = sum(sizes.values()), sorted(sizes.values())
            own.update({p: max(mb, own.get(p, 0.0)) for p, mb in sizes.items()})
            time.sleep(SAMPLE_S)
        if proc.returncode != 0:
            raise SystemExit(f"python -m emulator {' '.join(args)} exited {proc.returncode}")
        server = own.pop(proc.pid, 0.0)
        wall = time.perf_counter() - start
        return TreePeak(
            peak, at_peak, server, sorted(own.values()), wall, cpu.seconds(), cpu.rounds, cpu.running_at - start
        )


def _cpu_s(pid: int) -> float:
    """The process's own user + system CPU seconds (not its children's)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _scenario_rounds(overrides: list[str]) -> int:
    return next((int(o.split("=", 1)[1]) for o in overrides if o.startswith("budget.rounds=")), 0)


class RoundsCpu:
    """The server's CPU over its rounds, start-up and shutdown left out: read when run.json first says
    running (every worker ready, round 0 next) and when the rounds table first holds `rounds` rounds."""

    def __init__(self, run_dir: Path, pid: int, rounds: int):
        self.run_dir, self.pid, self.rounds = run_dir, pid, rounds
        self.at_start = self.at_end = self.running_at = math.nan

    def read(self) -> None:
        if math.isnan(self.at_start):
            try:
                running = json.loads((self.run_dir / "run.json").read_text()).get("status") == "running"
            except (OSError, ValueError):
                running = False
            if running:
                self.at_start, self.running_at = _cpu_s(self.pid), time.perf_counter()
        elif math.isnan(self.at_end) and len(list((self.run_dir / "rounds").glob("round-*.parquet"))) >= self.rounds:
            self.at_end = _cpu_s(self.pid)

    def seconds(self) -> float:
        return self.at_end - self.at_start


def main(argv: list[str] | None = None) -> int:
    overrides = sys.argv[1:] if argv is None else argv
    p = peak_tree_rss(overrides)
    print(f"load {os.getloadavg()[0]:.2f}; {p.wall:.1f} s wall, {p.startup:.1f} s to round 0")
    each = ", ".join(f"{s:.0f}" for s in p.at_peak)
    print(f"peak total RSS {p.total:.0f} MB over {len(p.at_peak)} processes (MB each: {each})")
    print(f"each process's own peak: server {p.server:.0f} MB, others {', '.join(f'{s:.0f}' for s in p.others)} MB")
    if p.rounds:
        print(f"server CPU over its {p.rounds} rounds (start-up excluded): {p.rounds_cpu / p.rounds:.3f} s a round")
    return 0


if __name__ == "__main__":
    sys.exit(main())

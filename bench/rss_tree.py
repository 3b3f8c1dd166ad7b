"""python -m bench.rss_tree [OVERRIDES...]

Peak resident memory of a whole `python -m emulator` run: the server, its evaluator and its workers,
read from /proc every 0.1 s (Linux) and summed at each reading. Pages that forked processes share
count once per process, so the sum is an upper bound. Each process's own peak is reported too: what
`emulator.guards.memory_estimate` bounds, process by process. The scale benchmark's in-process figures
(`python -m bench --only scale`) hold torch in the server, which the command does not import.

    python -m bench.rss_tree clients.n=10000 clients.per_round=1000 model.name=logreg dp.tau=5 budget.rounds=7
"""

from __future__ import annotations

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


def peak_tree_rss(overrides: list[str]) -> TreePeak:
    """The memory of one run of `python -m emulator overrides`."""
    with tempfile.TemporaryDirectory() as out:
        args = [*overrides, f"output.dir={out}", "output.progress=false"]
        proc = subprocess.Popen([sys.executable, "-m", "emulator", *args], stdout=subprocess.DEVNULL)
        start, peak, at_peak = time.perf_counter(), 0.0, []
        own: dict[int, float] = {}  # each process's own peak
        while proc.poll() is None:
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
        return TreePeak(peak, at_peak, server, sorted(own.values()), time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    overrides = sys.argv[1:] if argv is None else argv
    p = peak_tree_rss(overrides)
    print(f"load {os.getloadavg()[0]:.2f}; {p.wall:.1f} s wall")
    each = ", ".join(f"{s:.0f}" for s in p.at_peak)
    print(f"peak total RSS {p.total:.0f} MB over {len(p.at_peak)} processes (MB each: {each})")
    print(f"each process's own peak: server {p.server:.0f} MB, others {', '.join(f'{s:.0f}' for s in p.others)} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

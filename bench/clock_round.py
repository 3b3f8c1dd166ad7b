"""python -m bench.clock_round [--clients 1000] [--per-round 100] [--rounds 100] [--repeats 3] [OVERRIDES...]

What the virtual clock costs the server a round (emulator.timemodel.clock.Clock.simulate_round): W2's clients
(synthetic, defaults: no deadline, always available, no shared server link, no losses), `per_round`
of `clients` drawn at random each round, each job 5 steps and a logreg-sized message each way, run by
the plain queue (what such a round runs on) and by SimPy's processes (what a round with a deadline,
a shared server link or a client leaving during its steps runs on), interleaved `repeats` times;
medians of the wall and CPU milliseconds a round (this process). OVERRIDES (scenario keys) change the links, e.g.
links.dropout.model=bernoulli links.dropout.p=0.1; a key that makes rounds race runs SimPy in both.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

from bench.__main__ import Timing, _median, timed
from emulator.config import load
from emulator.timemodel.clock import Clock, Job
from emulator.timemodel.resources import build_resources

MESSAGE_BYTES = 4_096  # about a logreg update of W2's synthetic data, down and up
STEPS = 5


def _clock(overrides: list[str], clients: int, simpy_only: bool) -> Clock:
    cfg = load(None, [f"clients.n={clients}", *overrides])
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, cfg.seed)
    clock = Clock(resources, cfg.seed, cfg.links.server_down_bps, cfg.links.server_up_bps)
    if simpy_only:
        clock._queue_round = lambda *args: False  # type: ignore[method-assign]  # SimPy runs every round
    return clock


def rounds(overrides: list[str], clients: int, per_round: int, n_rounds: int, simpy_only: bool) -> Timing:
    """`n_rounds` rounds of one clock, timed together (the clients' resources made before, untimed)."""
    clock = _clock(overrides, clients, simpy_only)
    rng = np.random.default_rng(0)
    plans = [sorted(rng.choice(clients, per_round, replace=False).tolist()) for _ in range(n_rounds)]
    for c in sorted({c for plan in plans for c in plan}):
        clock.resources[c]  # made now, as a run's first selection makes them

    def play() -> None:
        for rnd, plan in enumerate(plans):
            clock.simulate_round(rnd, [Job(c, MESSAGE_BYTES, STEPS, MESSAGE_BYTES) for c in plan], math.inf)

    return timed(play)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.clock_round", description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--per-round", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    engines = {"queue": False, "simpy": True}
    times: dict[str, list[Timing]] = {name: [] for name in engines}
    for _ in range(a.repeats):
        for name, simpy_only in engines.items():
            times[name].append(rounds(a.overrides, a.clients, a.per_round, a.rounds, simpy_only))
    print(
        f"clock: {a.clients} clients, {a.per_round} a round, {a.rounds} rounds {' '.join(a.overrides)}, "
        f"median of {a.repeats} (load {os.getloadavg()[0]:.2f})"
    )
    print(f"{'engine':<8} {'wall ms/round':>14} {'cpu ms/round':>13} {'x simpy':>8}")
    simpy = _median(times["simpy"]).wall
    for name, ts in times.items():
        t = _median(ts)
        print(f"{name:<8} {1e3 * t.wall / a.rounds:14.3f} {1e3 * t.cpu / a.rounds:13.3f} {t.wall / simpy:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

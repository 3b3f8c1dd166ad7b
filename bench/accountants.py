"""python -m bench.accountants [--clients 10000] [--per-round 1000] [--rounds 10] [--repeats 3] [--varying-tau]
[--population] [--runs] [--histories 30,100,300]

What dp.accountant costs the server a round: the accountant's calls of emulator.rounds.round.play_round
(eligible for every client, allows for each task, epsilon of each task's client before and after
charge, epsilon of every client for the round's row) on a dropout-like history: each round
`per_round` of `clients` clients, drawn at random, train `tau` DP-SGD steps at (q, sigma), with a
finite budget so that eligibility and allows are asked (--varying-tau: each round's tau from
VARYING_TAU in turn, as ALI-DPFL's tau* changes every round, so that more histories differ;
--population: dp_fedavg's one client-level ledger for the population instead, each round a Poisson
draw at q = per_round / clients with z = sigma, and the largest unamplified epsilon its aggregate records).
Accountants are interleaved (rdp, prv, pld, rdp, ...) `repeats` times, each repeat from cold
caches, as a run's server starts (its warm-up untimed: the library's import and one step);
medians of the per-round wall and CPU seconds (this process) are printed next to the load average.

--runs adds the emulator itself at the same setting (synthetic, logreg, 2 workers), rounds+1 rounds
against 1 round under each accountant, interleaved: the difference is what `rounds` rounds cost,
accounting included, to set the accounting's cost against.

--histories 30,100,300 adds one client's history of that many distinct (q, sigma) runs under each
accountant, from cold caches: its epsilon asked once, and asked after each run is added (as the server
asks every round of a client whose sigma changes every round).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import warnings

import numpy as np

from bench.__main__ import Timing, _cpu, _median, timed
from emulator import privacy
from emulator.config import load
from emulator.policies import ClientTask
from emulator.policies.accounting import Accountant, RdpAccountant
from emulator.policies.population import PopulationAccountant
from emulator.privacy.numerical import FALLBACKS, reset_fallbacks
from emulator.run.lifecycle import run

Q, SIGMA, TAU, EPSILON = 0.05, 1.0, 5, 8.0
VARYING_TAU = [3, 8, 5, 11, 2, 7, 13, 4, 9, 6]


def _cold(accountant: str, delta: float) -> None:
    """Caches emptied, then what a run's server does while its workers start (emulator.run.lifecycle's
    _load_accountant, untimed here too): the library's import and one step at (q, sigma)."""
    privacy.clear_caches()
    privacy.epsilon([(Q, SIGMA, 1)], delta, accountant=accountant)


HISTORY_SIZES = (30, 100, 300)


def distinct_runs(n: int) -> list[tuple[float, float, int]]:
    """n runs of TAU steps at q = Q, each at a sigma of its own in [1, 1.5) (adap_dpfl's decays, slower)."""
    return [(Q, SIGMA + 0.5 * i / n, TAU) for i in range(n)]


def histories(accountants: list[str], sizes: list[int], delta: float = 1e-5) -> None:
    """Each accountant's epsilon of a history of n distinct (q, sigma) runs, from cold caches: asked once
    (whole), and asked after each run is added, as the server asks of a client every round (grown)."""
    print(f"\naccountants: histories of distinct runs ({TAU} steps at q = {Q}, sigma in [1, 1.5)), delta = {delta:g}")
    print(
        f"{'dp.accountant':<14} {'runs':>5} {'whole: wall s':>14} {'cpu s':>7} {'grown: wall s':>14} {'cpu s':>7} "
        f"{'epsilon':>9}"
    )
    for n in sizes:
        for a in accountants:
            h = distinct_runs(n)
            reset_fallbacks()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # past its max_runs: said in the row instead
                _cold(a, delta)
                whole = timed(lambda h=h, a=a: privacy.epsilon(h, delta, accountant=a))
                _cold(a, delta)
                grown = timed(
                    lambda h=h, a=a: [privacy.epsilon(h[:i], delta, accountant=a) for i in range(1, len(h) + 1)]
                )
                eps = privacy.epsilon(h, delta, accountant=a)
            fell_back = f"  RDP's epsilon: past {FALLBACKS[a]}" if a in FALLBACKS else ""
            print(
                f"{a:<14} {n:5d} {whole.wall:14.2f} {whole.cpu:7.2f} {grown.wall:14.2f} {grown.cpu:7.2f} {eps:9.4f}"
                f"{fell_back}",
                flush=True,
            )


def rounds_of_accounting(
    accountant: str, clients: int, per_round: int, rounds: int, seed: int, taus: list[int], population: bool = False
) -> list[Timing]:
    """Each round's accounting, timed (wall, CPU of this process)."""
    cfg = load(
        None,
        [f"dp.accountant={accountant}", f"dp.q={Q}", f"dp.sigma={SIGMA}", f"dp.tau={TAU}", f"dp.epsilon={EPSILON}"],
    )
    q = per_round / clients
    ledger = PopulationAccountant(cfg.dp, clients, "poisson", q, per_round, SIGMA) if population else None
    acc: Accountant = ledger or RdpAccountant(cfg.dp, clients)
    rng = np.random.default_rng(seed)
    _cold(accountant, cfg.dp.delta)

    def one_round(tau: int) -> None:
        eligible = [i for i in range(clients) if acc.eligible(i)]
        if ledger:  # dp_fedavg's Poisson draw
            u = rng.random(clients)
            chosen = [i for i in eligible if u[i] < q]
        else:
            chosen = rng.choice(eligible, size=min(per_round, len(eligible)), replace=False).tolist()
        tasks = [ClientTask.dp_sgd(int(i), cfg.dp, steps=tau) for i in sorted(chosen)]
        tasks = [t for t in tasks if acc.allows(t)]
        before = {t.client: acc.epsilon(t.client) for t in tasks}
        acc.charge(tasks)
        spent = {c: acc.epsilon(c) - e for c, e in before.items()}  # the round's epsilon_spent
        row = [acc.epsilon(i) for i in range(clients)]  # the round's epsilon of every client
        if ledger:
            ledger.unamplified_max()  # dp_fedavg's aggregate records it every round
        assert len(spent) == len(tasks) and len(row) == clients

    return [timed(lambda r=r: one_round(taus[r % len(taus)])) for r in range(rounds)]


def accounting(
    accountants: list[str],
    clients: int,
    per_round: int,
    rounds: int,
    repeats: int,
    taus: list[int],
    population: bool = False,
) -> None:
    steps = taus[0] if len(taus) == 1 else f"{', '.join(map(str, taus))} (in turn)"
    what = (
        f"dp_fedavg's population ledger, Poisson q = {per_round / clients:g}, z = {SIGMA}"
        if population
        else f"train {steps} steps at q = {Q}, sigma = {SIGMA}"
    )
    print(
        f"\naccountants: {clients:,} clients, {per_round:,} a round, {what} "
        f"(dp.epsilon = {EPSILON}), {rounds} rounds; median of {repeats} interleaved, each from cold caches"
    )
    print(
        f"{'dp.accountant':<14} {'round 0: wall s':>16} {'cpu s':>7} {'median round: wall s':>21} {'cpu s':>7} "
        f"{'max round: wall s':>18} {'cpu s':>7} {'all rounds: wall s':>19} {'cpu s':>7} {'load 1 min':>11}"
    )
    per: dict[str, list[list[Timing]]] = {a: [] for a in accountants}
    loads: dict[str, list[float]] = {a: [] for a in accountants}
    for r in range(repeats):
        for a in accountants:
            loads[a].append(os.getloadavg()[0])
            per[a].append(rounds_of_accounting(a, clients, per_round, rounds, r, taus, population))
    for a, runs in per.items():
        first = _median([ts[0] for ts in runs])
        median = _median([_median(ts) for ts in runs])
        worst = _median([max(ts, key=lambda t: t.wall) for ts in runs])
        total = _median([Timing(sum(t.wall for t in ts), sum(t.cpu for t in ts)) for ts in runs])
        print(
            f"{a:<14} {first.wall:16.3f} {first.cpu:7.3f} {median.wall:21.3f} {median.cpu:7.3f} "
            f"{worst.wall:18.3f} {worst.cpu:7.3f} {total.wall:19.3f} {total.cpu:7.3f} "
            f"{statistics.median(loads[a]):11.2f}",
            flush=True,
        )


def runs(accountants: list[str], clients: int, per_round: int, rounds: int, repeats: int) -> None:
    overrides = [
        f"clients.n={clients}",
        f"clients.per_round={per_round}",
        "clients.select=uniform",
        "model.name=logreg",
        f"dp.tau={TAU}",
        f"dp.q={Q}",
        f"dp.sigma={SIGMA}",
        f"dp.epsilon={EPSILON}",
        "workers=2",
        "output.progress=false",
    ]

    def go(accountant: str, n_rounds: int) -> Timing:
        with tempfile.TemporaryDirectory() as tmp:
            args = [*overrides, f"dp.accountant={accountant}", f"budget.rounds={n_rounds}", f"output.dir={tmp}"]
            return timed(lambda: run(load(None, args)))

    print(f"\nthe emulator at that setting (synthetic, logreg, 2 workers): {rounds} rounds = {rounds + 1} - 1 rounds")
    print(f"{'dp.accountant':<14} {'wall s/round':>13} {'cpu s/round (all)':>18} {'load 1 min':>11}")
    times: dict[str, list[tuple[float, float]]] = {a: [] for a in accountants}
    loads: dict[str, list[float]] = {a: [] for a in accountants}
    for _ in range(repeats):
        for a in accountants:
            loads[a].append(os.getloadavg()[0])
            one, more = go(a, 1), go(a, rounds + 1)
            times[a].append(((more.wall - one.wall) / rounds, (more.cpu - one.cpu) / rounds))
    for a, ts in times.items():
        wall, cpu = statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)
        print(f"{a:<14} {wall:13.3f} {cpu:18.3f} {statistics.median(loads[a]):11.2f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.accountants", description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--per-round", type=int, default=1_000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--varying-tau", action="store_true", help="each round's steps from VARYING_TAU in turn")
    ap.add_argument("--population", action="store_true", help="dp_fedavg's client-level population ledger")
    ap.add_argument("--runs", action="store_true", help="also the emulator's rounds at the same setting")
    ap.add_argument(
        "--histories", default="", help="histories of this many distinct runs, e.g. 30,100,300 (python -m bench's)"
    )
    args = ap.parse_args(argv)
    accountants = []
    for a in privacy.ACCOUNTANTS.names():
        missing = privacy.ACCOUNTANTS.get(a).missing()
        if missing:
            print(f"{a} left out: it {missing}")
        else:
            accountants.append(a)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()}, CPU s so far {_cpu():.1f}")
    taus = VARYING_TAU if args.varying_tau else [TAU]
    accounting(accountants, args.clients, args.per_round, args.rounds, args.repeats, taus, args.population)
    if args.runs:
        runs(accountants, args.clients, args.per_round, args.rounds, args.repeats)
    if args.histories:
        histories(accountants, [int(n) for n in args.histories.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())

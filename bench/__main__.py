"""python -m bench [--repeats 3] [--only w1,w2,dp,wire,scale,million,scale10m,overlap,startup,accountants]
                   [--scale 100,1000,10000] [--million 10000,1000000] [--scale10m 10000,10000000]
                   [--bundles-w1 2,5,10] [--bundles-w2 10,25,50,100]

The performance workloads of the project, each measured side by side in one run:

* w1: FashionMNIST, 10 clients, Table V CNN, 20 DP-SGD steps per round, 20 rounds: the emulator
  with 2 workers and with 1, against the same training in one plain process (the floor), and with
  2 workers evaluating only after the last round (in this process and as a command), as the floor
  does not evaluate at all;
* w2: 1,000 synthetic clients, 100 per round, logreg, 5 steps, 10 rounds: emulator vs floor (as a
  command also evaluating only after the last round, as W1);
  both with two floors started at once, which measures what this machine gives two processes
  (a VM's 2 vCPUs may share a core or its caches): the bound under any 2-worker run;
  the unlabelled rows run at the defaults (train.bundle = auto); W1 and W2 also with train.bundle = K
  (--bundles-w1, --bundles-w2: clients trained as one batched computation, nodes/training/bundle.py),
  in this process and as commands, beside K = 1 and the floor; and
  W2's steady state: the median wall seconds of a round after the first (start-up and round 0
  excluded), the emulator's from its rounds table's wall_s (plan to aggregation) and as the round's
  whole period (bench.round_period), the floor's timed round by round, for auto, K = 1 and each K;
* dp: one DP-SGD step against one plain step (python -m bench.dp_step, FMNIST CNN);
* wire: a 10 MB model through a socket: the protocol against raw ZeroMQ and protocol 1's framing;
* scale: per-round CPU seconds (start-up excluded) and peak memory at 100, 1,000, 10,000 synthetic
  clients, 10 % a round (in this process, which holds torch; `python -m bench.rss_tree` sums a
  command's whole process tree);
* million: 10,000 against 1,000,000 registered clients, 1,000 a round, logreg, 10 rounds, each a
  `python -m emulator` command: peak RSS of its whole process tree (`bench.rss_tree`) and the server's
  own CPU per round (start-up excluded), side by side (`--million 10000,1000000` sets the counts), each
  count also with the energy model on (LTE, a compute power drawn per client), interleaved, and against
  the same count without it;
* scale10m: the same at 10,000 and 10,000,000 registered clients under (a) uniform selection, every client
  always available, (b) Oort under diurnal availability, (c) FedCS asking 2,000 candidates a round under a
  csv availability trace (every hundredth client a daily window), (d) fu_tuning; with the start-up seconds
  (the command to round 0) beside them (not in the default --only: a run of ten million takes minutes);
* overlap: the ALI-DPFL reproduction's rounds (FMNIST, FedAvgCNN, 10 clients, 1 worker, 17,504 test
  images) with the server's evaluation after each round's training and overlapped with the next's;
* startup: `python -m emulator` from the command to round 0 (its run.json says running: every worker
  is ready), against one worker's own import and setup in a process of its own;
* accountants: the server's privacy accounting per round under dp.accountant = rdp, prv, pld at
  10,000 clients, 1,000 a round, and one client's history of 30, 100 and 300 distinct runs
  (python -m bench.accountants --histories 30,100,300).

Emulator and floor are interleaved (E, F, E, F, ...) `--repeats` times; medians are printed with
CPU seconds (this process and its children) next to wall seconds and the load average. W1 and W2
run each twice: in this process, where torch is imported already (the emulator's server here, its
workers fresh processes; the floor `bench.floor` here), and each as a command of its own, `python -m
emulator` against `python -m bench.floor`, every import included; each against its own floor.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass
from pathlib import Path

import msgpack
import numpy as np
import torch
import zmq

from bench import round_period
from bench.floor import floor
from emulator.config import load
from emulator.run.lifecycle import run
from nodes.contracts import protocol
from nodes.contracts.schema import BUNDLE_AUTO, to_dict

W1 = [
    "data.dataset=fashion_mnist",
    "clients.n=10",
    "model.name=cnn_fmnist",
    "dp.tau=20",
    "dp.q=0.01",
    "budget.rounds=20",
]
W1_EVAL_AT_END = [*W1, "eval.every=20"]  # of its 20 rounds only the last evaluated, as the floor evaluates none
# The reproduction's setting (scenarios/paper/ali_dpfl_table2_fmnist.yaml), fixed tau, 6 rounds.
REPRODUCTION = "paper/ali_dpfl_table2_fmnist.yaml"
OVERLAP = ["policy=fedavg_dp", "budget.rounds=6"]
W2 = [
    "clients.n=1000",
    "clients.per_round=100",
    "clients.select=uniform",
    "model.name=logreg",
    "dp.tau=5",
    "budget.rounds=10",
]
W2_EVAL_AT_END = [*W2, "eval.every=10"]  # as W1_EVAL_AT_END: the floor evaluates nothing


# Start-up: the default scenario with 1 and 2 workers, and FashionMNIST with the Table V CNN; one round.
STARTUP = {
    "synthetic, logreg, 1 worker": ["workers=1"],
    "synthetic, logreg, 2 workers": ["workers=2"],
    "FashionMNIST, cnn_fmnist, 2 workers": [
        "data.dataset=fashion_mnist",
        "model.name=cnn_fmnist",
        "dp.q=0.01",
        "workers=2",
    ],
}
# What a worker does before it is ready: its imports (nodes.worker, and what its main loads while the
# hello waits) and its setup; os._exit, as the worker's own exit, skips torch's slow teardown.
WORKER_SETUP = (
    "import json, os, sys; from nodes import worker; from nodes.training import dp_step, trainer; "
    "worker._setup(json.loads(sys.argv[1])); os._exit(0)"
)


@dataclass
class Timing:
    wall: float
    cpu: float  # this process and its children


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _median(ts: list[Timing]) -> Timing:
    return Timing(statistics.median(t.wall for t in ts), statistics.median(t.cpu for t in ts))


def timed(fn) -> Timing:
    w, c = time.perf_counter(), _cpu()
    fn()
    return Timing(time.perf_counter() - w, _cpu() - c)


def _run_args(overrides: list[str], workers: int, out: str) -> list[str]:
    return [*overrides, f"workers={workers}", "output.progress=false", f"output.dir={out}"]


def emulator(overrides: list[str], workers: int, out: str = ""):
    """A run in `out` (kept) or a temporary directory."""

    def go():
        with tempfile.TemporaryDirectory() as tmp:
            args = _run_args(overrides, workers, out or tmp)
            run(load(None, [*args, "output.name=run"] if out else args))

    return go


def _floor_command(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "bench.floor", *overrides]


def floor_process(overrides: list[str]):
    """The floor in a fresh process of its own (`python -m bench.floor`): torch's import and the
    data's setup included, as `python -m emulator` pays them."""
    return lambda: subprocess.run(_floor_command(overrides), check=True)


def floors_at_once(overrides: list[str]):
    """Two floors, each a fresh process, started together: twice the work, timed until the last
    ends. Its wall against one floor's is what this machine makes of two processes on its cores,
    which bounds any 2-worker run from below (see `side_by_side`)."""

    def go():
        procs = [subprocess.Popen(_floor_command(overrides)) for _ in range(2)]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise subprocess.CalledProcessError(max(codes), "bench.floor")

    return go


def emulator_command(overrides: list[str], workers: int):
    """`python -m emulator`: its server's imports and start-up included."""

    def go():
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "emulator", *_run_args(overrides, workers, tmp)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)

    return go


PAIR = "2 floors at once"
COMMAND_EVAL_AT_END = "command, eval at end"
FRESH_PROCESS = ("command, 2 workers", COMMAND_EVAL_AT_END, "floor, fresh process", PAIR)


def bundled(contenders: dict, overrides: list[str], bundles: list[int], at_end: list[str] | None = None) -> dict:
    """`contenders` (at the defaults: train.bundle = auto) with, for K = 1 and each K in `bundles`, the
    2-worker emulator with train.bundle = K, in this process and as a command; and as a command with
    `at_end`'s overrides (evaluating after the last round only) if given."""
    more = {}
    for k in dict.fromkeys([1, *bundles]):
        more[f"emulator, 2 workers, K={k}"] = emulator([*overrides, f"train.bundle={k}"], 2)
        more[f"command, 2 workers, K={k}"] = emulator_command([*overrides, f"train.bundle={k}"], 2)
        if at_end is not None:
            more[f"command, eval at end, K={k}"] = emulator_command([*at_end, f"train.bundle={k}"], 2)
    return {**contenders, **more}


def steady_rounds(run_dir: Path) -> list[dict]:
    """A run's steady state: its rounds table's rows after round 0 (start-up and the first round
    excluded), in round order; each row's wall_s is the round's wall seconds from plan to aggregation."""
    from emulator.output.results import read_table

    return read_table(run_dir, "rounds").sort_by("round").to_pylist()[1:]


def steady_state(title: str, overrides: list[str], bundles: list[int], repeats: int) -> None:
    """Per-round wall seconds after round 0 (start-up and the first round excluded), median over the
    rounds, then over `repeats` interleaved runs: the floor's timed round by round in this process; the
    2-worker emulator's (auto, K = 1 and each K in `bundles`) two ways: plan to aggregation (its rounds table's
    wall_s), and the round's whole period, the after-round work that holds the next round back included
    (bench.round_period: the time between consecutive rounds' starts, from round 1's on)."""

    def emulated(k: int | str) -> tuple[float, float]:
        with tempfile.TemporaryDirectory() as out, round_period.round_starts() as starts:
            emulator([*overrides, f"train.bundle={k}"], 2, out)()
            wall = statistics.median(r["wall_s"] for r in steady_rounds(Path(out) / "run"))
            return wall, round_period.steady_period(starts)

    def floored() -> tuple[float, float]:
        walls: list[float] = []
        floor(overrides, round_walls=walls)()
        median = statistics.median(walls[1:])
        return median, median  # the floor does nothing between rounds: its period is its round

    contenders: dict[str, Callable[[], tuple[float, float]]] = {"floor (one process)": floored}
    ks: list[int | str] = [BUNDLE_AUTO, 1, *bundles]
    for k in dict.fromkeys(ks):
        contenders[f"emulator, 2 workers, K={k}"] = functools.partial(emulated, k)
    seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, how in contenders.items():
            seconds[name].append(how())
    base = statistics.median(w for w, _ in seconds["floor (one process)"])
    print(f"\n{title}   (load {os.getloadavg()[0]:.2f}, median of {repeats} interleaved)")
    print(f"{'':<28} {'plan-aggregation s':>19} {'x floor':>8} {'period s':>9} {'x floor':>8}")
    for name, values in seconds.items():
        wall, period = (statistics.median(v[i] for v in values) for i in (0, 1))
        print(f"{name:<28} {wall:19.4f} {wall / base:8.2f} {period:9.4f} {period / base:8.2f}")


def side_by_side(title: str, contenders: dict, repeats: int) -> None:
    times: dict[str, list[Timing]] = {k: [] for k in contenders}
    for _ in range(repeats):
        for k, fn in contenders.items():
            times[k].append(timed(fn))
    medians = {k: _median(ts) for k, ts in times.items()}
    wall = {k: m.wall for k, m in medians.items()}
    print(f"\n{title}   (load {os.getloadavg()[0]:.2f}, median of {repeats} interleaved)")
    print(f"{'':<28} {'wall s':>8} {'cpu s':>8} {'x floor':>8}")
    for k, m in medians.items():
        # in this process (torch imported): against the floor here; a process of its own: against the
        # floor's own process
        fresh = k in FRESH_PROCESS or k.startswith("command")
        base = wall["floor, fresh process" if fresh else "floor (one process)"]
        print(f"{k:<28} {m.wall:8.2f} {m.cpu:8.2f} {m.wall / base:8.2f}")
    if PAIR in wall:
        # two floors do twice the floor's work: on 2 ideal cores in the floor's time (x floor = 1)
        pair = wall[PAIR] / wall["floor, fresh process"]
        print(
            f"2 floors at once take {pair:.2f}x one floor: 2 processes here run at {1 / pair:.2f}x one's speed "
            f"each, so a 2-worker run of this work takes about {pair / 2:.2f}x the floor at best"
        )


def overlap(repeats: int) -> None:
    """eval.overlap off and on, interleaved, each run timed whole (start-up included)."""

    def go(on: bool):
        def one():
            with tempfile.TemporaryDirectory() as tmp:
                overrides = [*OVERLAP, f"eval.overlap={on}", "output.progress=false", f"output.dir={tmp}"]
                run(load(REPRODUCTION, overrides))

        return one

    print(f"\noverlap: {REPRODUCTION} {' '.join(OVERLAP)}, {repeats} interleaved repeats")
    print(f"{'eval.overlap':<14} {'wall s':>8} {'cpu s':>8} {'load 1 min':>11}")
    times: dict[bool, list[Timing]] = {False: [], True: []}
    for _ in range(repeats):
        for on in (False, True):
            load_1 = os.getloadavg()[0]
            times[on].append(timed(go(on)))
            print(f"{on!s:<14} {times[on][-1].wall:8.2f} {times[on][-1].cpu:8.2f} {load_1:11.2f}", flush=True)
    off, overlapped = _median(times[False]), _median(times[True])
    print(f"{'median off':<14} {off.wall:8.2f} {off.cpu:8.2f}")
    print(f"{'median on':<14} {overlapped.wall:8.2f} {overlapped.cpu:8.2f}")
    ratio = f"wall {overlapped.wall / off.wall:.2f}, cpu {overlapped.cpu / off.cpu:.2f}"
    print(f"on / off: {ratio}   (load {os.getloadavg()})")


def _cpu_of(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes, and their children that have ended (the zygote
    the server forks its workers from), have used so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def to_round_0(overrides: list[str]) -> Timing:
    """`python -m emulator` until its run.json says running; CPU of the server and its workers by then."""
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / "s" / "run.json"
        cmd = [sys.executable, "-m", "emulator", *overrides, "budget.rounds=1", "output.progress=false"]
        t = time.perf_counter()
        proc = subprocess.Popen([*cmd, f"output.dir={tmp}", "output.name=s"], stdout=subprocess.DEVNULL)
        while True:
            try:
                m = json.loads(manifest.read_text())
            except (OSError, ValueError):
                m = {}
            if m.get("status") == "running":
                wall = time.perf_counter() - t
                cpu = _cpu_of([proc.pid, *m["workers"].values()])
                break
            if proc.poll() is not None:
                raise RuntimeError(f"{' '.join(cmd)} ended (exit {proc.returncode}) before round 0")
            time.sleep(0.005)
        if proc.wait() != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}")
    return Timing(wall, cpu)


def worker_setup(overrides: list[str]) -> Timing:
    """One worker's imports and setup for the scenario, alone in a fresh process."""
    scenario = json.dumps(to_dict(load(None, overrides)))
    return timed(lambda: subprocess.run([sys.executable, "-c", WORKER_SETUP, scenario], check=True))


def startup(repeats: int) -> None:
    print(f"\nstartup: command to round 0 vs one worker's own imports + setup, median of {repeats} interleaved")
    print(f"{'':<36} {'to round 0: wall s':>19} {'cpu s':>7} {'worker alone: wall s':>21} {'cpu s':>7} {'ratio':>6}")
    for name, overrides in STARTUP.items():
        command: list[Timing] = []
        alone: list[Timing] = []
        for _ in range(repeats):
            command.append(to_round_0(overrides))
            alone.append(worker_setup(overrides))
        cmd, own = _median(command), _median(alone)
        print(
            f"{name:<36} {cmd.wall:19.2f} {cmd.cpu:7.2f} {own.wall:21.2f} {own.cpu:7.2f} {cmd.wall / own.wall:6.2f}"
            f"   (load {' '.join(f'{v:.2f}' for v in os.getloadavg())})",
            flush=True,
        )


def wire(repeats: int, messages: int = 5) -> None:
    """A 10 MB model from a DEALER to a ROUTER over ipc:// in this process (ZeroMQ's I/O thread moves
    it), `messages` per timing, interleaved: raw ZeroMQ (one frame, no copies), the protocol (encode,
    send, receive, decode with every check) and protocol 1's framing for comparison (the tensor a bin
    field of the one msgpack map, sent and received with copies, as version 1 was)."""
    a = np.random.default_rng(0).standard_normal(10 * 2**20 // 4).astype(np.float32)
    metrics = {"steps": 1, "train_loss": 0.0, "update_norm": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        ctx = zmq.Context()
        rx, tx = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
        rx.bind(f"ipc://{tmp}/wire")
        tx.connect(f"ipc://{tmp}/wire")

        def raw() -> np.ndarray:
            tx.send(a.data, copy=False)
            _, frame = rx.recv_multipart(copy=False)
            return np.frombuffer(frame.buffer, np.float32)

        def tensor_frames() -> np.ndarray:
            tx.send_multipart(
                protocol.encode("update", round=0, client=0, model={"w": a}, metrics=metrics).frames, copy=False
            )
            _, *frames = rx.recv_multipart(copy=False)
            model: dict[str, np.ndarray] = protocol.decode([f.buffer for f in frames], 2 * a.nbytes)["model"]
            return model["w"]

        def one_map() -> np.ndarray:
            header = {"v": 1, "type": "update", "round": 0, "client": 0, "metrics": metrics}
            tx.send(
                msgpack.packb({**header, "model": [["w", "float32", list(a.shape), a.tobytes()]]}, use_bin_type=True)
            )
            _, frame = rx.recv_multipart()
            back = np.frombuffer(msgpack.unpackb(frame, raw=False)["model"][0][3], np.float32)
            assert np.isfinite(back).all()
            return back

        contenders = {
            "raw ZeroMQ, one frame": raw,
            "protocol 2, tensor frames": tensor_frames,
            "protocol 1 framing": one_map,
        }
        times: dict[str, list[Timing]] = {k: [] for k in contenders}
        try:
            for fn in contenders.values():  # warm-up and correctness, untimed
                assert np.array_equal(fn(), a)
            load_1 = os.getloadavg()[0]
            for _ in range(repeats):
                for k, fn in contenders.items():
                    times[k].append(timed(lambda fn=fn: [fn() for _ in range(messages)]))
        finally:
            rx.close(linger=0)
            tx.close(linger=0)
            ctx.term()
    print(
        f"\nwire: a {a.nbytes / 2**20:.0f} MiB model, DEALER -> ROUTER over ipc:// in one process, "
        f"{messages} messages per timing, median of {repeats} interleaved "
        f"(load {load_1:.2f} -> {os.getloadavg()[0]:.2f})"
    )
    print(f"{'':<28} {'GB/s':>7} {'wall ms/msg':>12} {'cpu ms/msg':>11} {'x raw wall':>11}")
    base = _median(times["raw ZeroMQ, one frame"]).wall
    for k, ts in times.items():
        wall, cpu = astuple(_median(ts))
        print(
            f"{k:<28} {messages * a.nbytes / wall / 1e9:7.2f} {1e3 * wall / messages:12.2f} "
            f"{1e3 * cpu / messages:11.2f} {wall / base:11.2f}"
        )


def scale(counts: list[int], repeats: int) -> None:
    """Each count run with 1 round and with 7, interleaved `repeats` times: the difference of their
    medians is 6 rounds without the start-up (one pair of runs alone left 0.2-0.4 s a round at 1,000
    clients); then `python -m analysis` of a 7-round run (tables, plots, report)."""
    print(f"\nscale: synthetic, logreg, 10 % of the clients a round, 2 workers (load {os.getloadavg()[0]:.2f})")
    print(
        f"{'clients':>8} {'1 round: wall s':>16} {'cpu s':>7} {'7 rounds: wall s':>17} {'cpu s':>7} "
        f"{'cpu s/round (rounds only)':>26} {'peak RSS MB: server':>20} {'largest child':>15} {'total (<=)':>11} "
        f"{'analysis: wall s':>17} {'cpu s':>7}"
    )
    for n in counts:
        overrides = [
            f"clients.n={n}",
            f"clients.per_round={max(1, n // 10)}",
            "clients.select=uniform",
            "model.name=logreg",
            "dp.tau=5",
        ]
        with tempfile.TemporaryDirectory() as out:
            ones, sevens = [], []
            for i in range(repeats):
                ones.append(timed(emulator([*overrides, "budget.rounds=1"], 2)))
                kept = out if i == repeats - 1 else ""  # the last, for the analysis
                sevens.append(timed(emulator([*overrides, "budget.rounds=7"], 2, kept)))
            one, seven = _median(ones), _median(sevens)
            # ru_maxrss: the peak so far (counts run in increasing order, so the peak is this count's)
            server = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            total = server + 3 * worker  # 2 workers and the evaluator, each at most the largest child's peak
            command = [sys.executable, "-m", "analysis", f"{out}/run", "--out", f"{out}/analysis"]
            analysis = timed(lambda command=command: subprocess.run(command, check=True, stdout=subprocess.DEVNULL))
        print(
            f"{n:8d} {one.wall:16.2f} {one.cpu:7.2f} {seven.wall:17.2f} {seven.cpu:7.2f} "
            f"{(seven.cpu - one.cpu) / 6:26.2f} {server:20.0f} {worker:15.0f} {total:11.0f} "
            f"{analysis.wall:17.2f} {analysis.cpu:7.2f}",
            flush=True,
        )


# One step a client: the server's per-round work does not depend on tau, and the workers' training is not
# what this line measures. data.max_test caps the synthetic test set (a million clients' test rows would
# be about 10 GB in the evaluator), the same at both counts.
MILLION = [
    "clients.per_round=1000",
    "clients.select=uniform",
    "model.name=logreg",
    "dp.tau=1",
    "budget.rounds=10",
    "data.max_test=10000",
]


# The energy model on (emulator.energy): a compute power drawn per client, so that its n values are held.
ENERGY = [
    "energy.radio=lte",
    "energy.compute_w.kind=lognormal",
    "energy.compute_w.median=2",
    "energy.compute_w.sigma=0.3",
]


def million(counts: list[int], repeats: int) -> None:
    """Each count's command `repeats` times, without and with the energy model, interleaved; medians of the
    tree's peak RSS and of the server's CPU a round, against the first count's and the energy model's against
    the same count without it."""
    from bench.rss_tree import peak_tree_rss

    print(f"\nmillion: {' '.join(MILLION)}, 2 workers, median of {repeats} (load {os.getloadavg()[0]:.2f})")
    print(
        f"{'registered':>10} {'energy':>6} {'peak tree RSS MB (<=)':>22} {'server own MB':>14} "
        f"{'server cpu s/round':>19} {'x first':>8} {'RSS x off':>9} {'cpu x off':>9}"
    )
    first = math.nan
    for n in counts:
        runs: dict[str, list] = {"off": [], "on": []}
        for _ in range(repeats):
            runs["off"].append(peak_tree_rss([f"clients.n={n}", *MILLION, "workers=2"]))
            runs["on"].append(peak_tree_rss([f"clients.n={n}", *MILLION, *ENERGY, "workers=2"]))
        off: dict[str, float] = {}
        for energy, peaks in runs.items():
            per_round = statistics.median(p.rounds_cpu / p.rounds for p in peaks)
            first = per_round if math.isnan(first) else first
            tree, server = statistics.median(p.total for p in peaks), statistics.median(p.server for p in peaks)
            off = off or {"tree": tree, "cpu": per_round}
            print(
                f"{n:10d} {energy:>6} {tree:22.0f} {server:14.0f} {per_round:19.3f} {per_round / first:8.2f} "
                f"{tree / off['tree']:9.2f} {per_round / off['cpu']:9.2f}   (load {os.getloadavg()[0]:.2f})",
                flush=True,
            )


# scale10m: each case's overrides beside MILLION's (FedCS asks a fixed number of candidates: a share of
# ten million would be a million asked a round; its trace gives every hundredth client a daily window)
SCALE10M = {
    "(a) uniform, always": [],
    "(b) oort, diurnal": ["policy=oort", "availability.model=diurnal", "availability.phase_spread_s=86400"],
    "(c) fedcs, csv trace": ["policy=fedcs", "fedcs.request_clients=2000", "availability.model=csv"],
    "(d) fu_tuning": ["policy=fu_tuning"],
}
TRACED_EVERY, TRACE_DAY_S = 100, 86400.0


def availability_trace(path: Path, n: int) -> Path:
    """Every TRACED_EVERY-th of n clients available 8 hours a day from its own hour (repeat_s a day)."""
    ids = np.arange(0, n, TRACED_EVERY)
    start = (ids // TRACED_EVERY % 16) * 3600.0
    with path.open("w") as f:
        f.write("client,t_start,t_end\n")
        np.savetxt(f, np.column_stack([ids, start, start + 8 * 3600.0]), fmt=["%d", "%.1f", "%.1f"], delimiter=",")
    return path


def scale10m(counts: list[int], repeats: int) -> None:
    """(a)-(d) at each count `repeats` times: medians of the tree's peak RSS, the server's CPU a round (and
    against the first count's) and the start-up seconds."""
    from bench.rss_tree import peak_tree_rss

    print(f"\nscale10m: {' '.join(MILLION)}, 2 workers, median of {repeats} (load {os.getloadavg()[0]:.2f})")
    print(
        f"{'case':24} {'registered':>10} {'peak tree RSS MB (<=)':>22} {'server cpu s/round':>19} {'x first':>8} "
        f"{'start-up s':>11}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for case, extra in SCALE10M.items():
            first = math.nan
            for n in counts:
                args = [f"clients.n={n}", *MILLION, *extra, "workers=2"]
                if "availability.model=csv" in extra:
                    trace = availability_trace(Path(tmp) / f"available-{n}.csv", n)
                    args += [f"availability.file={trace}", f"availability.repeat_s={TRACE_DAY_S}"]
                peaks = [peak_tree_rss(args) for _ in range(repeats)]
                per_round = statistics.median(p.rounds_cpu / p.rounds for p in peaks)
                first = per_round if math.isnan(first) else first
                print(
                    f"{case:24} {n:10d} {statistics.median(p.total for p in peaks):22.0f} {per_round:19.3f} "
                    f"{per_round / first:8.2f} {statistics.median(p.startup for p in peaks):11.1f}"
                    f"   (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="w1,w2,dp,wire,scale,million,overlap,startup,accountants")
    ap.add_argument("--scale", default="100,1000,10000", help="client counts of the scaling table")
    ap.add_argument("--bundles-w1", default="2,5,10", help="train.bundle values W1 also runs with ('' = none)")
    ap.add_argument("--bundles-w2", default="10,25,50,100", help="train.bundle values W2 also runs with ('' = none)")
    ap.add_argument("--million", default="10000,1000000", help="registered clients of the million line")
    ap.add_argument("--scale10m", default="10000,10000000", help="registered clients of the scale10m lines")
    args = ap.parse_args(argv)
    bundles_w1 = [int(k) for k in args.bundles_w1.split(",") if k]
    bundles_w2 = [int(k) for k in args.bundles_w2.split(",") if k]
    only = set(args.only.split(","))
    print(f"{os.cpu_count()} CPUs, torch {torch.__version__}, load {os.getloadavg()}")
    if "scale" in only:  # first: its memory columns are this process's peaks so far (W1's would mask them)
        scale([int(n) for n in args.scale.split(",")], args.repeats)
    if "million" in only:
        million([int(n) for n in args.million.split(",")], args.repeats)
    if "scale10m" in only:
        scale10m([int(n) for n in args.scale10m.split(",")], args.repeats)
    if "w1" in only:
        side_by_side(
            "W1: FashionMNIST, 10 clients, cnn_fmnist, 20 steps x 20 rounds",
            bundled(
                {
                    "emulator, 2 workers": emulator(W1, 2),
                    "2 workers, eval at end": emulator(W1_EVAL_AT_END, 2),
                    "emulator, 1 worker": emulator(W1, 1),
                    "floor (one process)": floor(W1),
                    "command, 2 workers": emulator_command(W1, 2),
                    COMMAND_EVAL_AT_END: emulator_command(W1_EVAL_AT_END, 2),
                    "floor, fresh process": floor_process(W1),
                    PAIR: floors_at_once(W1),
                },
                W1,
                bundles_w1,
            ),
            args.repeats,
        )
    if "w2" in only:
        side_by_side(
            "W2: 1,000 synthetic clients, 100 a round, logreg, 5 steps x 10 rounds",
            bundled(
                {
                    "emulator, 2 workers": emulator(W2, 2),
                    "floor (one process)": floor(W2),
                    "command, 2 workers": emulator_command(W2, 2),
                    COMMAND_EVAL_AT_END: emulator_command(W2_EVAL_AT_END, 2),
                    "floor, fresh process": floor_process(W2),
                    PAIR: floors_at_once(W2),
                },
                W2,
                bundles_w2,
                W2_EVAL_AT_END,
            ),
            args.repeats,
        )
        steady_state("W2 steady state: rounds after the first", W2, bundles_w2, args.repeats)
    if "dp" in only:
        from bench import dp_step

        dp_step.main(["--models", "cnn_fmnist", "--repeats", str(args.repeats)])
    if "wire" in only:
        wire(max(3, args.repeats))
    if "overlap" in only:
        overlap(args.repeats)
    if "startup" in only:
        startup(args.repeats)
    if "accountants" in only:
        from bench import accountants

        accountants.main(["--repeats", str(args.repeats), "--histories", ",".join(map(str, accountants.HISTORY_SIZES))])
    return 0


if __name__ == "__main__":
    sys.exit(main())

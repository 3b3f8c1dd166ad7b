"""python -m bench.reproduce.authors_run --authors PATH --tau 2 --clip C [--rounds 158] [--seed 0] --out DIR

Runs the ALI-DPFL authors' own DPFL server (fixed tau) on FashionMNIST in the setting of
`paper/ali_dpfl_table2_fmnist.yaml`, from a checkout of github.com/XinpengLing/ALI-DPFL (PATH
holds `system/` and `dataset/`; nothing of it is copied here):
  1. writes their client files, PATH/dataset/fmnist/{train,test}/{k}.npz, test/server_testset.npz
     and config.json, from our data pipeline (`load_federated` with the scenario's data section:
     data.partition_seed = 1 draws the files their generator draws with np.random.seed(1));
  2. runs their `system/main_dpfl.py` (cwd PATH/system, the flags in `their_flags`) for --rounds:
     they play rounds + 1 aggregations and evaluate before each, so the accuracy after 0..rounds
     aggregations is printed. The accuracy is parsed from their stdout, not from their results
     file: their `save_results` then opens a Windows path and crashes, which is recorded, not fatal;
  3. writes DIR/authors_tau{tau}_C{clip}_seed{seed}.csv (round = aggregations so far, test
     accuracy as their rs_test_acc: the union of the clients' test shares) as the run goes, their
     full output to the .log beside it, and prints the best and final accuracy and the seconds a
     round.
Their only seed is `torch.manual_seed(0)` at the top of main_dpfl.py; --seed replaces that 0. It
sets the model's initial weights, the Poisson batches, the DP noise and the evaluation loaders'
shuffles (all one torch stream); the client files do not move with it, and numpy and Python's
`random` stay unseeded there (they pick the clients, all of which join, and the server-side 20 %
test sample, which rs_test_acc does not use).
Their code needs h5py, ujson, scikit-learn, opacus, opt_einsum and calmsize installed (not
dependencies of this project); main_dpfl.py imports torchvision without using it, so an empty
module stands in when torchvision is missing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from emulator.config import load
from nodes.data import load_federated
from nodes.data.images import ImageData

if TYPE_CHECKING:
    from emulator.config import ServerScenario

SCENARIO = "paper/ali_dpfl_table2_fmnist.yaml"
DATASET = "fmnist"  # their name: the folder under dataset/ and -data ("mnist" in it picks FedAvgCNN dim 1024)

# run by `python -c` in PATH/system: their main_dpfl.py as its own __main__, with our seed and thread count
LAUNCHER = """
import runpy, sys, types
import torch
seed, threads = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
manual_seed = torch.manual_seed
torch.manual_seed = lambda _: manual_seed(seed)
try:
    import torchvision
except ImportError:
    sys.modules["torchvision"] = types.ModuleType("torchvision")
sys.argv = ["main_dpfl.py", *sys.argv[3:]]
runpy.run_path("main_dpfl.py", run_name="__main__")
"""

ROUND = re.compile(r"^-+Round number: (\d+)-+$")
ACCURACY = re.compile(r"^Averaged Test Accurancy: (\d+\.\d+)$")  # their spelling, printed by Server.evaluate
TIME_COST = re.compile(r"^-+ time cost -+ (\d+(?:\.\d+)?(?:e-?\d+)?)$")


@dataclass
class TheirLog:
    """What their stdout says, line by line: rs_test_acc by round and each round's `time cost`."""

    accuracy: list[tuple[int, float]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    round: int | None = None

    def feed(self, line: str) -> tuple[int, float] | None:
        """The (round, accuracy) this line completes, else None."""
        line = line.strip()
        if m := ROUND.match(line):
            self.round = int(m.group(1))
        elif (m := ACCURACY.match(line)) and self.round is not None:
            self.accuracy.append((self.round, float(m.group(1))))
            return self.accuracy[-1]
        elif m := TIME_COST.match(line):
            self.seconds.append(float(m.group(1)))
        return None


def save_npz(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """Their file: one pickled dict {'x', 'y'} under 'data', written whole (a running reader never sees half)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez_compressed(f, data=np.array({"x": x, "y": y}, dtype=object))
    os.replace(tmp, path)


def write_client_files(data: ImageData, root: Path, beta: float) -> None:
    """root/{train,test}/{k}.npz, test/server_testset.npz and config.json, as their generator
    (dataset/generate_fmnist.py with dataset/utils/dataset_utils.py) writes them."""
    (root / "train").mkdir(parents=True, exist_ok=True)
    (root / "test").mkdir(exist_ok=True)
    statistic = []
    for k in range(data.n_clients):
        xtr, ytr = data.client(k)
        xte, yte = data.client_test(k)
        save_npz(root / "train" / f"{k}.npz", xtr, ytr)
        save_npz(root / "test" / f"{k}.npz", xte, yte)
        labels, counts = np.unique(np.concatenate([ytr, yte]), return_counts=True)
        statistic.append([[int(c), int(n)] for c, n in zip(labels, counts)])
    x, y = data.test()
    # float64: their generate_server_testset rebuilds the union from Python lists
    save_npz(root / "test" / "server_testset.npz", x.astype(np.float64), y)
    config = {
        "num_clients": data.n_clients,
        "num_classes": data.num_classes,
        "non_iid": True,
        "balance": False,
        "partition": "dir",
        "Size of samples for labels in clients": statistic,
        "alpha": beta,
        "batch_size": 10,  # dataset_utils.batch_size, which config.json records; unused by "dir"
    }
    (root / "config.json").write_text(json.dumps(config, separators=(",", ":")))


def their_flags(tau: int, clip: float, rounds: int, cfg: ServerScenario, num_classes: int) -> list[str]:
    """main_dpfl.py's argparse flags for the scenario's setting (-dp defaults to True: DP-SGD on)."""
    dp = cfg.dp
    return [
        *("-data", DATASET, "-m", "cnn", "-nb", str(num_classes)),
        *("-li", str(tau), "-dpn", repr(clip), "-dps", repr(dp.sigma), "-lr", repr(dp.lr)),
        *("-bsr", repr(dp.q), "-lbs", str(int(dp.batch_divisor)), "-ls", "1"),
        *("-nc", str(cfg.clients.n), "-jr", "1.0", "-gr", str(rounds), "-eg", "1", "-t", "1", "-dev", "cpu"),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", required=True, type=Path, help="checkout of XinpengLing/ALI-DPFL")
    ap.add_argument("--tau", required=True, type=int, help="local iterations a round (-li)")
    ap.add_argument("--clip", required=True, type=float, help="clipping norm C (-dpn)")
    ap.add_argument("--rounds", type=int, default=158, help="-gr: they aggregate rounds + 1 times (R_s = 158)")
    ap.add_argument("--seed", type=int, default=0, help="replaces their torch.manual_seed(0)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of their process")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    system = args.authors.resolve() / "system"
    if not (system / "main_dpfl.py").is_file():
        raise SystemExit(f"--authors {args.authors}: no system/main_dpfl.py (expected a checkout of ALI-DPFL)")

    cfg = load(SCENARIO, [])
    data = load_federated(cfg.data, cfg.clients.n, cfg.seed)
    assert isinstance(data, ImageData)  # the scenario's FashionMNIST
    write_client_files(data, args.authors.resolve() / "dataset" / DATASET, cfg.data.dirichlet_beta)
    print(f"client files: train {data.sizes}, test {[len(p) for p in data.test_parts]}", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"authors_tau{args.tau}_C{args.clip:g}_seed{args.seed}"
    flags = their_flags(args.tau, args.clip, args.rounds, cfg, data.num_classes)
    cmd = [sys.executable, "-u", "-c", LAUNCHER, str(args.seed), str(args.threads), *flags]
    # PATH itself too: serverdpfl.py imports `system.flcore...`
    paths = [str(system.parent), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    print(f"their run: (cd {system} && python main_dpfl.py {' '.join(flags)}), seed {args.seed}", flush=True)
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    log, t0 = TheirLog(), time.perf_counter()
    with open(f"{stem}.csv", "w", newline="") as fcsv, open(f"{stem}.log", "w") as flog:
        out = csv.writer(fcsv)
        out.writerow(["round", "test_acc"])
        proc = subprocess.Popen(cmd, cwd=system, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        last = ""
        for line in proc.stdout:
            flog.write(line)
            last = line.strip() or last
            if got := log.feed(line):
                out.writerow(got)
                fcsv.flush()
                print(f"round {got[0]:4d}  test acc {got[1]:.4f}", flush=True)
        rc = proc.wait()
    wall = time.perf_counter() - t0
    print(f"load average at end: {os.getloadavg()[0]:.1f}; their process exited {rc}: {last}")
    if len(log.accuracy) != args.rounds + 1:
        print(f"error: {len(log.accuracy)} of {args.rounds + 1} evaluations in their output (see {stem}.log)")
        return 1
    best = max(log.accuracy, key=lambda r: r[1])
    print(f"best {100 * best[1]:.2f} % (after {best[0]} aggregations), final {100 * log.accuracy[-1][1]:.2f} %")
    print(
        f"seconds a round: {np.mean(log.seconds):.1f} (their time cost, {len(log.seconds)} rounds), "
        f"{wall / len(log.seconds):.1f} wall with evaluation and start-up; {stem}.csv"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The server's evaluation and the trainer's full-data gradient, per batch size (dp.batch_eval).

    python -m bench.eval_batch [--models cnn_fmnist,cnn_fedavg,mlp,logreg] [--batches 64,128,256,512,1024,4096]
                               [--samples 10000] [--repeats 3]

One thread, as the server's evaluation (emulator/evaluation.py) and a worker run. For each model,
`nodes.trainer.evaluate` and `nodes.trainer.full_gradient` (ALI-DPFL's gradient estimate of mu) over
`--samples` random inputs are timed at each batch size, interleaved (every batch
size once, then again) `--repeats` times; the table gives medians, wall and CPU seconds, and the
ratio to the batch size 1024 (the default before 256).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from nodes.model_catalog import designed_inputs
from nodes.models import build_model, loss_fn
from nodes.schema import ModelConfig
from nodes.trainer import evaluate, full_gradient


def _timed(fn, *args) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="cnn_fmnist,cnn_fedavg,mlp,logreg")
    ap.add_argument("--batches", default="64,128,256,512,1024,4096")
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; one thread; {args.samples} samples")
    print("| model | batch | eval wall s | eval CPU s | eval ÷ 1024 | grad wall s | grad CPU s | grad ÷ 1024 |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        shape = (designed_inputs(name) or ((1, 28, 28),))[0]
        model = build_model(ModelConfig(name=name), shape, 10, seed=0)
        loss = loss_fn(name)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn((args.samples, *shape), generator=gen)
        y = torch.randint(0, 10, (args.samples,), generator=gen)
        if x.dim() == 4:  # as the trainer places its data (Trainer._placed)
            x = x.contiguous(memory_format=torch.channels_last)
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        times: dict[int, list[tuple[float, float, float, float]]] = {b: [] for b in batches}
        for _ in range(args.repeats):
            for b in batches:
                ew, ec = _timed(evaluate, model, x, y, b, loss)
                gw, gc = _timed(full_gradient, model, x, y, b, loss)
                times[b].append((ew, ec, gw, gc))
        med = {b: [statistics.median(t[i] for t in times[b]) for i in range(4)] for b in batches}
        ref = med.get(1024)
        for b in batches:
            ew, ec, gw, gc = med[b]
            ratio = (f"{ew / ref[0]:.2f}", f"{gw / ref[2]:.2f}") if ref else ("", "")
            print(f"| {name} | {b} | {ew:.3f} | {ec:.3f} | {ratio[0]} | {gw:.3f} | {gc:.3f} | {ratio[1]} |")


if __name__ == "__main__":
    main()

"""The server's evaluation and the trainer's full-data gradient, per batch size (dp.batch_eval).

    python -m bench.eval_batch [--models cnn_fmnist,cnn_fedavg,mlp,logreg] [--batches 32,64,128,256,1024]
                               [--samples 10000] [--repeats 3] [--concurrent 1]

One thread, as the evaluator process (nodes/transport/evaluator.py) and a worker run. For each model,
`nodes.training.trainer.evaluate` and `nodes.training.trainer.full_gradient` (ALI-DPFL's gradient estimate of mu) over
`--samples` random inputs are timed at each batch size, interleaved (every batch
size once, then again) `--repeats` times; the table gives medians, wall and CPU seconds, and the
ratio to the batch size 1024 (the default before 256, which came before 64).
`--concurrent N` times N copies at once, each in a process of its own, as the evaluators of
`bench.reproduce --jobs N` run side by side and share the CPU's last-level cache; the medians are
then over all N x repeats timings.
`--pool` times instead the forward pass over the samples, batch by batch, of the model as built
(torch's max_pool2d) and of its inference copy (nodes.training.models.for_inference: SlicedMaxPool2d),
interleaved, with the ratio: the measurement behind the evaluation's inference copy.
`--loss` times instead the summed loss over the model's outputs, batch by batch, as torch's
cross_entropy (log_softmax) computes it and as the evaluation does (nodes.training.models.evaluation_sum:
logsumexp less the target's output), interleaved, with the ratio: the measurement behind the latter.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import torch
import torch.nn.functional as F

from nodes.contracts.schema import ModelConfig
from nodes.training.malloc import keep_freed_memory
from nodes.training.model_catalog import designed_inputs
from nodes.training.models import build_model, cross_entropy, evaluation_sum, for_inference, loss_fn
from nodes.training.trainer import evaluate, full_gradient


def _timed(fn, *args) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def _inputs(name: str, samples: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.set_num_threads(1)
    keep_freed_memory()  # as the evaluator process and the workers run (nodes/training/malloc.py)
    shape = (designed_inputs(name) or ((1, 28, 28),))[0]
    model = build_model(ModelConfig(name=name), shape, 10, seed=0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((samples, *shape), generator=gen)
    y = torch.randint(0, 10, (samples,), generator=gen)
    if x.dim() == 4:  # as the trainer places its data (Trainer._placed)
        x = x.contiguous(memory_format=torch.channels_last)
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model, x, y


def _interleaved(
    batches: list[int], repeats: int, first: Callable[[int], object], second: Callable[[int], object]
) -> dict[int, list[tuple[float, ...]]]:
    """(first's wall, CPU, second's wall, CPU) seconds at each batch size: every batch size once,
    then again, `repeats` times."""
    times: dict[int, list[tuple[float, ...]]] = {b: [] for b in batches}
    for _ in range(repeats):
        for b in batches:
            times[b].append((*_timed(first, b), *_timed(second, b)))
    return times


def _series(name: str, samples: int, batches: list[int], repeats: int) -> dict[int, list[tuple[float, ...]]]:
    """The evaluation's and the full-data gradient's seconds at each batch size, in this process."""
    model, x, y = _inputs(name, samples)
    loss = loss_fn(name)
    return _interleaved(
        batches,
        repeats,
        lambda b: evaluate(model, x, y, b, loss),
        lambda b: full_gradient(model, x, y, b, loss),
    )


def _pool_series(name: str, samples: int, batches: list[int], repeats: int) -> dict[int, list[tuple[float, ...]]]:
    """The forward passes' seconds at each batch size, with torch's pool and with the sliced one."""
    model, x, y = _inputs(name, samples)

    @torch.no_grad()
    def forward(m: torch.nn.Module, b: int) -> None:
        for i in range(0, len(y), b):
            m(x[i : i + b])

    built, fast = model.eval(), for_inference(model)
    return _interleaved(batches, repeats, lambda b: forward(built, b), lambda b: forward(fast, b))


def _loss_series(name: str, samples: int, batches: list[int], repeats: int) -> dict[int, list[tuple[float, ...]]]:
    """The summed loss's seconds at each batch size, torch's cross_entropy and the evaluation's."""
    model, x, y = _inputs(name, samples)
    inference = for_inference(model)
    with torch.no_grad():
        out = torch.cat([inference(x[i : i + 1024]) for i in range(0, len(y), 1024)])

    @torch.no_grad()
    def summed(loss: Callable[..., torch.Tensor], b: int) -> None:
        for i in range(0, len(y), b):
            loss(out[i : i + b], y[i : i + b])

    torchs, ours = partial(F.cross_entropy, reduction="sum"), partial(evaluation_sum, cross_entropy)
    for loss in (torchs, ours):  # each one's first call, untimed: its kernels' lazy set-up
        summed(loss, len(y))
    return _interleaved(batches, repeats, lambda b: summed(torchs, b), lambda b: summed(ours, b))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="cnn_fmnist,cnn_fedavg,mlp,logreg")
    ap.add_argument("--batches", default="32,64,128,256,1024")
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrent", type=int, default=1, help="copies timed at once, each in its own process")
    ap.add_argument("--pool", action="store_true", help="the forward pass with torch's max-pool against the sliced one")
    ap.add_argument(
        "--loss", action="store_true", help="torch's cross_entropy against nodes.training.models.evaluation_sum"
    )
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    n = max(1, args.concurrent)
    load = os.getloadavg()
    print(f"load {load[0]:.2f} {load[1]:.2f}; one thread; {args.samples} samples; {n} at once")
    series = _pool_series if args.pool else _loss_series if args.loss else _series
    pair = ("max_pool2d", "sliced") if args.pool else ("torch", "logsumexp") if args.loss else None
    columns = (
        [f"{pair[0]} wall s", f"{pair[0]} CPU s", f"{pair[1]} wall s", f"{pair[1]} CPU s", f"{pair[1]} ÷ {pair[0]}"]
        if pair
        else ["eval wall s", "eval CPU s", "eval ÷ 1024", "grad wall s", "grad CPU s", "grad ÷ 1024"]
    )
    print("| model | batch | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 2) + "|")
    with ProcessPoolExecutor(n) as pool:  # n copies of the whole schedule, started together
        for name in args.models.split(","):
            copies = list(pool.map(series, *zip(*[(name, args.samples, batches, args.repeats)] * n)))
            med = {b: [statistics.median(t[i] for c in copies for t in c[b]) for i in range(4)] for b in batches}
            ref = med.get(1024)
            for b in batches:
                w0, c0, w1, c1 = med[b]
                if pair:
                    print(f"| {name} | {b} | {w0:.4f} | {c0:.4f} | {w1:.4f} | {c1:.4f} | {w1 / w0:.2f} |")
                    continue
                ratio = (f"{w0 / ref[0]:.2f}", f"{w1 / ref[2]:.2f}") if ref else ("", "")
                print(f"| {name} | {b} | {w0:.3f} | {c0:.3f} | {ratio[0]} | {w1:.3f} | {c1:.3f} | {ratio[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

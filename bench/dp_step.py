"""One DP-SGD step against one plain SGD step of the same model, per per-sample-gradient path.

    python -m bench.dp_step [--models cnn_fmnist,cnn_fedavg,mlp_talaei] [--batch 64] [--repeats 5] [--steps 20]
    python -m bench.dp_step --windows [--models cnn_fmnist,cnn_fedavg,cnn_cifar] [--device cuda]

`--windows` times instead, for each conv layer of the models, the three ways the bk path can take
its per-sample gradients (sample windows gathered by a strided copy or an index_select, then one
bmm; or a convolution with one group per sample), the measurement behind nodes.training.dp_step.CONV_RULES
(on `--device`: the CPU's rule was measured so, the GPU's awaits it).

Single-threaded and with a worker's malloc thresholds (nodes/training/malloc.py), as a worker trains. The
steps are timed interleaved (A, B, C, A, B, C, ...) `--repeats` times, each over `--steps` steps
after a warm-up; the table gives the median milliseconds per step, wall and CPU, and the ratios
to the plain NCHW step and to the plain channels_last step (the fastest plain step). Besides the trainer's
paths (nodes/training/dp_step.py: hooks, bk) it times two it does not ship, measured slower: Opacus's
ghost clipping (two backward passes) and torch.func's vmap(grad). Opacus's conv per-sample
gradients are wrong on channels_last inputs (1.6's unfold2d), so hooks and ghost run NCHW only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import torch
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.optimizers import DPOptimizerFastGradientClipping
from torch.func import functional_call, grad_and_value, vmap

from nodes.training import dp_step
from nodes.training.determinism import set_up_torch
from nodes.training.dp_step import CLIP_EPS, SGD, PrivateStep
from nodes.training.malloc import keep_freed_memory
from nodes.training.models import build_model, loss_fn
from nodes.training.trainer import resolve_device

warnings.filterwarnings("ignore")
SHAPES = {"cnn_cifar": (3, 32, 32)}
LR, SIGMA, CLIP = 0.1, 1.0, 1.0


def plain_step(model, loss, x, y):
    """The trainer's plain step (its own SGD, which equals torch.optim.SGD's step)."""
    opt = SGD(model.parameters(), LR)

    def step():
        opt.zero_grad(set_to_none=True)
        (loss(model(x), y, reduction="sum") / len(y)).backward()
        opt.step()

    return step


def trainer_step(path: str, model, loss, x, y):
    """The trainer's private step (nodes.training.trainer.Trainer.train, without its bookkeeping)."""
    private = PrivateStep(model, path)
    opt = private.optimizer(LR, SIGMA, CLIP, float(len(y)), torch.Generator().manual_seed(0))

    def step():
        opt.zero_grad(set_to_none=True)
        private.backward(loss(private.forward(x), y, reduction="none"), CLIP)
        opt.step()

    return step


def ghost_step(model, loss, x, y):
    gsm = GradSampleModuleFastGradientClipping(model, loss_reduction="sum", max_grad_norm=CLIP)
    opt = DPOptimizerFastGradientClipping(
        torch.optim.SGD(model.parameters(), lr=LR),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        expected_batch_size=len(y),
        loss_reduction="mean",
        generator=torch.Generator().manual_seed(0),
    )

    def step():
        opt.zero_grad(set_to_none=True)
        per_sample = loss(gsm(x), y, reduction="none")
        per_sample.sum().backward(retain_graph=True)  # pass 1: per-sample norms
        factors = gsm.get_clipping_coef()
        opt.zero_grad(set_to_none=True)
        gsm.disable_hooks()
        (factors * per_sample).sum().backward()  # pass 2: the clipped sum
        gsm.enable_hooks()
        opt.step()

    return step


def vmap_step(model, loss, x, y):
    names, params = zip(*model.named_parameters())
    gen = torch.Generator().manual_seed(0)

    def sample_loss(weights, xi, yi):
        return loss(
            functional_call(model, dict(zip(names, weights)), (xi.unsqueeze(0),)), yi.unsqueeze(0), reduction="sum"
        )

    per_sample = vmap(grad_and_value(sample_loss), in_dims=(None, 0, 0))

    def step():
        grads, _ = per_sample([p.detach() for p in params], x, y)
        norms = torch.stack([g.flatten(1).norm(2, dim=1) for g in grads]).norm(2, dim=0)
        factors = (CLIP / (norms + CLIP_EPS)).clamp(max=1.0)
        with torch.no_grad():
            for p, g in zip(params, grads):
                summed = torch.einsum("i,i...->...", factors, g)
                p.sub_((summed + torch.normal(0, SIGMA * CLIP, summed.shape, generator=gen)) / len(y), alpha=LR)

    return step


# conv_per_sample_grads's three ways, each forced by a rule (nodes.training.dp_step.ConvRule) for every device type
CONV_WAYS = {
    "strided": dp_step.ConvRule(short_run=0),
    "indexed": dp_step.ConvRule(short_run=10**9),
    "grouped": dp_step.ConvRule(short_run=0, grouped_min_positions=0, grouped_min_window=0),
}


@contextmanager
def conv_way_forced(way: str) -> Iterator[None]:
    """conv_per_sample_grads takes `way` (a key of CONV_WAYS) on every layer until the block ends."""
    shipped = dp_step.CONV_RULES
    try:
        dp_step.CONV_RULES = dict.fromkeys(shipped, CONV_WAYS[way])
        yield
    finally:
        dp_step.CONV_RULES = shipped


def window_gathers(
    name: str, shape: tuple[int, ...], batch: int, repeats: int, steps: int, device: torch.device
) -> None:
    """Per conv layer: conv_per_sample_grads timed each way (CONV_WAYS), interleaved, on `device`."""
    model = build_model(SimpleNamespace(name=name, hidden=200), shape, 10, 0).to(device)
    model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs omit it
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append((m, i[0], o))) for m in model.modules()]
    model(torch.randn(batch, *shape, device=device).contiguous(memory_format=torch.channels_last))
    for h in hooks:
        h.remove()
    for m, a, out in seen:
        if not isinstance(m, torch.nn.Conv2d):
            continue
        b = torch.randn_like(out)
        times: dict[str, list[float]] = {way: [] for way in CONV_WAYS}
        for _ in range(repeats + 1):  # the first round warms up
            for way, ms in times.items():
                with conv_way_forced(way):
                    synchronize(device)
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        dp_step.conv_per_sample_grads(m, a, b)
                    synchronize(device)
                    ms.append((time.perf_counter() - t0) / steps * 1e3)
        strided, indexed, by_groups = (statistics.median(ms[1:]) for ms in times.values())
        layer, run = str(tuple(a.shape[1:])), dp_step.window_run(m)
        positions, window = out.shape[2] * out.shape[3], m.kernel_size[0] * m.kernel_size[1] * m.in_channels
        chosen = dp_step.conv_way(m, positions, a.device)
        print(
            f"{name:<12} {layer:<16} {positions:>9} {window:>6} {run:>4} {strided:10.3f} {indexed:10.3f} "
            f"{by_groups:10.3f} {indexed / strided:8.2f} {by_groups / min(strided, indexed):8.2f}  {chosen}"
        )


def synchronize(device: torch.device) -> None:
    """Wait for `device`'s queued kernels: a GPU's work is timed when it is done, not when it is queued."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dp_step", description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="default cnn_fmnist,cnn_fedavg,mlp_talaei; with --windows the CNNs")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--windows", action="store_true", help="time the bk path's three ways per conv layer")
    ap.add_argument("--device", default="cpu", help="with --windows: where to time them (cpu | cuda | cuda:N)")
    args = ap.parse_args(argv)
    if not args.models:
        args.models = "cnn_fmnist,cnn_fedavg," + ("cnn_cifar" if args.windows else "mlp_talaei")
    torch.set_num_threads(1)
    kept = keep_freed_memory()  # as a trainer's process does (nodes/training/malloc.py), for every path alike
    print(
        f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1, 5 min), {os.cpu_count()} CPUs; "
        f"torch {torch.__version__}; batch {args.batch}; 1 thread; freed memory kept: {kept}"
    )
    if args.windows:
        device = resolve_device(args.device)
        if device.type == "cuda":
            set_up_torch(device)  # as a GPU worker computes
        print(
            "\nconv_per_sample_grads, ms a call: windows by strided copy and by index_select, and as a grouped\n"
            "convolution's weight gradient; the ratios are indexed / strided and grouped / the faster of those"
        )
        print(
            f"{'model':<12} {'layer input':<16} {'positions':>9} {'window':>6} {'run':>4} {'strided':>10} "
            f"{'indexed':>10} {'grouped':>10} {'i/s':>8} {'g/best':>8}  chosen"
        )
        for name in args.models.split(","):
            window_gathers(name, SHAPES.get(name, (1, 28, 28)), args.batch, args.repeats, args.steps, device)
        return 0
    g = torch.Generator().manual_seed(0)
    for name in args.models.split(","):
        shape = SHAPES.get(name, (1, 28, 28))
        cfg = SimpleNamespace(name=name, hidden=200)
        loss = loss_fn(name)
        y = torch.randint(0, 10, (args.batch,), generator=g)
        x_nchw = torch.randn(args.batch, *shape, generator=g)
        layouts = {"": x_nchw, " channels_last": x_nchw.contiguous(memory_format=torch.channels_last)}
        steps = {}
        for label, make in {
            "plain": plain_step,
            "dp hooks": lambda *a: trainer_step("hooks", *a),
            "dp bk": lambda *a: trainer_step("bk", *a),
            "dp ghost (Opacus)": ghost_step,
            "dp vmap (torch.func)": vmap_step,
        }.items():
            for layout, x in layouts.items() if label in ("plain", "dp bk", "dp vmap (torch.func)") else [("", x_nchw)]:
                model = build_model(cfg, shape, 10, 0)
                if layout:
                    model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs omit it
                steps[label + layout] = make(model, loss, x, y)
        wall: dict[str, list[float]] = {k: [] for k in steps}
        cpu: dict[str, list[float]] = {k: [] for k in steps}
        for f in steps.values():  # warm-up
            for _ in range(3):
                f()
        for _ in range(args.repeats):
            for k, f in steps.items():
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(args.steps):
                    f()
                wall[k].append((time.perf_counter() - t0) / args.steps * 1e3)
                cpu[k].append((time.process_time() - c0) / args.steps * 1e3)
        base, fastest = statistics.median(wall["plain"]), statistics.median(wall["plain channels_last"])
        params = sum(p.numel() for p in build_model(cfg, shape, 10, 0).parameters())
        print(f"\n{name} ({params:,} parameters)")
        print(f"{'path':<36} {'wall ms/step':>12} {'cpu ms/step':>12} {'x plain':>8} {'x plain cl':>10}")
        for k in steps:
            w = statistics.median(wall[k])
            print(f"{k:<36} {w:12.2f} {statistics.median(cpu[k]):12.2f} {w / base:8.2f} {w / fastest:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

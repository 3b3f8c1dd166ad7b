"""The private half of a DP-SGD step (Abadi et al.; ALI-DPFL Alg. 1 lines 8-10): every sample's
gradient clipped to total norm C (factor min(1, C / (||g_i|| + 1e-6)), Opacus's) and summed,
then N(0, sigma^2 C^2) added per parameter from the task's generator, the sum divided by the
divisor, and the SGD step taken. The paths below differ only in how the clipped sum is formed,
that is in float rounding:

* hooks: Opacus's GradSampleModule materialises every per-sample gradient (batch x d values)
  and its DPOptimizer clips, noises and divides;
* bk:    "book-keeping" (Bu et al., ICML 2023): one backward pass to the layers' outputs only,
  per-sample norms from the recorded activations and output gradients (the ghost norm
  ||a_i|| ||b_i|| for Linear; for Conv2d the per-sample gradients, one batched matrix product
  of each sample's channels_last input windows with its output gradient, or for a layer with
  many positions and long windows one grouped convolution's weight gradient), then the clipped sum
  formed directly from them: no per-sample Linear gradient, no second backward. Linear and
  Conv2d layers only; a bundle of K clients (nodes.training.bundle) takes the same functions with a
  K axis. `NoisedMean` then does what Opacus's DPOptimizerFastGradientClipping
  does with a clipped sum, draw for draw (tests/unit/test_dp_step.py checks it bit for bit),
  without importing Opacus: the package's import (torch.distributed, scipy.stats) costs a
  worker CPU at start-up (python -m bench --only startup), and its optimizer's per-step
  bookkeeping time every step (python -m bench.dp_step).

`auto` takes bk wherever it applies: measured by `python -m bench.dp_step`, it is the fastest
path for every model here.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_weight

from nodes.contracts.rng import seed_int
from nodes.contracts.schema import PerSample

# Opacus's hooks fire on the first layer, whose input (data) needs no gradient: expected, harmless.
warnings.filterwarnings("ignore", message="Full backward hook is firing")

BK_LAYERS = (torch.nn.Linear, torch.nn.Conv2d)
CLIP_EPS = 1e-6  # Opacus's
NOISE_KEY = 0x5EED  # a task's noise generator is seeded with its training key ^ NOISE_KEY


def task_generators(
    seed: int, rnd: int, client: int, device: torch.device | str
) -> tuple[torch.Generator, torch.Generator]:
    """Return the Poisson sampler (on the CPU) and the noise generator (where the model is) of `client`'s task
    in round `rnd`, both seeded from the task's training key, seed_int(seed, "train", rnd, client)."""
    key = seed_int(seed, "train", rnd, client)
    return torch.Generator().manual_seed(key), torch.Generator(device=device).manual_seed(key ^ NOISE_KEY)


_LinearRecord = tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]  # (layer, its input, its output's gradient)
_ConvRecord = tuple[torch.nn.Conv2d, torch.Tensor, torch.Tensor | None]  # (layer, per-sample weight and bias grads)


def _parametric_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]


def bk_problem(model: torch.nn.Module) -> str:
    """Why the bk path cannot train `model`, or "" when it can."""
    layers = _parametric_layers(model)
    other = sorted(
        {type(m).__name__ for m in layers if not isinstance(m, BK_LAYERS)}
        | {"grouped Conv2d" for m in layers if isinstance(m, torch.nn.Conv2d) and m.groups != 1}
    )
    return f"per-sample path bk supports Linear and Conv2d layers only, not {', '.join(other)}" if other else ""


def choose_path(model: torch.nn.Module, requested: str) -> PerSample:
    if not PerSample.admits(requested):
        raise ValueError(f"dp.per_sample = {requested!r}: expected {PerSample.describe()}")
    if requested == PerSample.AUTO:
        return PerSample.HOOKS if bk_problem(model) else PerSample.BK
    if requested == PerSample.BK and bk_problem(model):
        raise ValueError(bk_problem(model))
    return PerSample(requested)


class Optimizer(Protocol):
    def zero_grad(self, set_to_none: bool = ...) -> None: ...
    def step(self) -> object: ...


class PrivateStep:
    """`forward(x)`, then `backward(per_sample_loss, clip)` leaves the clipped sum for
    `optimizer(...)`'s step to noise, divide and apply."""

    def __init__(self, model: torch.nn.Module, path: str):
        self.model, self.path = model, path
        if path == PerSample.BK:
            self.clipped = ClippedSum(model)
        else:
            from opacus import GradSampleModule  # Opacus only on this path (see the module's note)

            self.hooked = GradSampleModule(model, loss_reduction="sum")
            self.hooked.disable_hooks()  # only a private forward/backward collects per-sample gradients

    def optimizer(self, lr: float, sigma: float, clip: float, divisor: float, generator: torch.Generator) -> Optimizer:
        # divisor: a float, q|D_i| unrounded
        if self.path == PerSample.BK:  # p.grad is already the clipped sum: only noise and divide
            return NoisedMean(SGD(self.model.parameters(), lr), sigma * clip, divisor, generator)
        from opacus.optimizers import DPOptimizer  # clips the hooks' per-sample gradients

        clipping: Optimizer = DPOptimizer(
            torch.optim.SGD(self.model.parameters(), lr=lr),
            noise_multiplier=sigma,
            max_grad_norm=clip,
            expected_batch_size=divisor,
            loss_reduction="mean",
            generator=generator,
        )
        return clipping

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.path == PerSample.BK:
            return self.clipped.forward(self.model, x)
        self.hooked.enable_hooks()
        out: torch.Tensor = self.hooked(x)
        return out

    def backward(self, per_sample_loss: torch.Tensor, clip: float) -> None:
        if self.path == PerSample.BK:
            self.clipped.backward(per_sample_loss, clip)
            return
        per_sample_loss.sum().backward()
        self.hooked.disable_hooks()


class SGD:
    """torch.optim.SGD's step without momentum or weight decay, as it takes it on CPU: param.add_(grad,
    alpha=-lr) for each parameter with a gradient. torch.optim itself is not used on the bk and plain
    paths: its first use imports torch's compiler (torch._dynamo), start-up CPU in every worker
    (python -m bench --only startup)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float):
        self.params, self.lr = [p for p in params if p.requires_grad], lr

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-self.lr)


class NoisedMean:
    """The step of Opacus's DPOptimizerFastGradientClipping (1.6, loss_reduction "mean", secure_mode
    off) over SGD, for gradients that hold the clipped sum: for each parameter in order, grad =
    (grad + N(0, std^2) drawn from `generator`, none when std = 0) / divisor; then the SGD step."""

    def __init__(self, base: SGD, std: float, divisor: float, generator: torch.Generator):
        self.base, self.std, self.divisor, self.generator = base, std, divisor, generator

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none)

    def step(self) -> None:
        for p in self.base.params:
            grad = torch.zeros_like(p) if p.grad is None else p.grad  # a layer the batch did not reach
            if self.std:
                grad = grad + torch.normal(0, self.std, p.shape, device=p.device, generator=self.generator)
            p.grad = grad / self.divisor
        self.base.step()


class ClippedSum:
    """Book-keeping DP: `backward(per_sample_loss, clip)` leaves in each parameter's .grad the sum
    over the batch of its per-sample gradients, each sample clipped to total norm `clip`."""

    def __init__(self, model: torch.nn.Module):
        if bk_problem(model):
            raise ValueError(bk_problem(model))
        self.recording = False
        self.seen: list[tuple[torch.nn.Module, torch.Tensor, torch.Tensor]] = []
        for m in _parametric_layers(model):
            m.register_forward_hook(self._record)

    def _record(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if self.recording and torch.is_grad_enabled():
            self.seen.append((module, inputs[0].detach(), output))

    def forward(self, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """model(x), recording each layer's input and output for the next backward()."""
        self.seen, self.recording = [], True
        try:
            out: torch.Tensor = model(x)
            return out
        finally:
            self.recording = False

    def backward(self, per_sample_loss: torch.Tensor, clip: float) -> None:
        seen, self.seen = self.seen, []
        if len({id(m) for m, _, _ in seen}) != len(seen):
            raise ValueError("per-sample path bk: a layer used twice in one forward pass (tied weights)")
        n = per_sample_loss.shape[0]
        if n == 0:  # an empty Poisson batch: the step is pure noise
            for m, _, _ in seen:
                for p in m.parameters(recurse=False):
                    p.grad = torch.zeros_like(p)
            return
        squared, per_layer = per_sample_terms(seen, per_sample_loss)
        sums = iter(clipped_sums(per_layer, clip_factors(squared, clip)))
        for m, _, _ in per_layer:
            grad = next(sums)
            m.weight.grad = grad if isinstance(m, torch.nn.Linear) else torch.empty_like(m.weight).copy_(grad)
            if m.bias is not None:
                m.bias.grad = next(sums)


def per_sample_terms(
    seen: Sequence[tuple[torch.nn.Module, torch.Tensor, torch.Tensor]], per_sample_loss: torch.Tensor
) -> tuple[torch.Tensor, list[_LinearRecord | _ConvRecord]]:
    """Each sample's squared gradient norm over the Linear and Conv2d layers `seen` (each with its input and
    output, recorded in the forward pass that gave the (n,) `per_sample_loss`), and each layer's terms for
    clipped_sums in layer order: a Linear's input and output gradient, whose norms give the ghost norm, a
    Conv2d's per-sample weight and bias gradients (conv_per_sample_grads)."""
    # only the layers' outputs are asked for: autograd skips every weight gradient
    backprops = torch.autograd.grad(per_sample_loss.sum(), [out for _, _, out in seen])
    squared = torch.zeros(per_sample_loss.shape[0], dtype=per_sample_loss.dtype, device=per_sample_loss.device)
    per_layer: list[_LinearRecord | _ConvRecord] = []
    for (m, a, _), b in zip(seen, backprops):
        if isinstance(m, torch.nn.Linear):
            if b.dim() != 2:
                raise ValueError("per-sample path bk: Linear layers on (batch, features) inputs only")
            b_squared = _squared_norms(b)
            squared += _squared_norms(a).to(b.dtype) * b_squared  # ghost norm: ||a_i||^2 ||b_i||^2
            if m.bias is not None:
                squared += b_squared
            per_layer.append((m, a, b))
        else:
            assert isinstance(m, torch.nn.Conv2d)  # bk_problem and bundle_problem admit Linear and Conv2d only
            weight, bias = conv_per_sample_grads(m, a, b)
            squared += _squared_norms(weight)
            if bias is not None:
                squared += _squared_norms(bias)
            per_layer.append((m, weight, bias))
    return squared, per_layer


def clip_factors(squared: torch.Tensor, clip: float | torch.Tensor) -> torch.Tensor:
    """Each sample's clip factor min(1, C / (||g_i|| + CLIP_EPS)) from its squared norm: C a float, or a tensor
    that broadcasts with `squared` (a bundle's (K, 1) clip per client). A float C divides as Tensor.__rtruediv__
    does, by a reciprocal and a product, a tensor C by one division: the two round differently."""
    factors: torch.Tensor = (clip / (squared.sqrt() + CLIP_EPS)).clamp(max=1.0)
    return factors


def clipped_sums(per_layer: Sequence[_LinearRecord | _ConvRecord], factors: torch.Tensor) -> list[torch.Tensor]:
    """The sums over the samples of their gradients, each scaled by its factor, one a parameter in layer order,
    from per_sample_terms's terms. `factors` is (n,) for one client's n samples, each sum a parameter's shape;
    or (K, B) for K clients, client k's B samples at rows k * B to (k + 1) * B of the terms, each sum a parameter's
    shape with a leading K axis. `@` is torch.mm for one client, torch.bmm for K. A Conv2d weight's sum is a view,
    channels_last ordered, of the product."""
    rows = factors.shape
    sums: list[torch.Tensor] = []
    for layer in per_layer:
        if isinstance(layer[0], torch.nn.Linear):
            m, a, b = layer
            scaled = (b * factors.view(-1, 1)).view(*rows, -1)
            sums.append(scaled.mT @ a.to(b.dtype).view(*rows, -1))
            if m.bias is not None:
                sums.append(scaled.sum(-2))
        else:
            conv, weight, bias = layer
            cout, cin, kh, kw = conv.weight.shape
            summed = factors.to(weight.dtype).unsqueeze(-2) @ weight.view(*rows, -1)  # channels_last order
            sums.append(summed.view(*rows[:-1], cout, kh, kw, cin).movedim(-1, -3))
            if conv.bias is not None and bias is not None:
                sums.append((factors.to(bias.dtype).unsqueeze(-2) @ bias.view(*rows, -1)).view(*rows[:-1], cout))
    return sums


def _squared_norms(rows: torch.Tensor) -> torch.Tensor:
    """||row_i||^2 for each row of a (n, d) matrix: a reduction, no (n, d) temporary (the fastest of
    vecdot, pow-sum, einsum and bmm measured at d = 512 to 8,192)."""
    norms: torch.Tensor = torch.linalg.vector_norm(rows, dim=1)
    return norms.square()


def conv_per_sample_grads(
    m: torch.nn.Conv2d, a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-sample gradients of a Conv2d (groups = 1) from its input `a` and output gradient `b`:
    the weight's as (n, cout * kh * kw * cin), in channels_last order, and the bias's as (n, cout).
    Sample i's weight gradient is the product of its output gradient (positions x cout) with the
    input window each position saw (positions x kh*kw*cin), so the products are one bmm (faster than
    Opacus 1.6's unfold2d, which is also wrong on channels_last inputs: python -m bench.dp_step), or,
    where `conv_way` says, the weight gradient of the same convolution with one group per sample."""
    mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
    pad = m._reversed_padding_repeated_twice  # what the layer's own forward pads by, string paddings resolved
    a = F.pad(a, pad, mode=mode) if any(pad) else a
    n, cin, h, w = a.shape
    _, cout, ho, wo = b.shape
    (kh, kw), (sh, sw), (dh, dw) = m.kernel_size, m.stride, m.dilation
    out_grad = b.permute(0, 2, 3, 1).reshape(n, ho * wo, cout)  # a view when b is channels_last
    bias = out_grad.sum(1) if m.bias is not None else None
    way = conv_way(m, ho * wo, a.device)
    if way == "grouped":
        # sample i's channels are group i's: (1, n * cin, h, w) in, (1, n * cout, ho, wo) out
        weight = conv2d_weight(
            a.contiguous().view(1, n * cin, h, w).to(b.dtype),
            (n * cout, cin, kh, kw),
            b.contiguous().view(1, n * cout, ho, wo),
            stride=m.stride,
            dilation=m.dilation,
            groups=n,
        )
        return weight.view(n, cout, cin, kh, kw).permute(0, 1, 3, 4, 2).reshape(n, -1), bias
    a = a.contiguous(memory_format=torch.channels_last)
    # In channels_last a window is kh rows of contiguous runs (window_run). A strided copy moves
    # run by run, so short runs (a first layer's 1 or 3 channels) are gathered through a flat index
    # instead, which is faster for short runs only (python -m bench.dp_step --windows).
    if way == "indexed":
        index = _window_index(h, w, cin, ho, wo, kh, kw, sh, sw, dh, dw, a.device)
        windows = a.permute(0, 2, 3, 1).reshape(n, h * w * cin).index_select(1, index)
    else:
        sn, sc, sy, sx = a.stride()
        windows = a.as_strided((n, ho, wo, kh, kw, cin), (sn, sh * sy, sw * sx, dh * sy, dw * sx, sc))
    windows = windows.reshape(n, ho * wo, kh * kw * cin)
    weight = torch.bmm(out_grad.transpose(1, 2), windows.to(b.dtype)).view(n, -1)
    return weight, bias


SHORT_RUN = 32  # values: shorter runs measured faster indexed, longer strided (python -m bench.dp_step --windows)
# The grouped convolution never holds the n * positions * window values that the bmm reads, which
# for a layer of many positions and long windows overflow the caches: there (cnn_cifar's 32- and
# 64-channel layers) it beats the bmm, and it loses on every other layer of the CNNs
# (python -m bench.dp_step --windows). Measured on CPU only (oneDNN); a GPU keeps the bmm.
GROUPED_MIN_POSITIONS, GROUPED_MIN_WINDOW = 256, 256


@dataclass(frozen=True)
class ConvRule:
    """conv_way's rule on one device type: a grouped convolution's weight gradient for a layer of at least
    `grouped_min_positions` output positions and `grouped_min_window` values a window; otherwise one bmm
    over windows gathered indexed where their contiguous runs are shorter than `short_run` values, else
    strided."""

    short_run: int
    grouped_min_positions: float = math.inf  # the default: never grouped
    grouped_min_window: float = math.inf


# conv_way's rules by device type. cpu: measured, as above. cuda: unmeasured, the bmm with the CPU's
# gathering rule, until `python -m bench.dp_step --windows --device cuda` times the three ways on a GPU.
CONV_RULES = {
    "cpu": ConvRule(SHORT_RUN, GROUPED_MIN_POSITIONS, GROUPED_MIN_WINDOW),
    "cuda": ConvRule(SHORT_RUN),
}


def conv_way(m: torch.nn.Conv2d, positions: int, device: torch.device) -> str:
    """How conv_per_sample_grads takes `m`'s per-sample gradients at `positions` output positions on
    `device` (CONV_RULES): grouped (a grouped convolution's), or one bmm over windows gathered indexed or strided."""
    rule = CONV_RULES[device.type]
    window = m.kernel_size[0] * m.kernel_size[1] * m.in_channels
    if positions >= rule.grouped_min_positions and window >= rule.grouped_min_window:
        return "grouped"
    return "indexed" if window_run(m) < rule.short_run else "strided"


def window_run(m: torch.nn.Conv2d) -> int:
    """How many values of a channels_last input window of `m` lie contiguously: kw * cin, or cin when dilated."""
    return m.kernel_size[1] * m.in_channels if m.dilation[1] == 1 else m.in_channels


@functools.lru_cache(maxsize=64)
def _window_index(
    h: int,
    w: int,
    cin: int,
    ho: int,
    wo: int,
    kh: int,
    kw: int,
    sh: int,
    sw: int,
    dh: int,
    dw: int,
    device: torch.device,
) -> torch.Tensor:
    """For a channels_last (h, w, cin) image flattened, the flat position of each value of each
    window, in (ho, wo, kh, kw, cin) order: the same windows as conv_per_sample_grads's strided view."""
    flat = torch.arange(h * w * cin, device=device).view(h, w, cin)
    row, col = w * cin, cin
    return flat.as_strided((ho, wo, kh, kw, cin), (sh * row, sw * col, dh * row, dw * col, 1)).reshape(-1)

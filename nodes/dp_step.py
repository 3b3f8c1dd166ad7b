"""The private half of a DP-SGD step (Abadi et al.; ALI-DPFL Alg. 1 lines 8-10): every sample's
gradient clipped to total norm C (factor min(1, C / (||g_i|| + 1e-6)), Opacus's) and summed.
Opacus's optimizers then add N(0, sigma^2 C^2) per parameter from the task's generator, divide
by the divisor and step, so the paths below differ only in how the clipped sum is formed, that
is in float rounding:

* hooks: Opacus's GradSampleModule materialises every per-sample gradient (batch x d values);
* bk:    "book-keeping" (Bu et al., ICML 2023): one backward pass to the layers' outputs only,
  per-sample norms from the recorded activations and output gradients (Opacus's ghost norm
  for Linear, its per-sample gradients for Conv2d), then the clipped sum formed directly from
  them: no per-sample Linear gradient, no second backward. Linear and Conv2d layers only.

`auto` takes bk wherever it applies: measured by `python -m bench.dp_step`, it is the fastest
path for every model here (e.g. 1.2x a plain step for cnn_fedavg, where hooks take 7x).
"""

from __future__ import annotations

import warnings

import torch
from opacus import GradSampleModule
from opacus.grad_sample.conv import compute_conv_grad_sample
from opacus.grad_sample.linear import compute_linear_norm_sample
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping

from nodes.schema import PerSample

# Opacus's hooks fire on the first layer, whose input (data) needs no gradient: expected, harmless.
warnings.filterwarnings("ignore", message="Full backward hook is firing")

BK_LAYERS = (torch.nn.Linear, torch.nn.Conv2d)
CLIP_EPS = 1e-6  # Opacus's

_LinearRecord = tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]  # (layer, its input, its output's gradient)
_ConvGrads = dict[torch.nn.Parameter, torch.Tensor]  # a Conv2d's per-sample gradients


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


class PrivateStep:
    """`forward(x)`, then `backward(per_sample_loss, clip)` leaves the clipped sum for
    `optimizer(...)`'s step to noise, divide and apply."""

    def __init__(self, model: torch.nn.Module, path: str):
        self.model, self.path = model, path
        if path == PerSample.BK:
            self.clipped = ClippedSum(model)
        else:
            self.hooked = GradSampleModule(model, loss_reduction="sum")
            self.hooked.disable_hooks()  # only a private forward/backward collects per-sample gradients

    def optimizer(
        self, base: torch.optim.Optimizer, sigma: float, clip: float, divisor: float, generator: torch.Generator
    ) -> DPOptimizer:
        # hooks: Opacus's DPOptimizer clips the per-sample gradients; bk: p.grad is already the
        # clipped sum, which the fast-gradient-clipping optimizer only noises and divides.
        kind = DPOptimizerFastGradientClipping if self.path == PerSample.BK else DPOptimizer
        return kind(
            base,
            noise_multiplier=sigma,
            max_grad_norm=clip,
            expected_batch_size=divisor,
            loss_reduction="mean",
            generator=generator,
        )  # divisor: a float, q|D_i| unrounded

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
        # only the layers' outputs are asked for: autograd skips every weight gradient
        backprops = torch.autograd.grad(per_sample_loss.sum(), [out for _, _, out in seen])
        squared = torch.zeros(n, dtype=per_sample_loss.dtype, device=per_sample_loss.device)
        per_layer: list[_LinearRecord | _ConvGrads] = []  # in layer order
        for (m, a, _), b in zip(seen, backprops):
            norms: dict[torch.nn.Parameter, torch.Tensor]  # per-sample norms per parameter
            if isinstance(m, torch.nn.Linear):
                if b.dim() != 2:
                    raise ValueError("per-sample path bk: Linear layers on (batch, features) inputs only")
                norms = compute_linear_norm_sample(m, [a], b)  # ghost norm: ||a_i|| ||b_i||
                per_layer.append((m, a, b))
            else:
                # NCHW: Opacus's unfold2d strides assume it, and is silently wrong on channels_last
                grads = compute_conv_grad_sample(m, [a.contiguous()], b)  # (n, *p.shape) per parameter
                norms = {p: g.flatten(1).norm(2, dim=1) for p, g in grads.items()}
                per_layer.append(grads)
            for v in norms.values():
                squared += v.to(squared.dtype) ** 2
        factors = (clip / (squared.sqrt() + CLIP_EPS)).clamp(max=1.0)
        for layer in per_layer:
            if isinstance(layer, tuple):
                m, a, b = layer
                scaled = b * factors[:, None]
                m.weight.grad = scaled.t().mm(a.to(b.dtype))
                if m.bias is not None:
                    m.bias.grad = scaled.sum(0)
            else:
                for p, g in layer.items():
                    p.grad = torch.einsum("i,i...->...", factors, g)

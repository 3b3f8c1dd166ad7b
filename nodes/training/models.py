"""Models as torch modules: nodes.training.model_catalog's architectures, all Opacus-compatible (no
BatchNorm), all returning one output per class.

`build_model(cfg, input_shape, num_classes, seed)` initialises under
`seed_int(seed, "model_init")` inside a forked torch RNG, so two processes build bitwise
identical weights and the global torch RNG is left untouched.

Every model has a loss (`loss_kind(name)`): cross-entropy on logits for the classifiers,
squared error against one-hot targets for linear regression. `loss_fn(name)` returns it as
`loss(output, target, reduction)` with reduction "sum" | "mean" | "none" over samples.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import assert_never

import torch
import torch.nn.functional as F
from torch import nn

from nodes.contracts.rng import seed_int
from nodes.training.model_catalog import (
    MODEL_LOSS,
    Architecture,
    Conv2d,
    Flatten,
    Layer,
    Linear,
    MaxPool2d,
    ModelSpec,
    ReLU,
    architecture,
)


def sequential(layers: Architecture) -> nn.Sequential:
    """The torch modules of an architecture (nodes.training.model_catalog), built in its order: the order
    their parameters draw their initial values from torch's RNG."""
    return nn.Sequential(OrderedDict((name, _module(layer)) for name, layer in layers))


def _module(layer: Layer) -> nn.Module:
    match layer:
        case Linear():
            return nn.Linear(layer.in_features, layer.out_features)
        case Conv2d():
            return nn.Conv2d(
                layer.in_channels, layer.out_channels, layer.kernel_size, stride=layer.stride, padding=layer.padding
            )
        case MaxPool2d():
            return nn.MaxPool2d(layer.kernel_size, stride=layer.stride)
        case ReLU():
            return nn.ReLU()
        case Flatten():
            return nn.Flatten()
    assert_never(layer)


class SlicedMaxPool2d(nn.Module):
    """nn.MaxPool2d(kernel_size, stride) without padding, dilation or indices, for inference only:
    the maximum of the kernel's shifted, strided slices, rows first, then columns. The same values
    as max_pool2d (a maximum is exact), without the int64 indices that max_pool2d writes for a
    backward pass: a faster forward pass (python -m bench.eval_batch --pool).
    Not for training: torch.maximum's gradient splits ties."""

    def __init__(self, kernel_size: tuple[int, int], stride: tuple[int, int]):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        ho, wo = (x.shape[-2] - kh) // sh + 1, (x.shape[-1] - kw) // sw + 1
        if ho < 1 or wo < 1:  # an input smaller than the kernel: max_pool2d's own error
            return F.max_pool2d(x, self.kernel_size, self.stride)
        rows = x[..., 0 : sh * (ho - 1) + 1 : sh, :]
        for i in range(1, kh):
            rows = torch.maximum(rows, x[..., i : i + sh * (ho - 1) + 1 : sh, :])
        out = rows[..., 0 : sw * (wo - 1) + 1 : sw]
        for j in range(1, kw):
            out = torch.maximum(out, rows[..., j : j + sw * (wo - 1) + 1 : sw])
        return out


def for_inference(model: nn.Module) -> nn.Module:
    """A copy of `model` in eval mode that computes the same outputs faster: each plain
    nn.MaxPool2d (no padding, dilation, ceil_mode or indices) replaced by a SlicedMaxPool2d."""
    model = copy.deepcopy(model).eval()
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.MaxPool2d) and _plain(child):
                setattr(parent, name, SlicedMaxPool2d(_pair(child.kernel_size), _pair(child.stride)))
    return model


def _plain(pool: nn.MaxPool2d) -> bool:
    return (
        _pair(pool.padding) == (0, 0)
        and _pair(pool.dilation) == (1, 1)
        and not pool.ceil_mode
        and not pool.return_indices
    )


def _pair(v: int | tuple[int, ...]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


# --- losses -----------------------------------------------------------------------------


def _reduce(per_sample: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "sum":
        return per_sample.sum()
    if reduction == "mean":
        return per_sample.mean()
    if reduction == "none":
        return per_sample
    raise ValueError(f"reduction = {reduction!r}: expected sum | mean | none")


def cross_entropy(output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """-log softmax(output)[target] per sample."""
    return _reduce(F.cross_entropy(output, target, reduction="none"), reduction)


def squared_error(output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """||output - target||^2 per sample, an integer target standing for its one-hot vector.
    (reduction="mean" averages over samples, so it is num_outputs x torch's mse_loss.)"""
    if not target.is_floating_point():
        target = F.one_hot(target, output.shape[1]).to(output.dtype)
    return _reduce((output - target.reshape(output.shape)).pow(2).flatten(1).sum(1), reduction)


LOSSES: dict[str, Callable[..., torch.Tensor]] = {"cross_entropy": cross_entropy, "mse": squared_error}


def evaluation_sum(loss: Callable[..., torch.Tensor], output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """loss(output, target, reduction="sum"), an evaluation's; cross_entropy's as logsumexp(output) less
    output[target], the same within float rounding: torch's log_softmax over a few classes takes several
    times as long on an evaluation's batches of hundreds of rows (python -m bench.eval_batch --loss).
    Training keeps torch's, so that its numbers are as they were."""
    if loss is cross_entropy:
        return (torch.logsumexp(output, 1) - output.gather(1, target.unsqueeze(1)).squeeze(1)).sum()
    return loss(output, target, reduction="sum")


def _known(model_name: str) -> None:
    if model_name not in MODEL_LOSS:
        raise ValueError(f"model.name = {model_name!r}: expected {' | '.join(sorted(MODEL_LOSS))}")


def loss_kind(model_name: str) -> str:
    """ "cross_entropy" | "mse": the loss model `model_name` is trained with."""
    _known(model_name)
    return MODEL_LOSS[model_name]


def loss_fn(model_name: str) -> Callable[..., torch.Tensor]:
    """`loss(output, target, reduction)` for model `model_name`; reduction over samples."""
    return LOSSES[loss_kind(model_name)]


def build_model(cfg: ModelSpec, input_shape: Iterable[int], num_classes: int, seed: int) -> nn.Module:
    """The model named cfg.name, float32 on CPU, initialised deterministically from `seed`."""
    layers = architecture(cfg, tuple(input_shape), num_classes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_int(seed, "model_init"))
        model = sequential(layers)
    return model.to(torch.float32)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

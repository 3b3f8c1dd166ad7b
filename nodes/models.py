"""Models: builders by name, all Opacus-compatible (no BatchNorm), all returning one output per class.

`build_model(cfg, input_shape, num_classes, seed)` initialises under
`seed_int(seed, "model_init")` inside a forked torch RNG, so two processes build bitwise
identical weights and the global torch RNG is left untouched.

Every model has a loss (`loss_kind(name)`): cross-entropy on logits for the classifiers,
squared error against one-hot targets for linear regression. `loss_fn(name)` returns it as
`loss(output, target, reduction)` with reduction "sum" | "mean" | "none" over samples.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from itertools import pairwise
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from nodes.model_catalog import MODEL_LOSS
from nodes.rng import seed_int


class ModelSpec(Protocol):
    """What the builders read of a scenario's `model` section (emulator.config.ModelConfig)."""

    @property
    def name(self) -> str: ...

    @property
    def hidden(self) -> int: ...


def _flat(input_shape: tuple[int, ...]) -> int:
    return int(math.prod(input_shape))


def logreg(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> nn.Module:
    """Multinomial logistic regression."""
    return nn.Sequential(
        OrderedDict(
            flatten=nn.Flatten(),
            fc=nn.Linear(_flat(input_shape), num_classes),
        )
    )


def linreg(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> nn.Module:
    """Linear regression onto the one-hot label (trained with squared error, see loss_kind)."""
    return logreg(input_shape, num_classes, cfg)


def _mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int) -> nn.Module:
    return nn.Sequential(
        OrderedDict(
            flatten=nn.Flatten(),
            fc1=nn.Linear(_flat(input_shape), hidden),
            relu=nn.ReLU(),
            fc2=nn.Linear(hidden, num_classes),
        )
    )


def mlp(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> nn.Module:
    """One hidden ReLU layer of `cfg.hidden` units."""
    return _mlp(input_shape, num_classes, cfg.hidden)


TALAEI_HIDDEN = 200
WEI_HIDDEN = 256


def mlp_talaei(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> nn.Module:
    """Talaei & Izadi (PADPFL), Sec. VI-A: an MLP with one ReLU hidden layer and a softmax
    output over 10 classes. The paper gives no hidden size; 200 units, as in the MNIST MLP
    of McMahan et al. (2017). For (1, 28, 28): 159,010 parameters."""
    return _mlp(input_shape, num_classes, TALAEI_HIDDEN)


def mlp_wei(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> nn.Module:
    """Wei et al. (UDP), Sec. 5.2: "single hidden layer with 256 hidden units", ReLU, softmax
    over 10 classes. For (1, 28, 28): 203,530 parameters."""
    return _mlp(input_shape, num_classes, WEI_HIDDEN)


def cnn_fmnist(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> nn.Module:
    """ALI-DPFL CNN for MNIST/FMNIST.

    Ling et al., "ALI-DPFL: Differentially Private Federated Learning with Adaptive Local
    Iterations", TABLE V (MNIST and FMNIST model architecture):
      Convolution     16 filters of 8x8, stride 2, padding 2
      Max-Pooling     2x2, stride 1
      Convolution     32 filters of 4x4, stride 2, padding 0
      Max-Pooling     2x2, stride 1
      Fully connected 32 units
      Fully connected 10 units (= num_classes)
    The table names no activations; ReLU after each convolution and after the hidden fully
    connected layer, as in the Opacus MNIST example this architecture comes from.
    For (1, 28, 28): 28 -> 13 -> 12 -> 5 -> 4, so 32*4*4 = 512 features; 26,010 parameters.
    """
    if len(input_shape) != 3:
        raise ValueError(
            f"model cnn_fmnist needs image input (channels, height, width), got shape {tuple(input_shape)}"
        )
    c, h, w = input_shape

    def out(n: int) -> int:
        n = (n + 2 * 2 - 8) // 2 + 1  # conv1
        n = n - 1  # pool 2x2 stride 1
        n = (n - 4) // 2 + 1  # conv2
        return n - 1  # pool 2x2 stride 1

    oh, ow = out(h), out(w)
    if oh < 1 or ow < 1:
        raise ValueError(f"model cnn_fmnist: input {tuple(input_shape)} too small (needs height, width >= 14)")
    return nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(c, 16, kernel_size=8, stride=2, padding=2),
            relu1=nn.ReLU(),
            pool1=nn.MaxPool2d(kernel_size=2, stride=1),
            conv2=nn.Conv2d(16, 32, kernel_size=4, stride=2, padding=0),
            relu2=nn.ReLU(),
            pool2=nn.MaxPool2d(kernel_size=2, stride=1),
            flatten=nn.Flatten(),
            fc1=nn.Linear(32 * oh * ow, 32),
            relu3=nn.ReLU(),
            fc2=nn.Linear(32, num_classes),
        )
    )


def cnn_cifar(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> nn.Module:
    """ALI-DPFL CNN for CIFAR-10, TABLE VI (Cifar10 model architecture):
      Convolution x2  32 filters of 3x3, stride 1, padding 1;  Max-Pooling 2x2, stride 2
      Convolution x2  64 filters of 3x3, stride 1, padding 1;  Max-Pooling 2x2, stride 2
      Convolution x2 128 filters of 3x3, stride 1, padding 1;  Max-Pooling 2x2, stride 2
      Fully connected 128 units;  Fully connected 10 units (= num_classes)
    ReLU after every convolution and after the hidden fully connected layer, as for Table V.
    For (3, 32, 32): 32 -> 16 -> 8 -> 4, so 128*4*4 = 2048 features; 550,570 parameters.
    """
    if len(input_shape) != 3:
        raise ValueError(f"model cnn_cifar needs image input (channels, height, width), got shape {tuple(input_shape)}")
    c, h, w = input_shape
    if h < 8 or w < 8:
        raise ValueError(f"model cnn_cifar: input {tuple(input_shape)} too small (needs height, width >= 8)")
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    widths = [c, 32, 64, 128]
    for block, (c_in, c_out) in enumerate(pairwise(widths), start=1):
        layers[f"conv{block}a"] = nn.Conv2d(c_in, c_out, kernel_size=3, stride=1, padding=1)
        layers[f"relu{block}a"] = nn.ReLU()
        layers[f"conv{block}b"] = nn.Conv2d(c_out, c_out, kernel_size=3, stride=1, padding=1)
        layers[f"relu{block}b"] = nn.ReLU()
        layers[f"pool{block}"] = nn.MaxPool2d(kernel_size=2, stride=2)
    layers["flatten"] = nn.Flatten()
    layers["fc1"] = nn.Linear(128 * (h // 8) * (w // 8), 128)
    layers["relu_fc"] = nn.ReLU()
    layers["fc2"] = nn.Linear(128, num_classes)
    return nn.Sequential(layers)


def cnn_fedavg(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> nn.Module:
    """The CNN the ALI-DPFL authors' code trains for MNIST/FMNIST/CIFAR-10 (`FedAvgCNN` in their
    system/flcore/trainmodel/models.py, after McMahan et al. 2017), not Table V's:
      Convolution 32 filters of 5x5, stride 1, no padding; ReLU; Max-Pooling 2x2
      Convolution 64 filters of 5x5, stride 1, no padding; ReLU; Max-Pooling 2x2
      Fully connected 512 units; ReLU;  Fully connected 10 units (= num_classes)
    For (1, 28, 28): 28 -> 24 -> 12 -> 8 -> 4, 64*4*4 = 1024 features, 582,026 parameters;
    for (3, 32, 32): 1600 features, 878,538 parameters.
    """
    if len(input_shape) != 3:
        raise ValueError(
            f"model cnn_fedavg needs image input (channels, height, width), got shape {tuple(input_shape)}"
        )
    c, h, w = input_shape
    oh, ow = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
    if oh < 1 or ow < 1:
        raise ValueError(f"model cnn_fedavg: input {tuple(input_shape)} too small (needs height, width >= 16)")
    return nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(c, 32, kernel_size=5),
            relu1=nn.ReLU(),
            pool1=nn.MaxPool2d(kernel_size=2),
            conv2=nn.Conv2d(32, 64, kernel_size=5),
            relu2=nn.ReLU(),
            pool2=nn.MaxPool2d(kernel_size=2),
            flatten=nn.Flatten(),
            fc1=nn.Linear(64 * oh * ow, 512),
            relu3=nn.ReLU(),
            fc2=nn.Linear(512, num_classes),
        )
    )


MODELS: dict[str, Callable[[tuple[int, ...], int, ModelSpec], nn.Module]] = {
    "logreg": logreg,
    "linreg": linreg,
    "mlp": mlp,
    "mlp_talaei": mlp_talaei,
    "mlp_wei": mlp_wei,
    "cnn_fmnist": cnn_fmnist,
    "cnn_cifar": cnn_cifar,
    "cnn_fedavg": cnn_fedavg,
}


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


def _known(model_name: str) -> None:
    if model_name not in MODELS:
        raise ValueError(f"model.name = {model_name!r}: expected {' | '.join(sorted(MODELS))}")


def loss_kind(model_name: str) -> str:
    """ "cross_entropy" | "mse": the loss model `model_name` is trained with."""
    _known(model_name)
    return MODEL_LOSS[model_name]


def loss_fn(model_name: str) -> Callable[..., torch.Tensor]:
    """`loss(output, target, reduction)` for model `model_name`; reduction over samples."""
    return LOSSES[loss_kind(model_name)]


def build_model(cfg: ModelSpec, input_shape: Iterable[int], num_classes: int, seed: int) -> nn.Module:
    """The model named cfg.name, float32 on CPU, initialised deterministically from `seed`."""
    _known(cfg.name)
    builder = MODELS[cfg.name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_int(seed, "model_init"))
        model = builder(tuple(int(d) for d in input_shape), int(num_classes), cfg)
    return model.to(torch.float32)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

"""Models: builders by name, all Opacus-compatible (no BatchNorm), all returning logits.

`build_model(cfg, input_shape, num_classes, seed)` initialises under
`seed_int(seed, "model_init")` inside a forked torch RNG, so two processes build bitwise
identical weights and the global torch RNG is left untouched.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Callable

import torch
from torch import nn

from emulator.rng import seed_int


def _flat(input_shape) -> int:
    return int(math.prod(input_shape))


def logreg(input_shape: tuple[int, ...], num_classes: int, cfg) -> nn.Module:
    """Multinomial logistic regression."""
    return nn.Sequential(OrderedDict(
        flatten=nn.Flatten(),
        fc=nn.Linear(_flat(input_shape), num_classes),
    ))


def mlp(input_shape: tuple[int, ...], num_classes: int, cfg) -> nn.Module:
    """One hidden ReLU layer of `cfg.hidden` units."""
    return nn.Sequential(OrderedDict(
        flatten=nn.Flatten(),
        fc1=nn.Linear(_flat(input_shape), cfg.hidden),
        relu=nn.ReLU(),
        fc2=nn.Linear(cfg.hidden, num_classes),
    ))


def cnn_fmnist(input_shape: tuple[int, ...], num_classes: int, cfg) -> nn.Module:
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
        raise ValueError(f"model cnn_fmnist needs image input (channels, height, width), got shape {tuple(input_shape)}")
    c, h, w = input_shape

    def out(n):
        n = (n + 2 * 2 - 8) // 2 + 1   # conv1
        n = n - 1                      # pool 2x2 stride 1
        n = (n - 4) // 2 + 1           # conv2
        return n - 1                   # pool 2x2 stride 1

    oh, ow = out(h), out(w)
    if oh < 1 or ow < 1:
        raise ValueError(f"model cnn_fmnist: input {tuple(input_shape)} too small (needs height, width >= 14)")
    return nn.Sequential(OrderedDict(
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
    ))


MODELS: dict[str, Callable[[tuple[int, ...], int, object], nn.Module]] = {
    "logreg": logreg,
    "mlp": mlp,
    "cnn_fmnist": cnn_fmnist,
}


def build_model(cfg, input_shape, num_classes: int, seed: int) -> nn.Module:
    """The model named cfg.name, float32 on CPU, initialised deterministically from `seed`."""
    try:
        builder = MODELS[cfg.name]
    except KeyError:
        raise ValueError(f"model.name = {cfg.name!r}: expected {' | '.join(sorted(MODELS))}") from None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_int(seed, "model_init"))
        model = builder(tuple(int(d) for d in input_shape), int(num_classes), cfg)
    return model.to(torch.float32)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

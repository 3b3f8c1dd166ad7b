"""The models as plain data, without importing torch (validating a scenario and sizing its model
must not: emulator.run.lifecycle starts the workers first, and loads its data and plans its first round
while they import torch): each model's layers (`architecture`), the loss it is trained with and
the sample shapes it is defined for. nodes.training.models turns an architecture into torch modules."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol

MODEL_LOSS: dict[str, str] = {
    "logreg": "cross_entropy",
    "linreg": "mse",
    "mlp": "cross_entropy",
    "mlp_talaei": "cross_entropy",
    "mlp_wei": "cross_entropy",
    "cnn_fmnist": "cross_entropy",
    "cnn_cifar": "cross_entropy",
    "cnn_fedavg": "cross_entropy",
}
MODEL_NAMES = tuple(MODEL_LOSS)

# The paper CNNs are defined for given inputs (ALI-DPFL Tables V and VI; the authors' code uses
# FedAvgCNN for both). On another shape they may still build, and then train for hours at
# chance (cnn_cifar on FashionMNIST did).
DESIGNED_INPUTS: dict[str, tuple[tuple[int, ...], ...]] = {
    "cnn_fmnist": ((1, 28, 28),),
    "cnn_cifar": ((3, 32, 32),),
    "cnn_fedavg": ((1, 28, 28), (3, 32, 32)),
}


# dp.batch_eval = 0, its default: the conv nets evaluate as fast at 64 as at 128 or 256 and slower at 1,024;
# a dense model's evaluation at 64 is bound by the calls each batch makes (python -m bench.eval_batch)
CONV_NETS = frozenset({"cnn_fmnist", "cnn_cifar", "cnn_fedavg"})  # the models with a Conv2d layer (a test checks)
CONV_EVAL_BATCH, DENSE_EVAL_BATCH = 64, 1024


def evaluation_batch(model_name: str, batch_eval: int) -> int:
    """The samples a batch of the evaluation and of the full-data gradient: dp.batch_eval, or for 0 the
    model's own (64 for a conv net, 1,024 for the others)."""
    if batch_eval:
        return batch_eval
    return CONV_EVAL_BATCH if model_name in CONV_NETS else DENSE_EVAL_BATCH


def designed_inputs(model_name: str) -> tuple[tuple[int, ...], ...] | None:
    """The sample shapes `model_name` is defined for; None if it takes any (it flattens its input)."""
    return DESIGNED_INPUTS.get(model_name)


class ModelSpec(Protocol):
    """What an architecture reads of a scenario's `model` section (nodes.contracts.schema.ModelConfig)."""

    @property
    def name(self) -> str: ...

    @property
    def hidden(self) -> int: ...


# --- layers: torch.nn's, as data; shapes are batch first --------------------------------------


@dataclass(frozen=True)
class Flatten:
    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[0], math.prod(shape[1:]))

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {}


@dataclass(frozen=True)
class ReLU:
    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {}


@dataclass(frozen=True)
class Linear:
    in_features: int
    out_features: int

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*shape[:-1], self.out_features)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"weight": (self.out_features, self.in_features), "bias": (self.out_features,)}


def _slide(n: int, kernel: int, stride: int, padding: int) -> int:
    """Positions of a kernel sliding over n inputs (torch's Conv2d and MaxPool2d, dilation 1, floor)."""
    return (n + 2 * padding - kernel) // stride + 1


@dataclass(frozen=True)
class Conv2d:
    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int = 1
    padding: int = 0

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        h, w = (_slide(n, self.kernel_size, self.stride, self.padding) for n in shape[-2:])
        return (shape[0], self.out_channels, h, w)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        k = self.kernel_size
        return {"weight": (self.out_channels, self.in_channels, k, k), "bias": (self.out_channels,)}


@dataclass(frozen=True)
class MaxPool2d:
    kernel_size: int
    stride: int  # torch's default is kernel_size: always given here

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        h, w = (_slide(n, self.kernel_size, self.stride, 0) for n in shape[-2:])
        return (*shape[:-2], h, w)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {}


Layer = Flatten | ReLU | Linear | Conv2d | MaxPool2d
Architecture = list[tuple[str, Layer]]  # named layers, applied in order (a torch Sequential)


def parameter_shapes(layers: Architecture) -> dict[str, tuple[int, ...]]:
    """The model's state_dict keys and shapes, in order ("fc.weight": (10, 784), ...)."""
    return {f"{name}.{p}": shape for name, layer in layers for p, shape in layer.parameter_shapes().items()}


def output_shapes(layers: Architecture, sample_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Each layer's output shape for one sample of `sample_shape` (batch dimension 1 included)."""
    shape, out = (1, *sample_shape), []
    for _, layer in layers:
        shape = layer.output_shape(shape)
        out.append(shape)
    return out


# --- the models ---------------------------------------------------------------------------


def _flat(input_shape: tuple[int, ...]) -> int:
    return int(math.prod(input_shape))


def logreg(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> Architecture:
    """Multinomial logistic regression."""
    return [("flatten", Flatten()), ("fc", Linear(_flat(input_shape), num_classes))]


def linreg(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> Architecture:
    """Linear regression onto the one-hot label (trained with squared error, see MODEL_LOSS)."""
    return logreg(input_shape, num_classes, cfg)


def _mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int) -> Architecture:
    return [
        ("flatten", Flatten()),
        ("fc1", Linear(_flat(input_shape), hidden)),
        ("relu", ReLU()),
        ("fc2", Linear(hidden, num_classes)),
    ]


def mlp(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> Architecture:
    """One hidden ReLU layer of `cfg.hidden` units."""
    return _mlp(input_shape, num_classes, cfg.hidden)


TALAEI_HIDDEN = 200
WEI_HIDDEN = 256


def mlp_talaei(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> Architecture:
    """Talaei & Izadi (PADPFL), Sec. VI-A: an MLP with one ReLU hidden layer and a softmax
    output over 10 classes. The paper gives no hidden size; 200 units, as in the MNIST MLP
    of McMahan et al. (2017). For (1, 28, 28): 159,010 parameters."""
    return _mlp(input_shape, num_classes, TALAEI_HIDDEN)


def mlp_wei(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> Architecture:
    """Wei et al. (UDP), Sec. 5.2: "single hidden layer with 256 hidden units", ReLU, softmax
    over 10 classes. For (1, 28, 28): 203,530 parameters."""
    return _mlp(input_shape, num_classes, WEI_HIDDEN)


def _channels(name: str, input_shape: tuple[int, ...]) -> int:
    """The channels of an image input (channels, height, width); any other input is refused."""
    if len(input_shape) != 3:
        raise ValueError(f"model {name} needs image input (channels, height, width), got shape {tuple(input_shape)}")
    return input_shape[0]


def _conv_net(
    name: str,
    convs: Architecture,
    input_shape: tuple[int, ...],
    least: int,
    hidden: int,
    num_classes: int,
    hidden_relu: str = "relu3",
) -> Architecture:
    """`convs`, then flatten, a hidden fully connected ReLU layer and the output layer, as every CNN
    here ends. An input the convs reduce to nothing is refused (`least`: the smallest height and
    width they keep)."""
    _, c, h, w = output_shapes(convs, input_shape)[-1]
    if h < 1 or w < 1:
        raise ValueError(f"model {name}: input {tuple(input_shape)} too small (needs height, width >= {least})")
    return [
        *convs,
        ("flatten", Flatten()),
        ("fc1", Linear(c * h * w, hidden)),
        (hidden_relu, ReLU()),
        ("fc2", Linear(hidden, num_classes)),
    ]


def cnn_fmnist(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> Architecture:
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
    c = _channels("cnn_fmnist", input_shape)
    convs: Architecture = [
        ("conv1", Conv2d(c, 16, kernel_size=8, stride=2, padding=2)),
        ("relu1", ReLU()),
        ("pool1", MaxPool2d(kernel_size=2, stride=1)),
        ("conv2", Conv2d(16, 32, kernel_size=4, stride=2, padding=0)),
        ("relu2", ReLU()),
        ("pool2", MaxPool2d(kernel_size=2, stride=1)),
    ]
    return _conv_net("cnn_fmnist", convs, input_shape, 14, 32, num_classes)


def cnn_cifar(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> Architecture:
    """ALI-DPFL CNN for CIFAR-10, TABLE VI (Cifar10 model architecture):
      Convolution x2  32 filters of 3x3, stride 1, padding 1;  Max-Pooling 2x2, stride 2
      Convolution x2  64 filters of 3x3, stride 1, padding 1;  Max-Pooling 2x2, stride 2
      Convolution x2 128 filters of 3x3, stride 1, padding 1;  Max-Pooling 2x2, stride 2
      Fully connected 128 units;  Fully connected 10 units (= num_classes)
    ReLU after every convolution and after the hidden fully connected layer, as for Table V.
    For (3, 32, 32): 32 -> 16 -> 8 -> 4, so 128*4*4 = 2048 features; 550,570 parameters.
    """
    c = _channels("cnn_cifar", input_shape)
    convs: Architecture = []
    for block, (c_in, c_out) in enumerate(pairwise([c, 32, 64, 128]), start=1):
        convs += [
            (f"conv{block}a", Conv2d(c_in, c_out, kernel_size=3, stride=1, padding=1)),
            (f"relu{block}a", ReLU()),
            (f"conv{block}b", Conv2d(c_out, c_out, kernel_size=3, stride=1, padding=1)),
            (f"relu{block}b", ReLU()),
            (f"pool{block}", MaxPool2d(kernel_size=2, stride=2)),
        ]
    return _conv_net("cnn_cifar", convs, input_shape, 8, 128, num_classes, hidden_relu="relu_fc")


def cnn_fedavg(input_shape: tuple[int, ...], num_classes: int, cfg: ModelSpec) -> Architecture:
    """The CNN the ALI-DPFL authors' code trains for MNIST/FMNIST/CIFAR-10 (`FedAvgCNN` in their
    system/flcore/trainmodel/models.py, after McMahan et al. 2017), not Table V's:
      Convolution 32 filters of 5x5, stride 1, no padding; ReLU; Max-Pooling 2x2
      Convolution 64 filters of 5x5, stride 1, no padding; ReLU; Max-Pooling 2x2
      Fully connected 512 units; ReLU;  Fully connected 10 units (= num_classes)
    For (1, 28, 28): 28 -> 24 -> 12 -> 8 -> 4, 64*4*4 = 1024 features, 582,026 parameters;
    for (3, 32, 32): 1600 features, 878,538 parameters.
    """
    c = _channels("cnn_fedavg", input_shape)
    convs: Architecture = [
        ("conv1", Conv2d(c, 32, kernel_size=5)),
        ("relu1", ReLU()),
        ("pool1", MaxPool2d(kernel_size=2, stride=2)),
        ("conv2", Conv2d(32, 64, kernel_size=5)),
        ("relu2", ReLU()),
        ("pool2", MaxPool2d(kernel_size=2, stride=2)),
    ]
    return _conv_net("cnn_fedavg", convs, input_shape, 16, 512, num_classes)


ARCHITECTURES = {
    "logreg": logreg,
    "linreg": linreg,
    "mlp": mlp,
    "mlp_talaei": mlp_talaei,
    "mlp_wei": mlp_wei,
    "cnn_fmnist": cnn_fmnist,
    "cnn_cifar": cnn_cifar,
    "cnn_fedavg": cnn_fedavg,
}


def architecture(cfg: ModelSpec, input_shape: tuple[int, ...], num_classes: int) -> Architecture:
    """The layers of the model named cfg.name for samples of `input_shape` and `num_classes` outputs."""
    if cfg.name not in ARCHITECTURES:
        raise ValueError(f"model.name = {cfg.name!r}: expected {' | '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[cfg.name](tuple(int(d) for d in input_shape), int(num_classes), cfg)

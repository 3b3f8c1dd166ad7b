"""What is known of each model without building it, so without importing torch (validating a
scenario must not: emulator.run starts the workers first): the loss it is trained with and the
sample shapes it is defined for. nodes.models builds them."""

from __future__ import annotations

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


def designed_inputs(model_name: str) -> tuple[tuple[int, ...], ...] | None:
    """The sample shapes `model_name` is defined for; None if it takes any (it flattens its input)."""
    return DESIGNED_INPUTS.get(model_name)

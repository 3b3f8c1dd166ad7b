"""Training and evaluation on a device as a worker sets it up (nodes.training.determinism): two trainers train a
client to the same bits, on the CPU and on a GPU; on a GPU every op the trainer runs has a deterministic
kernel (the mode raises otherwise), and without noise it steps as the CPU does, to float rounding.
The models' layers at their sizes, on random images: no dataset's files needed. The `gpu` tests are
skipped without a CUDA GPU (python -m bench.gpu_check runs them on one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from emulator.config import load
from nodes.contracts.tasks import ClientTask
from nodes.data.federated import FederatedData, Samples
from nodes.training.determinism import set_up_torch
from nodes.training.trainer import GlobalEvaluation, Trainer, state_to_numpy
from tests.conftest import needs_gpu

DEVICES = ["cpu", pytest.param("cuda", marks=needs_gpu())]
SHAPES = {"mlp": (20,), "cnn_fmnist": (1, 28, 28), "cnn_fedavg": (1, 28, 28), "cnn_cifar": (3, 32, 32)}
# every mechanism a task can ask for that runs on the device: the ALI-DPFL estimates' full gradients and last step
TASK = ClientTask(client=1, steps=3, lr=0.5, sigma=1.0, clip=0.5, q=0.3, report_grad_diff=True, report_last_step=True)


class RandomSamples(FederatedData):
    """Two clients of 48 random samples of `shape` each, and a test set of 64."""

    num_classes, n_clients = 10, 2

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.input_shape = shape

    @property
    def sizes(self) -> list[int]:
        return [48, 48]

    def _build(self, k: int) -> Samples:
        return self._draw(k, 48)

    def test(self) -> Samples:
        return self._draw(99, 64)

    def _draw(self, seed: int, n: int) -> Samples:
        rng = np.random.default_rng(seed)
        return rng.standard_normal((n, *self.input_shape), dtype=np.float32), rng.integers(0, 10, n)


def trainer(name: str, device: str, per_sample: str = "bk") -> Trainer:
    cfg = load(None, [])
    cfg.model.name = name  # after loading: the scenario's data is synthetic vectors, these samples images
    return Trainer(
        RandomSamples(SHAPES[name]),
        torch.device(device),
        model=cfg.model,
        data_cfg=cfg.data,
        seed=0,
        per_sample=per_sample,
        batch_eval=32,
        batch_divisor=0,
        empty_batch="step",
    )


def trained(t: Trainer, start: dict[str, np.ndarray], task: ClientTask = TASK) -> tuple[dict, dict]:
    """The weights and metrics of `task` from the weights `start`, copied."""
    weights, metrics = t.train(2, task, {k: v.copy() for k, v in start.items()})
    return {k: v.copy() for k, v in weights.items()}, dict(metrics)


def initial(t: Trainer) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in state_to_numpy(t.model).items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("name", "per_sample"), [(name, "bk") for name in SHAPES] + [("mlp", "hooks"), ("cnn_fmnist", "hooks")]
)
def test_two_trainers_train_a_client_to_the_same_bits(name, per_sample, device, torch_settings):
    set_up_torch(torch.device(device))
    first, second = trainer(name, device, per_sample), trainer(name, device, per_sample)
    start = initial(first)
    (a, metrics), (b, _) = trained(first, start), trained(second, start)
    again, metrics_again = trained(first, start)  # its clients' data and the window indexes built now
    for k in a:
        assert np.array_equal(a[k], b[k]) and np.array_equal(a[k], again[k]), k
    assert metrics == metrics_again and metrics["update_norm"] > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_evaluation_is_the_same_bits_every_time(name, device, torch_settings):
    set_up_torch(torch.device(device))
    cfg = load(None, [])
    cfg.model.name = name
    data, on = RandomSamples(SHAPES[name]), torch.device(device)
    evaluation = GlobalEvaluation(data, on, model=cfg.model, seed=0, batch_eval=16)
    assert evaluation(evaluation.initial) == evaluation(evaluation.initial)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_gpu())])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_without_noise_a_gpu_steps_as_the_cpu_does(name, device, torch_settings):
    """The same Poisson batches (drawn on the CPU) clipped and stepped; only the noise is the device's own."""
    clipped = ClientTask(client=1, steps=3, lr=0.5, sigma=0.0, clip=0.5, q=0.3)
    cpu = trainer(name, "cpu")
    start = initial(cpu)
    on_cpu, _ = trained(cpu, start, clipped)
    set_up_torch(torch.device(device))
    on_gpu, _ = trained(trainer(name, device), start, clipped)
    for k in on_cpu:
        scale = np.abs(on_cpu[k]).max()
        np.testing.assert_allclose(on_gpu[k], on_cpu[k], rtol=0, atol=1e-5 * scale, err_msg=k)

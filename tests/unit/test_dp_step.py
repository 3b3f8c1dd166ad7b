"""The per-sample-gradient paths of a DP-SGD step: each forms exactly sum_i min(1, C/(||g_i||+1e-6)) g_i,
checked against a one-sample-at-a-time autograd reference in float64, and the trainer's update is the same
whichever path (and memory layout) it takes.

The reference follows the subgradient the path took: at a ReLU input or a max-pool window that float32
rounding leaves within a rounding error of a kink, which way the gradient goes depends on the CPU's
kernels (their order of summation), so the reference replays the route the path's own float32 forward
took instead of choosing its own."""

import copy
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.dp_step import CONV_WAYS, conv_way_forced
from emulator.config import ConfigError, load
from nodes.contracts.schema import ModelConfig
from nodes.contracts.tasks import ClientTask
from nodes.data import load_federated
from nodes.training import dp_step
from nodes.training.dp_step import CLIP_EPS, SGD, PrivateStep, bk_problem, choose_path
from nodes.training.model_catalog import MODEL_NAMES
from nodes.training.models import build_model, loss_fn
from nodes.training.trainer import build_trainer, state_to_numpy
from tests.datasets import FASHION_MNIST, FASHION_MNIST_MISSING

IMG, CIFAR = (1, 28, 28), (3, 32, 32)
SHAPES = {"cnn_cifar": CIFAR}
KINKED = (nn.ReLU, nn.MaxPool2d)  # the layers whose gradient depends on a comparison
# float32 sums of up to ~10^3 products (the largest windows and position counts here) carry a relative
# error of up to ~K * 2^-24 ~ 1e-4 of the terms summed; a tensor's entries near 0 are held to its scale
RTOL, SCALE_TOL = 1e-4, 1e-5

Route = dict[str, torch.Tensor]  # a kinked layer's name -> its ReLU mask or its max-pool indices, per sample


def recorded_route(model: nn.Module) -> tuple[Route, list]:
    """Hooks that record, while `model` runs forward, which way each kinked layer sends the gradient:
    a ReLU's mask (input > 0, as relu's backward has it) and a max-pool's indices (from the same kernel
    on the same input). Returns the route (filled by the forward) and the hooks' handles."""
    route: Route = {}

    def record(name):
        def hook(module, inputs, output):
            a = inputs[0].detach()
            if isinstance(module, nn.ReLU):
                route[name] = a > 0
            else:
                k, s, p, d = module.kernel_size, module.stride, module.padding, module.dilation
                route[name] = F.max_pool2d(a, k, s, p, d, module.ceil_mode, return_indices=True)[1]

        return hook

    handles = [m.register_forward_hook(record(n)) for n, m in model.named_modules() if isinstance(m, KINKED)]
    return route, handles


def replaying(model: nn.Module, route: Route, i: int) -> list:
    """Hooks that make `model`'s kinked layers send sample i's gradient the way `route` says."""

    def replay(name):
        def hook(module, inputs, output):
            a, taken = inputs[0], route[name][i : i + 1]
            if isinstance(module, nn.ReLU):
                return a * taken
            return a.flatten(2).gather(2, taken.flatten(2)).view(taken.shape)

        return hook

    return [m.register_forward_hook(replay(n)) for n, m in model.named_modules() if isinstance(m, KINKED)]


def reference_clipped_sum(model, loss, x, y, clip, route: Route | None = None):
    """One sample at a time through autograd in float64: the definition, no per-sample machinery.
    With `route`, each sample's gradient takes the way the path's float32 forward sent it."""
    model = copy.deepcopy(model).double()
    x = x.double()
    params = list(model.parameters())
    total = [torch.zeros_like(p) for p in params]
    for i in range(len(y)):
        handles = replaying(model, route, i) if route else []
        try:
            g = torch.autograd.grad(loss(model(x[i : i + 1]), y[i : i + 1], reduction="sum"), params)
        finally:
            for h in handles:
                h.remove()
        norm = torch.sqrt(sum((t**2).sum() for t in g))
        factor = min(1.0, clip / (float(norm) + CLIP_EPS))
        for t, gi in zip(total, g):
            t += factor * gi
    return total


def assert_close_to_float64(got, want):
    for g, w in zip(got, want):
        scale = float(w.abs().max())
        torch.testing.assert_close(g, w, rtol=RTOL, atol=SCALE_TOL * scale + 1e-12)


def private_clipped_sum(path, model, loss, x, y, clip):
    """The path's clipped sum (float32, as trained) and the route its forward took."""
    step = PrivateStep(model, path)
    model.zero_grad(set_to_none=True)
    route, handles = recorded_route(model)
    try:
        out = step.forward(x)
    finally:
        for h in handles:
            h.remove()
    step.backward(loss(out, y, reduction="none"), clip)
    if path == "hooks":  # Opacus's DPOptimizer clips from grad_sample: do what it does, noise-free
        opt = step.optimizer(0.0, 0.0, clip, 1.0, torch.Generator())
        opt.pre_step()
    return [p.grad.double() for p in model.parameters()], route  # hooks: divided by the divisor 1


def path_against_reference(path, model, loss, x, y, clip):
    """The path's clipped sum and the float64 reference along the route the path took."""
    pristine = copy.deepcopy(model)  # before the path hooks the model (Opacus) or sets gradients
    got, route = private_clipped_sum(path, model, loss, x, y, clip)
    return got, reference_clipped_sum(pristine, loss, x, y, clip, route)


@pytest.mark.parametrize("path", ["bk", "hooks"])
@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn_fmnist", "cnn_cifar", "cnn_fedavg"])
@pytest.mark.parametrize("clip", [0.05, 1e4])  # every sample clipped / none clipped
def test_clipped_sum_equals_the_one_sample_at_a_time_reference(path, name, clip):
    torch.manual_seed(0)
    shape = SHAPES.get(name, IMG)
    model = build_model(ModelConfig(name=name, hidden=16), shape, 10, seed=1)
    loss = loss_fn(name)
    x, y = torch.randn(6, *shape), torch.randint(0, 10, (6,))
    assert_close_to_float64(*path_against_reference(path, model, loss, x, y, clip))


def planted_near_tie():
    """A model and batch whose float32 forward lands exactly on a ReLU's kink where float64 does not:
    h = x0 + x1 rounds 1 + 1e-8 to 1 in float32 (one rounding, whatever the kernel's order), so
    z = h - 1 is 0 (no gradient through the ReLU) where float64 has 1e-8 (gradient 1); the max-pool
    after it then sees an exact tie between 0 and 0, which the kernel breaks its own way."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(2, 1, 1, bias=False),
        nn.Conv2d(1, 1, 1),
        nn.ReLU(),
        nn.MaxPool2d((1, 2)),
        nn.Flatten(),
        nn.Linear(2, 3),
    )
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        model[1].weight.fill_(1.0)
        model[1].bias.fill_(-1.0)
    x = torch.zeros(2, 2, 1, 4)
    x[:, 0] = torch.tensor([1.0, 1.0, 2.0, 1.5])
    x[0, 1, 0, 0] = 1e-8
    return model, x, torch.tensor([0, 2])


@pytest.mark.parametrize("path", ["bk", "hooks"])
def test_the_reference_follows_the_float32_route_through_a_planted_near_tie(path):
    model, x, y = planted_near_tie()
    loss = loss_fn("mlp")
    pristine = copy.deepcopy(model)
    got, route = private_clipped_sum(path, model, loss, x, y, 1e4)
    assert not route["2"][0, 0, 0, 0]  # float32 took the kink's flat side; float64's own route would not
    assert_close_to_float64(got, reference_clipped_sum(pristine, loss, x, y, 1e4, route))
    own_route = reference_clipped_sum(pristine, loss, x, y, 1e4)
    with pytest.raises(AssertionError):  # the reference that picks its own way fails the same path
        assert_close_to_float64(got, own_route)


@pytest.mark.parametrize("name", ["cnn_fmnist", "cnn_cifar", "cnn_fedavg"])
def test_bk_is_exact_in_channels_last(name):
    """Opacus 1.6's unfold2d assumes NCHW strides and is silently wrong on channels_last: bk is not."""
    torch.manual_seed(0)
    shape = SHAPES.get(name, IMG)
    x, y = torch.randn(5, *shape), torch.randint(0, 10, (5,))
    model = build_model(ModelConfig(name=name), shape, 10, seed=1)
    model.to(memory_format=torch.channels_last)
    x = x.contiguous(memory_format=torch.channels_last)
    assert_close_to_float64(*path_against_reference("bk", model, loss_fn(name), x, y, 0.1))


CONVS = [
    dict(kernel_size=4, padding="same", bias=False),  # even kernel: asymmetric padding
    dict(kernel_size=3, dilation=2, stride=(2, 1), padding=(1, 2)),
    dict(kernel_size=(3, 2), padding=1, padding_mode="reflect"),
    dict(kernel_size=3, padding=2, padding_mode="circular", stride=3),
    dict(kernel_size=2, padding="valid", padding_mode="replicate"),
]


@pytest.mark.parametrize("way", CONV_WAYS)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("conv", CONVS)
def test_bk_conv_per_sample_gradients_are_exact_for_any_padding_stride_and_dilation(conv, channels_last, way):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, **conv), nn.Tanh(), nn.Flatten(), nn.LazyLinear(5))
    x, y = torch.randn(4, 3, 9, 8), torch.randint(0, 5, (4,))
    model(x)  # materialise the lazy layer
    loss = loss_fn("mlp")
    if channels_last:
        model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    with conv_way_forced(way):
        assert_close_to_float64(*path_against_reference("bk", model, loss, x, y, 0.2))


@pytest.mark.parametrize("conv", [*CONVS, dict(kernel_size=8, stride=2, padding=2), dict(kernel_size=5)])
@pytest.mark.parametrize("cin", [1, 3, 16])
def test_indexed_and_strided_windows_give_the_same_per_sample_gradients_bit_for_bit(conv, cin):
    torch.manual_seed(0)
    layer = nn.Conv2d(cin, 4, **conv).to(memory_format=torch.channels_last)
    a = torch.randn(3, cin, 12, 11).contiguous(memory_format=torch.channels_last)
    b = torch.randn_like(layer(a)).contiguous(memory_format=torch.channels_last)
    got = {}
    for way in CONV_WAYS:
        with conv_way_forced(way):
            got[way] = dp_step.conv_per_sample_grads(layer, a, b)
    assert torch.equal(got["strided"][0], got["indexed"][0])
    # the grouped convolution sums in its own order: the same gradients to float32 rounding
    (weight, bias), (grouped_weight, grouped_bias) = got["strided"], got["grouped"]
    assert torch.allclose(grouped_weight, weight, rtol=0, atol=1e-6 * weight.abs().max().item())
    assert bias is grouped_bias is None if conv.get("bias") is False else torch.equal(grouped_bias, bias)


def test_the_grouped_way_is_taken_on_cpu_for_many_positions_and_long_windows_only():
    """As bench.dp_step --windows measured: cnn_cifar's 32x32 and 16x16 layers of 32-64 channels."""
    cifar_wide, cifar_deep = nn.Conv2d(32, 32, 3, padding=1), nn.Conv2d(128, 128, 3, padding=1)
    fmnist_first = nn.Conv2d(1, 16, 8, stride=2, padding=2)
    cpu = torch.device("cpu")
    assert dp_step.conv_way(cifar_wide, 32 * 32, cpu) == dp_step.conv_way(cifar_wide, 16 * 16, cpu) == "grouped"
    assert dp_step.conv_way(cifar_deep, 8 * 8, cpu) == "strided"  # 64 positions: the bmm, runs of 384
    assert dp_step.conv_way(fmnist_first, 13 * 13, cpu) == "indexed"  # a 64-value window: the bmm, runs of 8
    assert dp_step.conv_way(cifar_wide, 32 * 32, torch.device("cuda")) == "strided"  # measured on CPU only


def test_sgd_steps_as_torch_optim_sgd_bit_for_bit():
    """dp_step.SGD stands in for torch.optim.SGD (no momentum, no weight decay) on the bk and
    plain paths; a parameter without a gradient is left as it is by both."""
    after = []
    for ours in (True, False):
        model = build_model(ModelConfig(name="cnn_fmnist"), IMG, 10, seed=3)
        params = list(model.parameters())
        before = [p.detach().clone() for p in params]
        opt = SGD(params, 0.37) if ours else torch.optim.SGD(params, lr=0.37)
        for step in range(3):
            opt.zero_grad(set_to_none=True)
            for i, p in enumerate(params[1:]):  # the first parameter gets no gradient
                p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * step + i))
            opt.step()
        after.append([p.detach().clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*after))
    assert torch.equal(after[0][0], before[0]) and not torch.equal(after[0][1], before[1])


@pytest.mark.parametrize("sigma", [0.0, 1.3])
def test_bk_noise_step_is_opacus_fast_gradient_clipping_bit_for_bit(sigma):
    """NoisedMean stands in for Opacus's DPOptimizerFastGradientClipping on the bk path: the same
    draws from the same generator, the same float operations, the same parameters after the step."""
    from opacus.optimizers import DPOptimizerFastGradientClipping

    after = []
    for ours in (True, False):
        model = build_model(ModelConfig(name="cnn_fmnist"), IMG, 10, seed=3)
        grads = [
            torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) for i, p in enumerate(model.parameters())
        ]
        gen = torch.Generator().manual_seed(7)
        if ours:
            opt = PrivateStep(model, "bk").optimizer(0.3, sigma, 0.8, 12.5, gen)
        else:
            opt = DPOptimizerFastGradientClipping(
                torch.optim.SGD(model.parameters(), lr=0.3),
                noise_multiplier=sigma,
                max_grad_norm=0.8,
                expected_batch_size=12.5,
                loss_reduction="mean",
                generator=gen,
            )
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            opt.step()
        after.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*after))


def test_the_bk_path_trains_without_importing_opacus_or_torchs_compiler():
    """Opacus's import, and torch.optim's first use (which imports torch._dynamo), each cost a
    worker ~2 s of CPU: only the hooks path (and the tests) may pay them."""
    code = (
        "import sys, torch; from nodes.training.dp_step import PrivateStep; "
        "from nodes.training.models import build_model; from nodes.contracts.schema import ModelConfig; "
        "m = build_model(ModelConfig(name='cnn_fmnist'), (1, 28, 28), 10, 0); "
        "s = PrivateStep(m, sys.argv[1]); o = s.optimizer(0.1, 1.0, 1.0, 4.0, "
        "torch.Generator()); s.backward(s.forward(torch.randn(4, 1, 28, 28)).sum(1), 1.0); o.step(); "
        "print('opacus' in sys.modules, 'torch._dynamo' in sys.modules)"
    )
    imported = {
        path: subprocess.run(
            [sys.executable, "-c", code, path], capture_output=True, text=True, check=True
        ).stdout.strip()
        for path in ("bk", "hooks")
    }
    assert imported == {"bk": "False False", "hooks": "True True"}


def test_bk_empty_batch_leaves_zero_gradients_for_a_pure_noise_step():
    model = build_model(ModelConfig(name="cnn_fmnist"), IMG, 10, seed=1)
    got, _ = private_clipped_sum(
        "bk", model, loss_fn("cnn_fmnist"), torch.zeros(0, *IMG), torch.zeros(0, dtype=torch.long), 1.0
    )
    assert all(float(g.abs().sum()) == 0.0 for g in got) and len(got) == 4 * 2


@pytest.mark.parametrize("name", sorted(MODEL_NAMES))
def test_auto_takes_bk_for_every_shipped_model(name):
    model = build_model(ModelConfig(name=name), SHAPES.get(name, IMG), 10, seed=0)
    assert choose_path(model, "auto") == "bk" and choose_path(model, "hooks") == "hooks"


def test_bk_refuses_layers_it_cannot_clip_and_auto_falls_back_to_opacus_hooks():
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 8), nn.LayerNorm(8), nn.Linear(8, 10))
    assert "not LayerNorm" in bk_problem(model)
    assert choose_path(model, "auto") == "hooks"
    with pytest.raises(ValueError, match="Linear and Conv2d layers only, not LayerNorm"):
        choose_path(model, "bk")
    with pytest.raises(ValueError, match=r"dp.per_sample = 'fast'"):
        choose_path(model, "fast")


def test_bk_refuses_a_layer_used_twice_in_one_pass():
    layer = nn.Linear(4, 4)
    model = nn.Sequential(layer, nn.ReLU(), layer)
    step = PrivateStep(model, "bk")
    out = step.forward(torch.randn(3, 4))
    with pytest.raises(ValueError, match="tied weights"):
        step.backward(out.pow(2).sum(1), 1.0)


DATA = {
    "mlp": [],  # synthetic vectors
    "cnn_fmnist": ["data.dataset=fashion_mnist", "data.max_train=300", "data.max_test=20"],
}


@pytest.mark.parametrize("model", sorted(DATA))
def test_trainer_update_is_the_same_on_either_path(model):
    """Same Poisson batches, same noise draws: the two paths differ by float rounding only."""
    if model != "mlp" and FASHION_MNIST is None:
        pytest.skip(FASHION_MNIST_MISSING)
    torch.set_num_threads(1)
    updates = []
    for path in ("bk", "hooks"):
        cfg = load(
            None,
            [
                "clients.n=2",
                "data.samples_per_client=40",
                "data.size_sigma=0",
                f"model.name={model}",
                f"dp.per_sample={path}",
                *DATA[model],
            ],
        )
        tr = build_trainer(cfg, load_federated(cfg.data, 2, cfg.seed), torch.device("cpu"))
        w0 = {k: v.copy() for k, v in state_to_numpy(tr.model).items()}  # the arrays alias the model
        new, _ = tr.train(3, ClientTask(client=1, steps=4, lr=0.5, sigma=1.0, clip=0.5, q=0.3), w0)
        updates.append({k: new[k] - w0[k] for k in new})
    assert min(np.abs(u).max() for u in updates[0].values()) > 0
    for k in updates[0]:
        np.testing.assert_allclose(updates[0][k], updates[1][k], rtol=1e-4, atol=1e-6)


def test_unknown_per_sample_path_is_one_line_naming_the_field():
    with pytest.raises(ConfigError, match=r"dp\.per_sample.*auto \| bk \| hooks"):
        load(None, ["dp.per_sample=vmap"])

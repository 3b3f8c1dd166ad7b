import copy
import hashlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator
from torch import nn

from nodes.contracts.schema import ModelConfig
from nodes.training.model_catalog import MODEL_LOSS, MODEL_NAMES, architecture, output_shapes, parameter_shapes
from nodes.training.models import (
    LOSSES,
    SlicedMaxPool2d,
    build_model,
    evaluation_sum,
    for_inference,
    loss_fn,
    loss_kind,
    num_params,
)
from tests.conftest import python_stdout

IMG = (1, 28, 28)
CIFAR = (3, 32, 32)
# a model on the input it was designed for
NATIVE = [
    ("logreg", IMG),
    ("linreg", IMG),
    ("mlp", IMG),
    ("mlp_talaei", IMG),
    ("mlp_wei", IMG),
    ("cnn_fmnist", IMG),
    ("cnn_cifar", CIFAR),
    ("cnn_fedavg", IMG),
]

# (model, input shape, classes, hidden) -> exact parameter count
PARAM_COUNTS = [
    ("logreg", (60,), 10, 64, 60 * 10 + 10),  # 610
    ("logreg", IMG, 10, 64, 784 * 10 + 10),  # 7,850
    ("mlp", (60,), 10, 64, (60 * 64 + 64) + (64 * 10 + 10)),  # 4,554
    ("mlp", IMG, 10, 32, (784 * 32 + 32) + (32 * 10 + 10)),  # 25,450
    # ALI-DPFL Table V CNN: conv 1->16 8x8 (1,040) + conv 16->32 4x4 (8,224)
    # + fc 512->32 (16,416) + fc 32->10 (330)
    ("cnn_fmnist", IMG, 10, 64, 26010),
    ("linreg", IMG, 10, 64, 784 * 10 + 10),  # 7,850
    # Talaei & Izadi MLP (hidden size not in the paper: 200) and Wei et al. MLP (256 hidden)
    ("mlp_talaei", IMG, 10, 64, (784 * 200 + 200) + (200 * 10 + 10)),  # 159,010
    ("mlp_wei", IMG, 10, 64, (784 * 256 + 256) + (256 * 10 + 10)),  # 203,530
    # ALI-DPFL Table VI CNN: convs 3->32 (896), 32->32 (9,248), 32->64 (18,496), 64->64 (36,928),
    # 64->128 (73,856), 128->128 (147,584) + fc 2048->128 (262,272) + fc 128->10 (1,290)
    ("cnn_cifar", CIFAR, 10, 64, 550570),
    # The ALI-DPFL code's FedAvgCNN: conv 1->32 5x5 (832) + conv 32->64 5x5 (51,264)
    # + fc 1024->512 (524,800) + fc 512->10 (5,130); on CIFAR-10 fc 1600->512
    ("cnn_fedavg", IMG, 10, 64, 582026),
    ("cnn_fedavg", CIFAR, 10, 64, 2432 + 51264 + 1600 * 512 + 512 + 5130),
]


def weights_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("name, shape, classes, hidden, count", PARAM_COUNTS)
def test_parameter_counts(name, shape, classes, hidden, count):
    model = build_model(ModelConfig(name=name, hidden=hidden), shape, classes, seed=0)
    assert num_params(model) == count


def test_table_v_cnn_count_is_26010():
    assert num_params(build_model(ModelConfig(name="cnn_fmnist"), IMG, 10, seed=0)) == 26010


def test_table_v_cnn_layers():
    m = build_model(ModelConfig(name="cnn_fmnist"), IMG, 10, seed=0)
    convs = [layer for layer in m.modules() if isinstance(layer, nn.Conv2d)]
    pools = [layer for layer in m.modules() if isinstance(layer, nn.MaxPool2d)]
    fcs = [layer for layer in m.modules() if isinstance(layer, nn.Linear)]
    assert [(c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == [
        (16, (8, 8), (2, 2), (2, 2)),
        (32, (4, 4), (2, 2), (0, 0)),
    ]
    assert [(p.kernel_size, p.stride) for p in pools] == [(2, 1), (2, 1)]
    assert [(f.in_features, f.out_features) for f in fcs] == [(32 * 4 * 4, 32), (32, 10)]
    assert not any(isinstance(layer, (nn.BatchNorm1d, nn.BatchNorm2d)) for layer in m.modules())


def test_table_vi_cnn_layers():
    m = build_model(ModelConfig(name="cnn_cifar"), CIFAR, 10, seed=0)
    convs = [layer for layer in m.modules() if isinstance(layer, nn.Conv2d)]
    pools = [layer for layer in m.modules() if isinstance(layer, nn.MaxPool2d)]
    fcs = [layer for layer in m.modules() if isinstance(layer, nn.Linear)]
    assert [(c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == [
        (w, (3, 3), (1, 1), (1, 1)) for w in (32, 32, 64, 64, 128, 128)
    ]
    assert [(p.kernel_size, p.stride) for p in pools] == [(2, 2)] * 3
    assert [(f.in_features, f.out_features) for f in fcs] == [(128 * 4 * 4, 128), (128, 10)]
    assert sum(isinstance(layer, nn.ReLU) for layer in m.modules()) == 7


@pytest.mark.parametrize(
    "name, shape",
    [("logreg", (60,)), ("mlp", (60,)), ("linreg", (60,)), ("mlp_wei", (60,))]
    + NATIVE
    + [("cnn_fmnist", CIFAR), ("cnn_cifar", IMG)],
)
def test_forward_shape_and_validator(name, shape):
    model = build_model(ModelConfig(name=name), shape, 7, seed=1)
    out = model(torch.randn(5, *shape))
    assert out.shape == (5, 7) and out.dtype == torch.float32
    assert ModuleValidator.validate(model, strict=True) == []


def test_cnn_rejects_flat_input_and_unknown_name():
    for cnn in ("cnn_fmnist", "cnn_cifar", "cnn_fedavg"):
        with pytest.raises(ValueError, match=cnn):
            build_model(ModelConfig(name=cnn), (60,), 10, seed=0)
    with pytest.raises(ValueError, match="too small"):
        build_model(ModelConfig(name="cnn_cifar"), (3, 4, 4), 10, seed=0)
    with pytest.raises(ValueError, match=r"model.name"):
        build_model(ModelConfig(name="resnet"), IMG, 10, seed=0)
    assert set(MODEL_NAMES) == {
        "logreg",
        "linreg",
        "mlp",
        "mlp_talaei",
        "mlp_wei",
        "cnn_fmnist",
        "cnn_cifar",
        "cnn_fedavg",
    }


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # Opacus hooks, inputs need no grad
@pytest.mark.parametrize("name, shape", [("logreg", (60,)), ("mlp", (60,))] + NATIVE)
def test_one_dp_sgd_step_changes_weights(name, shape):
    model = build_model(ModelConfig(name=name, hidden=16), shape, 10, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gsm = GradSampleModule(model)
    opt = DPOptimizer(
        torch.optim.SGD(gsm.parameters(), lr=0.5), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=8
    )
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, *shape, generator=g), torch.randint(0, 10, (8,), generator=g)
    opt.zero_grad()
    loss_fn(name)(gsm(x), y, reduction="mean").backward()
    for p in gsm.parameters():
        assert p.grad_sample is not None and p.grad_sample.shape == (8, *p.shape)
    opt.step()
    after = model.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before)


# --- losses -----------------------------------------------------------------------------


def test_every_model_has_a_loss():
    assert set(MODEL_LOSS) == set(MODEL_NAMES) and set(MODEL_LOSS.values()) <= set(LOSSES)
    assert loss_kind("linreg") == "mse"
    assert {loss_kind(n) for n in MODEL_NAMES if n != "linreg"} == {"cross_entropy"}
    with pytest.raises(ValueError, match=r"model.name"):
        loss_kind("resnet")


@pytest.mark.parametrize("rows", [1, 64, 1024])
def test_the_evaluations_summed_loss_is_the_losss_sum_within_float32_rounding(rows):
    """Cross-entropy as logsumexp less the target's output (nodes.training.models.evaluation_sum): float32 rounding
    of each row's loss (a few ulps of its largest terms, as torch's log_softmax) summed over the rows;
    the squared error exactly as its own sum."""
    g = torch.Generator().manual_seed(rows)
    out, y = 10 * torch.randn(rows, 10, generator=g), torch.randint(0, 10, (rows,), generator=g)
    exact = nn.functional.cross_entropy(out.double(), y, reduction="none")
    ulps = 8 * torch.finfo(torch.float32).eps * (out.double().abs().amax(1) + exact)
    ce = loss_fn("logreg")
    for summed in (evaluation_sum(ce, out, y), ce(out, y, reduction="sum")):
        assert summed.dtype == torch.float32 and abs(summed.double() - exact.sum()) <= ulps.sum()
    mse = loss_fn("linreg")
    assert torch.equal(evaluation_sum(mse, out, y), mse(out, y, reduction="sum"))


def test_cross_entropy_matches_torch_and_reductions_agree():
    g = torch.Generator().manual_seed(0)
    out, y = torch.randn(6, 10, generator=g), torch.randint(0, 10, (6,), generator=g)
    ce = loss_fn("cnn_fmnist")
    assert torch.allclose(ce(out, y, reduction="mean"), nn.functional.cross_entropy(out, y))
    per = ce(out, y, reduction="none")
    assert per.shape == (6,) and torch.allclose(ce(out, y, reduction="sum"), per.sum())
    with pytest.raises(ValueError, match="reduction"):
        ce(out, y, reduction="max")


def test_squared_error_against_one_hot():
    out = torch.tensor([[0.5, 0.0, 0.0], [0.0, 2.0, 1.0]])
    y = torch.tensor([0, 2])
    mse = loss_fn("linreg")
    # sample 0: (0.5-1)^2 = 0.25; sample 1: 2^2 + (1-1)^2 = 4
    assert torch.allclose(mse(out, y, reduction="none"), torch.tensor([0.25, 4.0]))
    assert torch.allclose(mse(out, y, reduction="sum"), torch.tensor(4.25))
    assert torch.allclose(
        mse(out, y, reduction="mean"), nn.functional.mse_loss(out, nn.functional.one_hot(y, 3).float()) * 3
    )
    # a float target is used as is (real-valued regression)
    assert torch.allclose(
        mse(torch.tensor([[1.0], [3.0]]), torch.tensor([0.0, 1.0]), reduction="none"), torch.tensor([1.0, 4.0])
    )


def test_build_model_deterministic_and_seeded():
    cfg = ModelConfig(name="cnn_fmnist")
    rng_before = torch.get_rng_state()
    a, b = build_model(cfg, IMG, 10, seed=3), build_model(cfg, IMG, 10, seed=3)
    assert torch.equal(torch.get_rng_state(), rng_before)  # global torch RNG untouched
    assert weights_digest(a) == weights_digest(b)
    torch.manual_seed(123)  # global state does not leak in
    assert weights_digest(build_model(cfg, IMG, 10, seed=3)) == weights_digest(a)
    assert weights_digest(build_model(cfg, IMG, 10, seed=4)) != weights_digest(a)


@pytest.mark.parametrize("name, shape", NATIVE)
def test_every_model_deterministic_under_the_seed(name, shape):
    cfg = ModelConfig(name=name)
    a = weights_digest(build_model(cfg, shape, 10, seed=5))
    assert weights_digest(build_model(cfg, shape, 10, seed=5)) == a
    assert weights_digest(build_model(cfg, shape, 10, seed=6)) != a


def test_build_model_identical_in_another_process():
    cfg = ModelConfig(name="mlp")
    here = weights_digest(build_model(cfg, IMG, 10, seed=9))
    code = (
        "import hashlib;from nodes.contracts.schema import ModelConfig;from nodes.training.models import build_model;"
        "m=build_model(ModelConfig(name='mlp'),(1,28,28),10,seed=9);h=hashlib.sha256()\n"
        "for k,v in m.state_dict().items(): h.update(k.encode()); h.update(v.numpy().tobytes())\n"
        "print(h.hexdigest())"
    )
    assert python_stdout(code, env={"OMP_NUM_THREADS": "1"}) == here


@pytest.mark.parametrize("name, shape", [("logreg", (60,)), ("mlp", (60,))] + NATIVE + [("cnn_fedavg", CIFAR)])
def test_the_architecture_gives_the_built_models_parameters_and_layer_outputs(name, shape):
    """What the server knows of a model before it imports torch (nodes.training.model_catalog): its state_dict's
    keys and shapes in order, and every layer's output shape, are those of the torch model."""
    cfg = ModelConfig(name=name, hidden=37)
    layers = architecture(cfg, shape, 7)
    model = build_model(cfg, shape, 7, seed=0)
    assert parameter_shapes(layers) == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    outputs: list[tuple[int, ...]] = []
    for m in model:
        m.register_forward_hook(lambda _m, _i, out: outputs.append(tuple(out.shape)))
    model(torch.zeros(1, *shape))
    assert output_shapes(layers, shape) == outputs


@pytest.mark.parametrize("name", ["cnn_fedavg", "mlp", "linreg"])
def test_the_evaluation_batch_changes_neither_accuracy_nor_loss_beyond_rounding(name):
    # dp.batch_eval is a speed setting (bench.eval_batch): every sample counted once, whatever the
    # chunking, the last chunk a short one included
    from nodes.training.trainer import evaluate

    model = build_model(ModelConfig(name=name), IMG, 10, seed=3)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(600, *IMG, generator=gen), torch.randint(0, 10, (600,), generator=gen)
    whole = evaluate(model, x, y, 600, loss_fn(name))
    with torch.no_grad():  # a sample whose two top logits float32 rounding may swap can flip either way
        top2 = copy.deepcopy(model).double()(x.double()).topk(2, dim=1).values
    ambiguous = int((top2[:, 0] - top2[:, 1] < 1e-4 * top2.abs().max()).sum())
    for batch in (1, 7, 256, 1024):
        loss, acc = evaluate(model, x, y, batch, loss_fn(name))
        assert abs(acc - whole[1]) * len(y) <= ambiguous and loss == pytest.approx(whole[0], rel=1e-5), batch
    assert 0 < whole[0] and 0 <= whole[1] <= 1


@pytest.mark.parametrize("kernel, stride", [((2, 2), (2, 2)), ((2, 2), (1, 1)), ((3, 3), (2, 2)), ((2, 3), (3, 1))])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_sliced_max_pool_gives_max_pool2ds_values_ties_infinities_and_nans_included(kernel, stride, layout):
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (2, 5, 9, 11), generator=gen).float()  # few values: many ties
    x[0, 0, 0, :3] = -torch.inf
    x[1, 2, 4, 4] = torch.inf
    x[1, 3, 3, 5] = torch.nan  # row 3: inside a window of every (kernel, stride) here
    x = x.contiguous(memory_format=layout)
    want = nn.functional.max_pool2d(x, kernel, stride)
    got = SlicedMaxPool2d(kernel, stride)(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert got.isnan().any() and got.isinf().any()
    with pytest.raises(RuntimeError):  # an input smaller than the kernel: max_pool2d's error
        SlicedMaxPool2d((3, 3), (1, 1))(torch.zeros(1, 1, 2, 5))


@pytest.mark.parametrize("name, shape", NATIVE)
def test_the_inference_copy_gives_the_same_outputs_bit_for_bit_and_leaves_the_model_alone(name, shape):
    model = build_model(ModelConfig(name=name), shape, 10, seed=2)
    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    fast = for_inference(model)
    assert model.training and not fast.training
    assert [m for m in model.modules() if isinstance(m, nn.MaxPool2d)] == pools  # the original untouched
    assert not any(isinstance(m, nn.MaxPool2d) for m in fast.modules())
    assert sum(isinstance(m, SlicedMaxPool2d) for m in fast.modules()) == len(pools)
    x = torch.randn(33, *shape, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for layout in (torch.contiguous_format, torch.channels_last) if len(shape) == 3 else (torch.contiguous_format,):
            xs = x.contiguous(memory_format=layout)
            assert torch.equal(fast.to(memory_format=layout)(xs), model.eval().to(memory_format=layout)(xs))


def test_a_padded_or_dilated_max_pool_stays_torchs():
    model = nn.Sequential(nn.MaxPool2d(2, padding=1), nn.MaxPool2d(2, dilation=2), nn.MaxPool2d(2, ceil_mode=True))
    assert [type(m) for m in for_inference(model)] == [nn.MaxPool2d] * 3


@pytest.mark.parametrize(("name", "default"), [("cnn_fmnist", 64), ("cnn_fedavg", 64), ("logreg", 1024), ("mlp", 1024)])
def test_the_evaluation_batch_is_by_model_at_0_and_as_set_otherwise(name, default):
    from nodes.training.model_catalog import evaluation_batch
    from nodes.training.trainer import GlobalEvaluation

    assert evaluation_batch(name, 0) == default and evaluation_batch(name, 7) == 7
    test = (np.zeros((3, *IMG), np.float32), np.zeros(3, np.int64))
    data = SimpleNamespace(input_shape=IMG, num_classes=10, test=lambda: test)
    for b, expected in ((0, default), (7, 7)):
        evaluation = GlobalEvaluation(data, torch.device("cpu"), model=ModelConfig(name=name), seed=0, batch_eval=b)
        assert evaluation.batch == expected


def test_the_conv_nets_are_the_models_with_a_conv_layer():
    from nodes.training.model_catalog import CONV_NETS, Conv2d

    assert {name for name, _ in NATIVE} == set(MODEL_NAMES)
    layers = {name: architecture(ModelConfig(name=name), shape, 10) for name, shape in NATIVE}
    assert {name for name, arch in layers.items() if any(isinstance(layer, Conv2d) for _, layer in arch)} == CONV_NETS

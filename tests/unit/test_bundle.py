"""train.bundle = K: a bundle of clients trained as one computation (nodes.training.bundle) gives each client its
K = 1 update (nodes.training.trainer.Trainer.train) within float32 rounding, on every model of the catalog, with
clipping active and not, empty and full Poisson batches and every task mechanism; padded samples
contribute nothing; each client's sampler and noise draws, made a block or a row at a time, are the streams
Trainer.train draws; and the server's cut into bundles is a pure function of the round's clients and K."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from emulator.config import load
from nodes.contracts.rng import seed_int
from nodes.contracts.schema import DataConfig, ModelConfig
from nodes.contracts.tasks import ClientTask
from nodes.data import load_federated
from nodes.data.federated import FederatedData
from nodes.training import bundle
from nodes.training.bundle import Batch, BundleTrainer, SamplerDraws, StepNoise, bundle_problem
from nodes.training.model_catalog import MODEL_NAMES
from nodes.training.trainer import Trainer, build_trainer, perturbs, state_to_numpy
from nodes.transport.dispatch import cut_bundles

# Each step's sums are float32 sums of up to ~10^3 products (the CNNs' windows and positions), carrying
# a relative error of up to ~10^3 * 2^-24 ~ 1e-4 of the terms summed, over a few steps: an update is held
# to 1e-4 of its largest entry (test_dp_step's tolerance), an entry near 0 to that scale.
RTOL = 1e-4
EPS32 = float(np.finfo(np.float32).eps)  # and each step rounds every weight it writes: an ulp of |w| per step
IMAGES = {"cnn_fmnist": (1, 28, 28), "cnn_fedavg": (1, 28, 28), "cnn_cifar": (3, 32, 32)}
SAMPLES = 12


class GeneratedImages(FederatedData):
    """Clients of `samples` random images each (a CNN's designed input shape), labels at random: no dataset
    file needed, gradients every which way."""

    def __init__(self, shape: tuple[int, ...], n_clients: int, samples: int = SAMPLES):
        self.input_shape, self.num_classes, self.n_clients, self.samples = shape, 10, n_clients, samples

    @property
    def sizes(self) -> list[int]:
        return [self.samples] * self.n_clients

    def _build(self, k: int):
        rng = np.random.default_rng(k)
        x = rng.standard_normal((self.samples, *self.input_shape)).astype(np.float32)
        return x, rng.integers(0, 10, self.samples).astype(np.int64)

    def test(self):
        return self._build(0)


def trainer(model: str, n_clients: int = 4, empty_batch: str = "noise") -> Trainer:
    if model in IMAGES:
        return Trainer(
            GeneratedImages(IMAGES[model], n_clients),
            torch.device("cpu"),
            model=ModelConfig(name=model),
            data_cfg=DataConfig(),
            seed=3,
            per_sample="auto",
            batch_eval=64,
            batch_divisor=0.0,
            empty_batch=empty_batch,
        )
    cfg = load(None, [f"clients.n={n_clients}", "data.samples_per_client=30", f"model.name={model}"])
    cfg.dp.empty_batch = empty_batch
    return build_trainer(cfg, load_federated(cfg.data, n_clients, cfg.seed), torch.device("cpu"))


def initial(tr: Trainer) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in state_to_numpy(tr.model).items()}  # the arrays alias the model


def assert_same_updates(tr: Trainer, tasks: list[ClientTask], rnd: int = 2) -> None:
    """The bundle's stacked pass gives each task its own Trainer.train update and metrics."""
    w0 = initial(tr)
    alone = [tr.train(rnd, t, w0) for t in tasks]
    stacked = BundleTrainer(tr).train_stacked(rnd, tasks, w0)
    for t, (want, want_m), got in zip(tasks, alone, stacked):
        assert not isinstance(got, Exception), got
        new, metrics = got
        scale = max(float(np.abs(want[k] - w0[k]).max()) for k in want)
        assert np.isfinite(scale)
        for k in want:
            assert new[k].dtype == want[k].dtype and new[k].shape == want[k].shape and new[k].flags.c_contiguous
            tol = RTOL * (scale + np.abs(want[k] - w0[k])) + 2 * (t.steps + 1) * EPS32 * np.abs(want[k])
            assert np.all(np.abs(new[k] - want[k]) <= tol), (k, float(np.abs(new[k] - want[k]).max()))
        assert metrics["steps"] == want_m["steps"]
        np.testing.assert_allclose(metrics["update_norm"], want_m["update_norm"], rtol=RTOL)
        np.testing.assert_allclose(metrics["train_loss"], want_m["train_loss"], rtol=RTOL, equal_nan=True)
        assert (scale > 0) == (t.steps > 0 and (t.sigma > 0 or t.q > 0))
    arrays = [a for got in stacked if not isinstance(got, Exception) for a in got[0].values()]
    assert not any(np.shares_memory(a, b) for i, a in enumerate(arrays) for b in arrays[:i])  # no two alias


def dp_tasks(n: int, **fields) -> list[ClientTask]:
    return [ClientTask(client=c, steps=3, lr=0.2, sigma=1.0, clip=1.0, q=0.3, **fields) for c in range(n)]


@pytest.mark.parametrize("model", MODEL_NAMES)
@pytest.mark.parametrize(("clip", "q"), [(1e-3, 0.5), (1e6, 0.5), (1e-3, 1.0), (1.0, 1e-3)], ids=str)
def test_each_clients_update_is_its_own_on_every_model(model, clip, q):
    """Clipping active (C = 1e-3) and not (C = 1e6); full batches (q = 1) and mostly empty ones (q = 1e-3)."""
    torch.set_num_threads(1)
    tr = trainer(model)
    assert bundle_problem(tr.model) == ""
    sigma = min(1.0, 0.01 / clip)  # noise of std sigma * C at most 0.01: the model stays finite
    tasks = [replace(t, clip=clip, q=q, sigma=sigma * (0.5 if c % 2 else 1.0)) for c, t in enumerate(dp_tasks(4))]
    assert_same_updates(tr, tasks)


def test_an_all_empty_step_is_pure_noise_as_alone():
    tr = trainer("mlp", 3)
    tasks = [replace(t, q=1e-9) for t in dp_tasks(3)]
    assert_same_updates(tr, tasks)


@pytest.mark.parametrize(
    "changes",
    [
        {"sigma": 0.0, "clip": 0.0},  # plain SGD
        {"prox_mu": 0.5},  # FedProx
        {"update_clip": 0.01},
        {"weight_clip": 1.0},
        {"output_noise": "gaussian", "output_noise_scale": 0.1},
        {"output_noise": "laplace", "output_noise_scale": 0.1},
        {"sigma": 0.0},  # clipped, not noised
    ],
    ids=str,
)
def test_task_mechanisms_match_the_trainer(changes):
    torch.set_num_threads(1)
    assert_same_updates(trainer("mlp"), [replace(t, **changes) for t in dp_tasks(4)])


def test_per_client_steps_and_settings_mask_the_clients_that_are_done():
    """Per-client tau (partial work, ALI-DPFL's tau): a client past its steps is left as it is."""
    tasks = [
        replace(t, steps=s, lr=lr, q=q)
        for t, s, lr, q in zip(dp_tasks(4), (1, 4, 0, 2), (0.1, 0.2, 0.3, 0.4), (0.2, 0.5, 0.3, 1.0))
    ]
    assert_same_updates(trainer("logreg"), tasks)


def test_skipped_empty_batches_take_no_step_as_alone():
    tr = trainer("logreg", 4, empty_batch="skip")
    assert tr.skip_empty
    assert_same_updates(tr, [replace(t, q=0.05, steps=6) for t in dp_tasks(4)])


def test_padded_samples_contribute_nothing():
    """Whatever a padded row holds, the clipped sums and losses are those of the zero padding, bit for bit;
    and a client bundled with larger batches gets the sums it has alone."""
    torch.set_num_threads(1)
    tr = trainer("mlp", 2)
    bt = BundleTrainer(tr)
    w0 = initial(tr)
    tasks = dp_tasks(2, prox_mu=0.0)
    hyper = bt._hyper(0, tasks, [30, 30])
    params = [torch.from_numpy(w0[n]).unsqueeze(0).repeat(2, *[1] * w0[n].ndim) for n in bt.names]
    x0, y0 = tr.client_data(0, 0)
    x1, y1 = tr.client_data(0, 1)
    width = 7
    x = torch.zeros(2 * width, x0.shape[1])
    y = torch.zeros(2 * width, dtype=y0.dtype)
    x[:3], y[:3] = x0[:3], y0[:3]  # client 0: 3 samples, padded by 4
    x[width:], y[width:] = x1[:width], y1[:width]  # client 1: a full batch
    valid = torch.zeros(2 * width)
    valid[:3], valid[width:] = 1, 1
    clean, loss = bt._clipped_sums(params, Batch(x, y, valid, torch.tensor([3, width])), hyper, 2)
    garbage = x.clone()
    garbage[3:width] = 1e3 * torch.randn(width - 3, x.shape[1])
    dirty, dirty_loss = bt._clipped_sums(params, Batch(garbage, y, valid, torch.tensor([3, width])), hyper, 2)
    for a, b in zip(clean, dirty):
        assert torch.equal(a, b)
    assert torch.equal(loss, dirty_loss) and loss[3:width].eq(0).all()
    one = [p[:1] for p in params]
    h1 = bt._hyper(0, tasks[:1], [30])
    alone, _ = bt._clipped_sums(one, Batch(x[:3], y[:3], torch.ones(3), torch.tensor([3])), h1, 1)
    for a, b in zip(clean, alone):
        np.testing.assert_allclose(a[0].numpy(), b[0].numpy(), rtol=RTOL, atol=RTOL * float(b.abs().max()))


def test_a_task_that_reports_its_own_pass_falls_back_to_the_trainer():
    """report_last_step and report_grad_diff (ALI-DPFL) are trained alone: the same update bit for bit."""
    tr = trainer("logreg", 3)
    w0 = initial(tr)
    tasks = dp_tasks(3)
    tasks[1] = replace(tasks[1], report_last_step=True, report_grad_diff=True)
    got = BundleTrainer(tr).train(1, tasks, w0)
    new, metrics = got[1]
    want, want_m = tr.train(1, tasks[1], w0)
    assert metrics == want_m and "last_step_change" in metrics
    assert all(np.array_equal(new[k], want[k]) for k in want)


def test_a_clients_failure_is_its_own():
    tr = trainer("logreg", 3)
    tasks = dp_tasks(3)
    tasks[2] = replace(tasks[2], output_noise="uniform", output_noise_scale=1.0)
    got = BundleTrainer(tr).train(0, tasks, initial(tr))
    assert isinstance(got[2], ValueError) and "output_noise" in str(got[2])
    assert not isinstance(got[0], Exception) and not isinstance(got[1], Exception)


@pytest.mark.parametrize("k", [1, 2, 3, 7, 100])
def test_bundles_are_the_rounds_clients_in_id_order_cut_every_k(k):
    clients = [9, 2, 14, 0, 5, 7, 3]
    cut = cut_bundles(clients, k)
    assert [c for b in cut for c in b] == sorted(clients)
    assert all(0 < len(b) <= k for b in cut) and all(len(b) == k for b in cut[:-1])
    assert cut == cut_bundles(list(reversed(clients)), k)  # the plan's order does not matter
    assert cut_bundles([], k) == []


def generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("shape", [(1,), (3,), (15,), (16,), (17,), (10, 60), (2, 3, 5, 5)], ids=str)
def test_normal_in_place_into_a_row_is_the_stream_of_torch_normal(shape):
    """torch's CPU normal_ fills fewer than 16 entries serially and 16 or more vectorised: both paths."""
    g, h = generators(5)
    rows = torch.zeros(3, *shape)
    for std in (0.7, 2.0, 0.7):
        want = torch.normal(0, std, shape, generator=g)
        rows[1].normal_(0, std, generator=h)
        assert torch.equal(rows[1], want)
    assert rows[0].eq(0).all() and rows[2].eq(0).all()


def test_step_noise_is_each_active_private_clients_own_and_zero_elsewhere():
    """fc.weight (600 entries) and fc.bias (10: torch's serial path): each drawing client's rows are
    Trainer.train's torch.normal draws from its key ^ 0x5EED generator, step after step; the rows of an
    inactive or non-private client are 0, also after it drew at an earlier step."""
    tr = trainer("logreg", 4)
    bt = BundleTrainer(tr)
    tasks = [replace(t, sigma=1.0 + t.client) for t in dp_tasks(4)]
    tasks[3] = replace(tasks[3], sigma=0.0, clip=0.0)  # not private: never noised
    h = bt._hyper(1, tasks, [30] * 4)
    shapes = [tuple(tr.model.state_dict()[n].shape) for n in bt.names]
    noise = StepNoise([torch.zeros(4, *s) for s in shapes], h)
    own = [torch.Generator().manual_seed(seed_int(tr.seed, "train", 1, t.client) ^ 0x5EED) for t in tasks]
    for active in ([True] * 4, [True, False, True, True], [False, False, False, True], [True, True, False, True]):
        got = noise.draw(active)
        drawing = [a and t.sigma > 0 for a, t in zip(active, tasks)]
        if not any(drawing):
            assert got is None
            continue
        assert got is not None
        for i, t in enumerate(tasks):
            for z, shape in zip(got, shapes):
                want = torch.normal(0, t.sigma * t.clip, shape, generator=own[i]) if drawing[i] else torch.zeros(shape)
                assert torch.equal(z[i], want)


@pytest.mark.parametrize("n", [3, 17, 1000, 70000])
def test_one_draw_for_all_steps_is_the_stream_of_a_draw_per_step(n):
    """torch's CPU uniform fills serially: torch.rand(steps * n) is the steps' torch.rand(n) one after another."""
    g, h = generators(9)
    assert torch.equal(
        torch.rand(5 * n, generator=h).view(5, n), torch.stack([torch.rand(n, generator=g) for _ in range(5)])
    )


def test_a_float32_tensor_is_compared_with_q_in_float32():
    """Trainer.train's `torch.rand(n) < q`: at u = float32(0.7) < 0.7 it says False, as a float32 q does."""
    u = torch.tensor([np.float32(0.7)])
    assert float(u) < 0.7
    assert not bool(u < 0.7) and not bool(u < torch.tensor([0.7], dtype=torch.float32))


@pytest.mark.parametrize("block_steps", [1, 2, 100])
def test_sampler_draws_are_each_clients_step_by_step_masks(monkeypatch, block_steps):
    """Clients of 3, 17, 1000, 16 samples and 1, 4, 0, 3 steps: each step's masks are Trainer.train's
    `torch.rand(n, generator=sampler) < q` from each client's sampler; a client past its steps has none;
    whatever the block of steps drawn at once."""
    tr = trainer("logreg", 4)
    sizes, steps = [3, 17, 1000, 16], [1, 4, 0, 3]
    tasks = [replace(t, steps=s, q=q) for t, s, q in zip(dp_tasks(4), steps, (0.2, 0.7, 0.3, 1.0))]
    monkeypatch.setattr(bundle, "DRAW_BLOCK", block_steps * sum(sizes))
    h = BundleTrainer(tr)._hyper(4, tasks, sizes)
    draws = SamplerDraws(h, sizes)
    assert draws.q.dtype == torch.float32 and draws.block == block_steps
    own = [torch.Generator().manual_seed(seed_int(tr.seed, "train", 4, t.client)) for t in tasks]
    for s in range(max(steps)):
        want = [
            torch.rand(n, generator=g) < t.q if s < t.steps else torch.zeros(n, dtype=torch.bool)
            for n, g, t in zip(sizes, own, tasks)
        ]
        assert torch.equal(draws.mask(s), torch.cat(want))


def test_update_norms_block_by_block_are_the_trainers_formula(monkeypatch):
    rng = np.random.default_rng(0)
    global_model = [rng.standard_normal((10, 6)).astype(np.float32), rng.standard_normal(10).astype(np.float32)]
    stack = [(w + rng.standard_normal((5, *w.shape))).astype(np.float32) for w in global_model]
    want = [
        np.sqrt(sum(np.sum((a[i].astype(np.float64) - w) ** 2) for a, w in zip(stack, global_model))) for i in range(5)
    ]
    for block in (1, 7, 1 << 20):
        monkeypatch.setattr(bundle, "NORM_BLOCK", block)
        np.testing.assert_allclose(bundle._update_norms(stack, global_model), want, rtol=1e-13)


@pytest.mark.parametrize(
    "changes",
    [{}, {"weight_clip": 0.0}, {"update_clip": -1.0}, {"output_noise": "none", "output_noise_scale": 0.5}],
    ids=str,
)
def test_a_task_that_perturbs_nothing_is_left_as_trained(changes):
    """Tasks for which the bundle skips Trainer._perturb: it would leave their parameters bit for bit."""
    task = replace(dp_tasks(1)[0], **changes)
    assert not perturbs(task)
    tr = trainer("logreg", 1)
    params = [torch.randn(10, 60), torch.randn(10)]
    before = [p.clone() for p in params]
    tr._perturb(0, task, params, [torch.zeros_like(p) for p in params])
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    for more in ({"weight_clip": 1.0}, {"update_clip": 1.0}, {"output_noise": "gaussian"}, {"output_noise": "x"}):
        assert perturbs(replace(task, **more))

"""aggregate.max_update_norm (emulator.aggregate.plausibility) and the finite-model check (emulator.rounds.round): the
derived bound holds for worst-case DP-SGD updates over many seeded draws and for real honest updates of
every model of the catalog, is exceeded by a scaled one, and rejects the poisoned replies of every codec
as `implausible`; without a bound, a model that becomes non-finite stops the round in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.aggregate.compression import Compression
from emulator.aggregate.plausibility import SLACK, UpdateBounds, norm, trained_bound
from emulator.config import ConfigError, load, round_settings
from emulator.policies import POLICIES, RunContext
from emulator.rounds.budgets import Budgets
from emulator.rounds.round import ModelNotFinite, client_job, play_round
from emulator.timemodel.clock import Clock, Outcome
from emulator.timemodel.resources import build_resources
from nodes import worker
from nodes.contracts import protocol
from nodes.contracts.schema import DataConfig, ModelConfig
from nodes.contracts.tasks import ClientTask
from nodes.training.model_catalog import MODEL_NAMES
from nodes.training.trainer import Trainer, state_to_numpy
from nodes.transport.dispatch import Reply
from tests.faulty_worker import POISON, poisoned
from tests.policies import scenario_policy
from tests.unit.test_bundle import GeneratedImages

# Opacus's backward hooks fire on the first layer's data input: expected, harmless.
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

SIZES = [100, 200, 300, 400]
CODECS = ["none", "qsgd", "topk", "sign"]
POISONED = 2  # the client whose reply is poisoned


def task(**changes) -> ClientTask:
    return ClientTask(**{"client": 0, "steps": 5, "lr": 0.1, "sigma": 1.0, "clip": 1.0, "q": 0.05, **changes})


# --- the derivation ------------------------------------------------------------------------------


def test_full_batch_clipped_gradient_descent_moves_at_most_lr_c_per_step():
    """q = 1, sigma = 0: every step's batch is the whole data, its mean gradient of norm <= C."""
    t = task(q=1.0, sigma=0.0, lr=0.3, clip=2.0, steps=4)
    exact = 0.3 * 2.0 * 4
    assert trained_bound(t, 50, 10, 50.0, 0.0) == pytest.approx(exact * (1 + SLACK), rel=1e-5)


def test_no_bound_derives_for_unclipped_plain_sgd_and_the_mechanisms_bound_it():
    plain = task(sigma=0.0, clip=0.0)
    assert trained_bound(plain, 100, 10, 5.0, 1.0) == math.inf
    assert trained_bound(task(sigma=0.0, clip=0.0, update_clip=0.5), 100, 10, 5.0, 1.0) == pytest.approx(0.5, 1e-2)
    assert trained_bound(task(sigma=0.0, clip=0.0, weight_clip=2.0), 100, 10, 5.0, 3.0) == pytest.approx(5, 1e-2)
    noised = task(sigma=0.0, clip=0.0, update_clip=0.5, output_noise="laplace", output_noise_scale=0.1)
    assert 0.5 + 0.1 * math.sqrt(10) < trained_bound(noised, 100, 10, 5.0, 1.0) < math.inf
    assert trained_bound(task(prox_mu=30.0), 100, 10, 5.0, 1.0) == math.inf  # lr mu > 2: no contraction


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 300),
    steps=st.integers(1, 8),
    q=st.floats(0.005, 1.0),
    sigma=st.floats(0.0, 3.0),
    clip=st.floats(0.01, 10.0),
    lr=st.floats(1e-3, 2.0),
    d=st.integers(1, 500),
    prox=st.sampled_from([0.0, 0.1, 1.0]),
    divisor=st.sampled_from([0.0, 1.0, 64.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_bound_holds_for_worst_case_dp_sgd_updates(n, steps, q, sigma, clip, lr, d, prox, divisor, seed):
    """DP-SGD as nodes.training.trainer steps it, with every per-sample gradient of norm C, all aligned (the
    largest the data term can be), Poisson batches and Gaussian noise: the update stays within its bound."""
    rng = np.random.default_rng(seed)
    t = task(steps=steps, q=q, sigma=sigma, clip=clip, lr=lr, prox_mu=prox)
    b = divisor or max(1.0, q * n)
    u, direction = np.zeros(d), np.eye(d)[0]
    for _ in range(steps):
        batch = rng.binomial(n, q)
        u = u - lr * (batch * clip * direction + sigma * clip * rng.standard_normal(d)) / b - lr * prox * u
    assert np.linalg.norm(u) <= trained_bound(t, n, d, b, 0.0)


# --- real honest updates ---------------------------------------------------------------------------

SHAPES = {"cnn_cifar": (3, 32, 32)}  # the others take (1, 28, 28) images: the CNNs need them, the rest flatten
SAMPLES = 16


PROX_CLIP_NOISE = dict(prox_mu=0.5, update_clip=0.3, output_noise="gaussian", output_noise_scale=0.01)
FU = dict(sigma=0.0, q=1.0, weight_clip=30.0, output_noise="laplace", output_noise_scale=1e-3)  # full-batch clipped
HONEST_TASKS = [
    task(steps=3, lr=0.5, sigma=1.0, clip=1.0, q=0.25),  # DP-SGD, the noise dominant
    task(steps=4, lr=0.2, sigma=0.1, clip=5.0, q=0.5),  # little noise: the clipped gradients dominant
    task(steps=2, lr=0.5, sigma=0.5, clip=1.0, q=0.25, **PROX_CLIP_NOISE),
    task(steps=2, lr=0.1, clip=1.0, **FU),
]


@pytest.mark.parametrize("model", sorted(MODEL_NAMES))
def test_real_honest_updates_of_every_model_stay_within_their_bound(model):
    trainer = Trainer(
        GeneratedImages(SHAPES.get(model, (1, 28, 28)), n_clients=2, samples=SAMPLES),
        torch.device("cpu"),
        model=ModelConfig(name=model, hidden=64),
        data_cfg=DataConfig(),
        seed=5,
        per_sample="auto",
        batch_eval=64,
        batch_divisor=0.0,
        empty_batch="noise",
    )
    w = {k: v.copy() for k, v in state_to_numpy(trainer.model).items()}
    d = sum(v.size for v in w.values())
    ratios = []
    for rnd in range(1 if d > 500_000 else 2):  # the large CNNs once: seconds a step on a CPU
        for t in HONEST_TASKS:
            new, _ = trainer.train(rnd, ClientTask(**{**vars(t), "client": rnd % 2}), w)
            bound = trained_bound(t, SAMPLES, d, max(1.0, t.q * SAMPLES), norm(w))
            ratios.append(norm(new, w) / bound)
    assert max(ratios) <= 1, ratios
    assert max(ratios[0::4]) > 0.5, ratios  # DP-SGD's noise: the bound is not vacuous


# --- the server's check, in a round --------------------------------------------------------------


def weights(value: float = 0.0) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), value, np.float32), "b": np.full(3, value, np.float32)}


def reply_to(frame, codec_kind: str, model: dict[str, np.ndarray], cfg, poison: bool, monkeypatch) -> Reply:
    """The worker's reply to a task frame, with `model` trained (poisoned: tests.faulty_worker's), as the
    server decodes it off the wire."""
    msg = protocol.decode(list(frame.frames), 2**30)
    monkeypatch.setenv("DPFL_FAULT_POISON_AT", f"{msg['round']}:{msg['client']}" if poison else "")
    metrics = {"steps": 1, "train_loss": 0.5, "update_norm": 0.0}
    sent = poisoned(worker._update)(cfg.compression, cfg.seed, msg, model, metrics)
    return Reply(client=msg["client"], message=protocol.decode(list(sent.frames), 2**30), nbytes=len(sent))


def play(cfg, policy_cls=None, *, poison=(POISONED,), model=None, bounds=True, monkeypatch, rnd=0, evaluate=None):
    """play_round on fresh links, every client answering in-process through the wire: an honest update
    (`model`, default the global model's weights + 0.01), and `poison`'s clients the faulty worker's."""
    policy = scenario_policy(
        cfg, RunContext(n_clients=len(SIZES), data_sizes=SIZES, num_params=9, rounds_budget=10), policy_cls
    )
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, cfg.seed)
    w0 = weights(0.5)

    def train(rnd, frames):
        honest = model or {k: v + 0.01 for k, v in w0.items()}
        return {c: reply_to(f, cfg.compression.kind, honest, cfg, c in poison, monkeypatch) for c, f in frames}

    return play_round(
        rnd,
        w0,
        settings=round_settings(cfg),
        policy=policy,
        clock=Clock(resources, cfg.seed),
        budgets=Budgets(cfg.budget, resources, task_bytes=1000, per_round=len(SIZES), tau=cfg.dp.tau, deadline_s=1e9),
        train=train,
        evaluate=evaluate,
        compression=Compression(cfg.compression),
        bounds=UpdateBounds(cfg.aggregate.max_update_norm, cfg.dp.batch_divisor, SIZES) if bounds else None,
    )


def scenario(*overrides: str):
    return load(None, [f"clients.n={len(SIZES)}", *overrides])


@pytest.mark.parametrize("codec, feedback", [(c, False) for c in CODECS] + [(c, True) for c in CODECS if c != "none"])
def test_a_poisoned_reply_of_every_codec_is_rejected_as_implausible_and_the_rest_aggregated(
    codec, feedback, monkeypatch
):
    cfg = scenario(f"compression.kind={codec}", f"compression.error_feedback={str(feedback).lower()}")
    record = play(cfg, monkeypatch=monkeypatch)
    assert record.outcomes[POISONED].outcome == Outcome.IMPLAUSIBLE
    assert {c: o.outcome for c, o in record.outcomes.items() if c != POISONED} == dict.fromkeys([0, 1, 3], "arrived")
    assert POISONED not in record.factors and all(np.isfinite(v).all() for v in record.weights.values())
    assert max(abs(v).max() for v in record.weights.values()) < 1  # what the honest updates made it: near 0.51
    row = record.round_row()
    assert (row["arrived"], row["failed"], row["selected"]) == (3, 1, 4)
    mine = next(r for r in record.rows(cfg.data)["client_rounds"] if r["client"] == POISONED)
    assert mine["outcome"] == "implausible" and mine["failure"].startswith("implausible update: norm ")
    assert mine["bytes_up"] > 0 and mine["epsilon_spent"] > 0 and mine["local_steps"] == cfg.dp.tau  # it trained
    assert (mine["t_upload_end"], POISONED, "implausible", 0) in record.timeline.events


def test_an_honest_update_is_accepted_and_the_same_scaled_past_its_bound_rejected():
    cfg = scenario()
    bounds = UpdateBounds(cfg.aggregate.max_update_norm, cfg.dp.batch_divisor, SIZES)
    comp, w = Compression(cfg.compression), weights(0.5)
    t = ClientTask.dp_sgd(1, cfg.dp)
    limit = bounds.of(t, w)
    rng = np.random.default_rng(0)
    update = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in w.items()}
    scale = norm(update)

    def job(factor: float) -> Reply:
        model = {k: w[k] + update[k] * np.float32(factor * limit / scale) for k in w}
        r = Reply(client=1, message={"type": "update", "model": model, "metrics": {}}, nbytes=100)
        assert not client_job(t, 10, r, w, comp, bounds).failed  # uploaded either way
        return r

    assert job(0.99).failure == ""
    assert job(1.01).failure.startswith("implausible update: norm ")


def test_a_fixed_bound_applies_to_every_update_and_inf_turns_the_check_off(monkeypatch):
    record = play(scenario("aggregate.max_update_norm=0.02"), poison=(), monkeypatch=monkeypatch)  # norms 0.03
    assert {o.outcome for o in record.outcomes.values()} == {"implausible"}
    assert "> aggregate.max_update_norm=0.02" in record.replies[0].failure
    # no bound: the poisoned update is aggregated, and the model it makes (POISON * its impact factor, finite
    # but past 2^64) stops the round in one line
    with pytest.raises(ModelNotFinite, match=r"^round 0: the global model has a value of magnitude 9e\+37 after"):
        play(scenario("aggregate.max_update_norm=inf"), monkeypatch=monkeypatch)


def poison_residuals(monkeypatch) -> None:
    """Every worker's compressed reply carries a residual of POISON, its update honest."""
    honest = worker.compressed_update

    def bad_residual(codec, seed, msg, model, metrics):
        sent = protocol.decode(list(honest(codec, seed, msg, model, metrics).frames), 2**30)
        residual = {k: np.full_like(v, POISON) for k, v in sent["residual"].items()}
        fields = {k: sent[k] for k in protocol.FIELDS["compressed"] if k not in ("v", "type")}
        return protocol.encode("compressed", **{**fields, "residual": residual})

    monkeypatch.setattr(worker, "compressed_update", bad_residual)


def test_a_residual_poisoned_under_error_feedback_is_rejected(monkeypatch):
    cfg = scenario("compression.kind=topk", "compression.error_feedback=true")
    poison_residuals(monkeypatch)
    record = play(cfg, poison=(), monkeypatch=monkeypatch)
    assert {o.outcome for o in record.outcomes.values()} == {"implausible"}
    assert "its residual's norm" in record.replies[0].failure


def test_without_a_bound_a_non_finite_update_stops_the_round_in_one_line_naming_it(monkeypatch):
    cfg = scenario("aggregate.max_update_norm=inf")
    evaluated = []
    broken = {"w": np.full((2, 3), np.inf, np.float32), "b": np.zeros(3, np.float32)}  # as an overflowed decode

    def train_broken(rnd, frames):
        return {
            c: Reply(c, {"type": "update", "model": broken if c == 3 else weights(0.5), "metrics": METRICS}, 100)
            for c, _ in frames
        }

    policy = scenario_policy(cfg, RunContext(n_clients=4, data_sizes=SIZES, num_params=9, rounds_budget=10))
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, cfg.seed)
    with pytest.raises(ModelNotFinite) as e:
        play_round(
            7,
            weights(0.5),
            settings=round_settings(cfg),
            policy=policy,
            clock=Clock(resources, cfg.seed),
            budgets=Budgets(cfg.budget, resources, task_bytes=1000, per_round=4, tau=5, deadline_s=1e9),
            train=train_broken,
            evaluate=lambda w: evaluated.append(w) or (0.0, 0.0),
            bounds=UpdateBounds(cfg.aggregate.max_update_norm, cfg.dp.batch_divisor, SIZES),
        )
    assert str(e.value) == (
        "round 7: the global model has non-finite values after aggregation "
        "(client 3's update has non-finite values; first in w)"
    )
    assert evaluated == []  # the bad model is never evaluated, nor its round recorded


METRICS = {"steps": 1, "train_loss": 0.5, "update_norm": 0.0}


def test_server_side_noise_that_overflows_stops_the_round_naming_the_policy(monkeypatch):
    fedavg_dp = POLICIES["fedavg_dp"]

    class Overflowing(fedavg_dp):  # a server's noise far too large for float32
        def aggregate(self, rnd, global_weights, results, factors):
            new, state = super().aggregate(rnd, global_weights, results, factors)
            return {k: (v.astype(np.float64) + 1e39).astype(np.float32) for k, v in new.items()}, state

    with pytest.raises(ModelNotFinite) as e:
        play(scenario(), Overflowing, poison=(), monkeypatch=monkeypatch, rnd=4)
    assert str(e.value).startswith(
        "round 4: the global model has non-finite values after aggregation (client 0's update has the largest "
        "norm, 0.03, of the 4 policy fedavg_dp aggregated; first in w)"
    )


def test_a_finite_model_of_2_to_the_64_or_more_stops_the_round_too(monkeypatch):
    """Finite, but no checkpoint of it would be resumed and every norm and loss from it is inf: with the bound
    turned off, updates each below 2^64 can still add up to it (a server learning rate of 10, here)."""
    fedavg_dp = POLICIES["fedavg_dp"]

    class Amplifying(fedavg_dp):
        def aggregate(self, rnd, global_weights, results, factors):
            new, state = super().aggregate(rnd, global_weights, results, factors)
            return {k: np.full_like(v, 2.0**64) for k, v in new.items()}, state

    with pytest.raises(ModelNotFinite) as e:
        play(scenario("aggregate.max_update_norm=inf"), Amplifying, poison=(), monkeypatch=monkeypatch, rnd=4)
    assert str(e.value) == (
        "round 4: the global model has a value of magnitude 1.84e+19 after aggregation, 2^64 or more, from which "
        "every norm and loss is inf (first in w; policy fedavg_dp)"
    )


@pytest.mark.parametrize("value", ["-1", "nan", "1e31"])
def test_a_bad_max_update_norm_is_refused_in_one_line(value):
    with pytest.raises(ConfigError, match=r"^aggregate\.max_update_norm = .*: expected a number in \[0, 1e\+30\]"):
        load(None, [f"aggregate.max_update_norm={value}"])

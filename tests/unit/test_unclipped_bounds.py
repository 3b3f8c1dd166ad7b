"""Where no bound derives from a task (plain SGD without any clip: dp.clip = 0, dp.sigma = 0), the auto
aggregate.max_update_norm still rejects what float32 bounds (emulator.aggregate.plausibility.beyond_float32): a
model or residual with a value of 2^64 or more, from which no training goes on. A poisoned reply of every codec is
`implausible`; the honest ones, however large below that, are aggregated."""

from __future__ import annotations

import numpy as np
import pytest

from emulator.aggregate.plausibility import UpdateBounds
from emulator.rounds.round import ModelNotFinite
from emulator.timemodel.clock import Outcome
from nodes.contracts.tasks import MAX_ABS, ClientTask
from tests.faulty_worker import POISON
from tests.unit.test_update_bounds import CODECS, POISONED, SIZES, play, poison_residuals, scenario, weights

UNCLIPPED = ("dp.clip=0", "dp.sigma=0")
BEYOND = "2^64 or more (checkpoint.MAX_ABS); no bound derives from its task (aggregate.max_update_norm=0: auto)"


def test_no_bound_derives_for_the_unclipped_task():
    cfg = scenario(*UNCLIPPED)
    bounds = UpdateBounds(cfg.aggregate.max_update_norm, cfg.dp.batch_divisor, SIZES)
    assert bounds.of(ClientTask.dp_sgd(1, cfg.dp), weights(0.5)) == float("inf")


@pytest.mark.parametrize("codec, feedback", [(c, False) for c in CODECS] + [(c, True) for c in CODECS if c != "none"])
def test_a_poisoned_reply_of_every_codec_in_unclipped_training_is_implausible(codec, feedback, monkeypatch):
    cfg = scenario(*UNCLIPPED, f"compression.kind={codec}", f"compression.error_feedback={str(feedback).lower()}")
    record = play(cfg, monkeypatch=monkeypatch)
    assert record.outcomes[POISONED].outcome == Outcome.IMPLAUSIBLE
    failure = record.replies[POISONED].failure
    assert failure.startswith("implausible update: a value of magnitude ") and failure.endswith(
        f" in the model it trained, {BEYOND}"
    )
    assert {c: o.outcome for c, o in record.outcomes.items() if c != POISONED} == dict.fromkeys([0, 1, 3], "arrived")
    assert max(abs(v).max() for v in record.weights.values()) < 1  # what the honest updates made it: near 0.51


def test_honest_updates_that_grow_unclipped_are_aggregated_up_to_float32s_bound(monkeypatch):
    cfg = scenario(*UNCLIPPED)
    large = {k: np.full_like(v, 1e18) for k, v in weights().items()}  # a diverging run's, still trainable
    record = play(cfg, poison=(), model=large, monkeypatch=monkeypatch)
    assert {o.outcome for o in record.outcomes.values()} == {"arrived"}
    assert all(np.isfinite(v).all() and abs(v).max() > 1e17 for v in record.weights.values())
    at_bound = {k: np.full_like(v, MAX_ABS) for k, v in weights().items()}
    record = play(cfg, poison=(), model=at_bound, monkeypatch=monkeypatch)
    assert {o.outcome for o in record.outcomes.values()} == {"implausible"}


def test_a_residual_beyond_float32_in_unclipped_training_is_implausible(monkeypatch):
    cfg = scenario(*UNCLIPPED, "compression.kind=topk", "compression.error_feedback=true")
    poison_residuals(monkeypatch)
    record = play(cfg, poison=(), monkeypatch=monkeypatch)
    assert {o.outcome for o in record.outcomes.values()} == {"implausible"}
    assert (
        record.replies[0].failure == f"implausible update: a value of magnitude {POISON:.3g} in its residual, {BEYOND}"
    )


def test_inf_turns_the_check_off_in_unclipped_training_too(monkeypatch):
    with pytest.raises(ModelNotFinite, match=r"^round 0: the global model has a value of magnitude 9e\+37 after"):
        play(scenario(*UNCLIPPED, "aggregate.max_update_norm=inf"), monkeypatch=monkeypatch)  # aggregated, then stopped

"""Partial work: the steps that fit before the deadline, against hand-computed values; FedNova's
normalisation; which scenarios may ask for it."""

from __future__ import annotations

import numpy as np
import pytest

from emulator.config import ConfigError, load
from emulator.policies import ClientResult, ClientTask
from emulator.policies.base import fedavg
from emulator.timemodel.bandwidth import Bandwidth
from emulator.timemodel.loss import LinkLoss
from emulator.timemodel.partial_work import fit_task, normalised, steps_that_fit
from emulator.timemodel.resources import ClientResources
from nodes.contracts.schema import DropoutConfig, SchedulePoint

# 100 kB each way: download 0.1 s latency + 0.8 Mbit at 8 Mbit/s = 0.2 s; upload 0.1 + 0.8 Mbit at 1 Mbit/s = 0.9 s
NBYTES = 100_000


def client(up_schedule: tuple[SchedulePoint, ...] = ()) -> ClientResources:
    return ClientResources(
        client_id=0,
        down=Bandwidth(8e6),
        up=Bandwidth(1e6, up_schedule),
        latency_s=0.1,
        step_s=0.2,
        loss=LinkLoss(DropoutConfig(), 0),
    )


@pytest.mark.parametrize(
    ("start", "deadline", "steps", "expected"),
    [
        (0.0, 2.45, 10, 6),  # 0.2 + 0.2 k + 0.9 <= 2.45: k <= 6.75
        (0.0, 2.45, 4, 4),  # never more than the task's steps
        (0.0, 1.35, 10, 1),  # 1.3 <= 1.35: one step
        (0.0, 1.25, 10, 0),  # 0.2 + 0.2 + 0.9 = 1.3 > 1.25: not even one
        (10.0, 12.45, 10, 6),  # from the round's start
        (0.0, 100.0, 7, 7),
    ],
)
def test_steps_that_fit_by_hand(start, deadline, steps, expected):
    assert steps_that_fit(client(), start, deadline, NBYTES, NBYTES, steps) == expected


def test_steps_that_fit_follow_the_links_schedule():
    """From t = 0.5 the uplink runs at half rate: every upload (data from >= 0.5 s) takes 0.1 + 1.6 s,
    so 0.2 + 0.2 k + 1.7 <= 3.0 gives k <= 5.5."""
    slow_up = client((SchedulePoint(t=0.5, factor=0.5),))
    assert steps_that_fit(slow_up, 0.0, 3.0, NBYTES, NBYTES, 10) == 5
    assert steps_that_fit(client(), 0.0, 3.0, NBYTES, NBYTES, 10) == 9  # 0.2 + 0.2 k + 0.9 <= 3.0: k <= 9.5


def test_fit_task_keeps_the_task_when_all_or_nothing_fits():
    task = ClientTask(client=0, steps=10, lr=0.1, sigma=1.0, clip=1.0, q=0.1)
    assert fit_task(task, client(), 0.0, 2.45, NBYTES).steps == 6
    assert fit_task(task, client(), 0.0, 2.45, NBYTES).sigma == 1.0
    assert fit_task(task, client(), 0.0, 1.25, NBYTES) is task  # late, as without partial work
    assert fit_task(task, client(), 0.0, 100.0, NBYTES) is task


def result(c: int, w: float) -> ClientResult:
    return ClientResult(client=c, weights={"w": np.array([w], dtype=np.float32)}, steps=0, train_loss=0, update_norm=0)


def test_fednova_normalisation_by_hand():
    """w = 0; client 0 did 2 steps to 2.0, client 1 one step to 3.0, p = 1/2 each: d = (1, 3), tau_eff = 1.5,
    w' = 1.5 * (0.5 * 1 + 0.5 * 3) = 3.0, where plain FedAvg gives 2.5."""
    w = {"w": np.zeros(1, dtype=np.float32)}
    results, factors = [result(0, 2.0), result(1, 3.0)], {0: 0.5, 1: 0.5}
    nova = fedavg(w, normalised(w, results, factors, {0: 2, 1: 1}), factors)
    assert nova["w"].dtype == np.float32
    assert nova["w"].tolist() == [3.0]
    assert fedavg(w, results, factors)["w"].tolist() == [2.5]
    # equal steps: FedNova is FedAvg
    assert fedavg(w, normalised(w, results, factors, {0: 3, 1: 3}), factors)["w"].tolist() == [2.5]


DEADLINE = ["round.deadline_s=2.5", "round.partial_work=true"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["round.partial_work=true"], r"round\.partial_work = True: expected false without a round\.deadline_s"),
        ([*DEADLINE, "policy=dp_fedavg"], r"round\.partial_work = True: expected false with policy=dp_fedavg"),
        ([*DEADLINE, "policy=fu_tuning"], r"partial work applies to fedavg_dp, adap_dpfl, fedcs, oort"),
        ([*DEADLINE, "policy=ali_dpfl"], r"expected false with policy=ali_dpfl"),
    ],
)
def test_partial_work_is_refused_where_it_does_not_apply(overrides, expected):
    with pytest.raises(ConfigError, match=expected) as e:
        load(None, overrides)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("policy", ["fedavg_dp", "adap_dpfl", "fedcs", "oort"])
def test_partial_work_is_admitted_for_fixed_tau_dp_sgd_policies(policy):
    assert load(None, [*DEADLINE, f"policy={policy}"]).round.partial_work

"""Partial work end to end on dropout.yaml: at the same deadline, fewer late updates and more on time
than without it; every client's epsilon is Opacus's for the steps it did; the same tables whatever the
number of workers."""

from __future__ import annotations

import pytest

from tests.conftest import rows

DROPOUT = ["dp.tau=5"]  # the scenario's tau: with FAST's 2 every step fits
PARTIAL = [*DROPOUT, "round.partial_work=true"]


def test_partial_work_turns_late_updates_into_on_time_ones_charged_for_the_steps_done(emulate):
    from opacus.accountants import RDPAccountant

    full = emulate(*DROPOUT, scenario="dropout.yaml")
    partial = emulate(*PARTIAL, scenario="dropout.yaml")
    before, after = rows(full, "rounds"), rows(partial, "rounds")
    assert [r["deadline"] for r in after] == [r["deadline"] for r in before]  # the same deadline, round by round
    assert sum(r["late"] for r in after) < sum(r["late"] for r in before)
    assert sum(r["arrived"] for r in after) > sum(r["arrived"] for r in before)

    clients = rows(partial, "client_rounds")
    cut = [r for r in clients if 0 < r["local_steps"] < 5]
    assert cut, "no client ran fewer steps than tau"
    assert all(r["outcome"] != "late" for r in cut)  # the estimate is the clock's own link and compute
    # a client that is late was given all tau steps: not even one fitted
    assert all(r["local_steps"] == 5 for r in clients if r["outcome"] == "late")
    for c in {r["client"] for r in clients}:
        mine = [r for r in clients if r["client"] == c]
        opacus = RDPAccountant()
        opacus.history = [(r["sigma"], r["q"], r["local_steps"]) for r in mine if r["local_steps"]]
        assert mine[-1]["epsilon"] == pytest.approx(opacus.get_epsilon(delta=1e-5), rel=1e-9), c
    # a client cut short in any round has spent less than with all tau steps every round
    full_eps = {r["client"]: r["epsilon"] for r in rows(full, "client_rounds")}
    final = {r["client"]: r["epsilon"] for r in clients}
    assert all(final[c] < full_eps[c] for c in {r["client"] for r in cut})


def test_partial_work_is_the_same_whatever_the_number_of_workers_and_normalises_by_steps(emulate):
    one = emulate("workers=1", *PARTIAL, scenario="dropout.yaml")
    two = emulate("workers=2", *PARTIAL, scenario="dropout.yaml")
    for name in ("rounds", "client_rounds", "events"):
        assert rows(one, name) == rows(two, name), name
    plain = emulate("workers=1", *PARTIAL, "round.partial_work_normalize=false", scenario="dropout.yaml")
    # the same steps, times and charges; only the aggregate differs
    assert rows(plain, "events") == rows(one, "events")
    assert [r["epsilon"] for r in rows(plain, "client_rounds")] == [r["epsilon"] for r in rows(one, "client_rounds")]
    assert rows(plain, "rounds")[-1]["test_loss"] != rows(one, "rounds")[-1]["test_loss"]

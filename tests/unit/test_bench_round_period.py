"""bench.round_period: each round's start, in order, one round's whole period apart."""

from __future__ import annotations

import pytest

from bench import round_period
from emulator.output.results import read_table
from emulator.rounds import round
from emulator.run import round_loop


def test_each_round_leaves_its_start_and_a_period_holds_the_rounds_plan_to_aggregation(emulate):
    with round_period.round_starts() as starts:
        run_dir = emulate("budget.rounds=4")
    rounds = read_table(run_dir, "rounds").sort_by("round").to_pylist()
    assert len(starts) == 4 and starts == sorted(starts)
    for r in range(3):  # a round's plan to aggregation (wall_s) lies within its period
        assert starts[r + 1] - starts[r] >= rounds[r]["wall_s"]
    # rounds 1 and 2 have a next round's start: the median of their two periods, their mean
    assert round_period.steady_period(starts) == pytest.approx((starts[3] - starts[1]) / 2)


def test_outside_the_context_rounds_are_played_untimed(emulate):
    with round_period.round_starts() as starts:
        pass
    assert round_loop.play_round is round.play_round
    emulate("budget.rounds=2")
    assert starts == []

"""bench.round_period: one moment per round, in round order, under the run's directory."""

from __future__ import annotations

from bench import round_period


def test_each_round_leaves_one_moment_in_order(emulate):
    run_dir = emulate("budget.rounds=3", "output.hooks=[bench.round_period:Stamps]")
    stamps = round_period.STAMPS.pop(str(run_dir))
    assert len(stamps) == 3 and stamps == sorted(stamps) and len(set(stamps)) == 3

"""bench.reproduce: a point whose earlier run no longer matches is run again, and the earlier run is
moved aside, never deleted (it may stand for hours of compute, and the mismatch may be our bug)."""

from bench.reproduce.common import Options, Point, run_points, runs
from emulator.output.results import read_table
from tests.conftest import FAST


def test_a_changed_point_is_rerun_and_the_earlier_run_is_kept(tmp_path, capsys):
    opts = Options(seeds=[0], jobs=1, out=tmp_path)
    point = Point(sweep="s", scenario="dropout.yaml", seed=0, overrides=[*FAST, "budget.rounds=2"])
    run_points(opts, [point])
    run = point.dir(tmp_path)
    assert read_table(run, "rounds").num_rows == 2

    run_points(opts, [point])  # unchanged: reused, nothing moved
    assert not (tmp_path / ".replaced").exists()

    point.overrides[-1] = "budget.rounds=3"
    run_points(opts, [point])
    assert read_table(run, "rounds").num_rows == 3
    (kept,) = (tmp_path / ".replaced").glob("*/s/seed=0")
    assert read_table(kept, "rounds").num_rows == 2
    assert [r.dir for r in runs(tmp_path)] == [run]  # the table is the current run's alone
    assert "budget.rounds 2 -> 3" in capsys.readouterr().err

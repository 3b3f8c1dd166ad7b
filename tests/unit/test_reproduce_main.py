"""python -m bench.reproduce's own output: a time that says what it leaves out, and a clear refusal
to report on runs that do not exist."""

import json
from datetime import UTC, datetime

from bench.reproduce import __main__ as reproduce

SINCE = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _run(root, name, status, started, finished):
    d = root / name / "seed=0"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"status": status, "started": started, "finished": finished}))


def test_the_time_says_how_many_runs_were_done_or_begun_before_this_invocation(tmp_path):
    assert reproduce.earlier_work(tmp_path, "t7", SINCE) == ""
    _run(tmp_path, "t7/a", "complete", "2026-11-22T13:00:00+00:00", "2026-11-22T13:05:00+0000")  # this one
    assert reproduce.earlier_work(tmp_path, "t7", SINCE) == ""
    _run(tmp_path, "t7/b", "complete", "2026-11-21T09:00:00.5+00:00", "2026-11-21T09:30:00+0000")  # reused
    _run(tmp_path, "t7-x/c", "complete", "2026-11-22T11:00:00+00:00", "2026-11-22T12:30:00+0000")  # resumed
    _run(tmp_path, "t7/d", "interrupted", "2026-11-22T11:00:00+00:00", None)  # not in the table
    _run(tmp_path, "t2/e", "complete", "2026-11-21T09:00:00+00:00", "2026-11-21T09:30:00+0000")  # another target
    said = reproduce.earlier_work(tmp_path, "t7", SINCE)
    assert said == (
        ", this invocation only: of the 3 complete runs, 1 were complete before it and 1 resumed "
        "from an earlier one, which that time does not include"
    )


def test_no_run_without_runs_is_refused_in_one_line(tmp_path, capsys):
    assert reproduce.main(["ali_dpfl_table7", "--out", str(tmp_path), "--no-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"no runs of ali_dpfl_table7 under {tmp_path}: nothing to report (run it without --no-run)"
    assert not (tmp_path / "ali_dpfl_table7.md").exists()

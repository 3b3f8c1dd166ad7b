"""python -m analysis on the real test sweep: summary numbers against the Parquet, plots, report, query, damage."""
from __future__ import annotations

import csv
import shutil
import statistics
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_sweep import (  # one real sweep per session, shared with test_sweep.py
    POINTS,
    small_sweep,
)

from analysis.__main__ import main
from analysis.report import FIGURES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    return small_sweep(tmp_path_factory)


@pytest.fixture(scope="module")
def analysis_dir(sweep_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("analysis")
    assert main([str(sweep_dir), "--out", str(out)]) == 0
    return out


def summary_rows(out: Path) -> dict[str, dict]:
    with open(out / "summary.csv") as f:
        return {row["config"]: row for row in csv.DictReader(f)}


def rounds_of(run_dir: Path) -> dict[str, list]:
    return pq.read_table(run_dir / "rounds").sort_by("round").to_pydict()


def test_summary_matches_the_parquet(sweep_dir, analysis_dir):
    per_config: dict[str, list[dict]] = {}
    for point in POINTS:
        sigma, p, _ = (part.split("=", 1)[1] for part in point.split("/"))
        per_config.setdefault(f"dp.sigma={sigma}, links.dropout.p={p}", []).append(rounds_of(sweep_dir / point))
    target = 0.9 * max(statistics.mean(r["test_accuracy"][-1] for r in runs) for runs in per_config.values())
    rows = summary_rows(analysis_dir)
    assert sorted(rows) == sorted(per_config)
    for config, runs in per_config.items():
        row = rows[config]
        final = [r["test_accuracy"][-1] for r in runs]
        best = [max(r["test_accuracy"]) for r in runs]
        hits = [next((i for i, a in enumerate(r["test_accuracy"]) if a >= target), None) for r in runs]
        reached = [(r, i) for r, i in zip(runs, hits) if i is not None]
        assert int(row["seeds"]) == 2
        assert float(row["target_accuracy"]) == pytest.approx(target)
        assert float(row["final_accuracy_mean"]) == pytest.approx(statistics.mean(final))
        assert float(row["final_accuracy_std"]) == pytest.approx(statistics.stdev(final))
        assert float(row["best_accuracy_mean"]) == pytest.approx(statistics.mean(best))
        assert int(row["reached_target"]) == len(reached)
        if reached:
            assert float(row["rounds_to_target_mean"]) == pytest.approx(
                statistics.mean(r["round"][i] + 1 for r, i in reached))
            assert float(row["time_to_target_s_mean"]) == pytest.approx(
                statistics.mean(r["t_end"][i] for r, i in reached))
        else:
            assert row["rounds_to_target_mean"] == row["time_to_target_s_mean"] == ""
        for column, source in [("bytes_total_mean", "bytes_total"), ("delivered_mean", "arrived"),
                               ("lost_mean", "lost"), ("late_mean", "late"), ("failed_mean", "failed")]:
            assert float(row[column]) == pytest.approx(statistics.mean(sum(r[source]) for r in runs)), column
        assert float(row["final_max_epsilon_mean"]) == pytest.approx(
            statistics.mean(r["max_epsilon"][-1] for r in runs))
    assert sum(float(r["lost_mean"]) for c, r in rows.items() if "p=0.3" in c) > 0, "dropout should lose updates"


def test_every_figure_and_the_report_are_written(analysis_dir):
    for name in FIGURES:
        data = (analysis_dir / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
    report = (analysis_dir / "report.md").read_text()
    assert all(f"]({name})" in report for name in [*FIGURES, "summary.csv", "summary.md"])
    assert "dp.sigma=1.0, links.dropout.p=0.3" in (analysis_dir / "summary.md").read_text()


def test_target_accuracy_option_sets_the_target(sweep_dir, tmp_path):
    assert main([str(sweep_dir / "dp.sigma=0.5"), "--out", str(tmp_path), "--target-accuracy", "0.01"]) == 0
    rows = summary_rows(tmp_path)
    assert sorted(rows) == ["dp.sigma=0.5, links.dropout.p=0.0", "dp.sigma=0.5, links.dropout.p=0.3"]
    for row in rows.values():
        assert float(row["target_accuracy"]) == 0.01 and row["reached_target"] == "2"
        assert float(row["rounds_to_target_mean"]) == 1.0


def test_query_answers_sql_over_the_tables(sweep_dir, capsys):
    sql = ("select r.config, count(distinct r.run) as runs, count(*) as rounds from rounds r "
           "join runs using (run) where runs.\"links.dropout.p\" = '0.3' group by r.config order by r.config")
    assert main([str(sweep_dir), "--query", sql]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["config", "runs", "rounds"]
    assert [line.split()[-2:] for line in out[2:4]] == [["2", "4"], ["2", "4"]]
    assert out[-1] == "(2 rows)"

    assert main([str(sweep_dir), "--query", "select nope from rounds"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: query failed") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("make_path", [lambda tmp: tmp / "missing", lambda tmp: tmp])
def test_bad_path_is_a_one_line_error(tmp_path, capsys, make_path):
    assert main([str(make_path(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_missing_and_corrupt_parquet_files_are_named_and_the_rest_analysed(sweep_dir, tmp_path, capsys):
    config = "dp.sigma=0.5/links.dropout.p=0.0"
    for seed in ("0", "1"):
        shutil.copytree(sweep_dir / config / f"seed={seed}", tmp_path / "damaged" / f"seed={seed}")
    broken = tmp_path / "damaged" / "seed=0"
    missing = broken / "rounds" / "round-000001.parquet"
    corrupt = broken / "events" / "round-000000.parquet"
    missing.unlink()
    corrupt.write_bytes(b"not parquet at all")

    assert main([str(tmp_path / "damaged"), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert str(missing) in err and str(corrupt) in err
    row = summary_rows(tmp_path / "out")["damaged"]
    intact = rounds_of(tmp_path / "damaged" / "seed=1")["test_accuracy"][-1]
    only_round_0 = pq.read_table(broken / "rounds" / "round-000000.parquet")["test_accuracy"][0].as_py()
    assert row["seeds"] == "2"
    assert float(row["final_accuracy_mean"]) == pytest.approx((intact + only_round_0) / 2)
    assert all((tmp_path / "out" / name).stat().st_size > 0 for name in FIGURES)
    assert str(missing) in (tmp_path / "out" / "report.md").read_text()


def test_gantt_shows_every_client_up_to_the_limit_then_a_spaced_subset_with_the_troubled_ones():
    from analysis.plots import gantt_clients
    few = {(0, c): {"download_start": 0.0} for c in range(7)}
    assert gantt_clients(few, limit=10) == (list(range(7)), "7 clients")
    many = {(0, c): {"download_start": 0.0, **({"late": 3.0} if c % 100 == 0 else {})} for c in range(1000)}
    shown, how = gantt_clients(many, limit=50)
    troubled = list(range(0, 1000, 100))
    assert len(shown) == 50 == len(set(shown)) and set(troubled) <= set(shown)   # 10 troubled: all shown
    assert shown[0] == 0 and shown[-1] == 999
    assert how.startswith("50 of 1,000 clients: 10 of the 10 with a loss")
    all_late = {(0, c): {"late": 1.0} for c in range(200)}
    shown, _ = gantt_clients(all_late, limit=50)
    assert len(shown) == 50 and shown[0] == 0 and shown[-1] == 199                # no calm clients: all 50 troubled

"""python -m analysis on the real test sweep: summary numbers against the Parquet, plots, report, query, damage."""

from __future__ import annotations

import ast
import csv
import importlib.util
import json
import re
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
ROOT = Path(__file__).resolve().parents[2]


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
        reached = [(r, i) for r, i in zip(runs, hits, strict=True) if i is not None]
        assert int(row["seeds"]) == 2
        assert float(row["target_accuracy"]) == pytest.approx(target)
        assert float(row["final_accuracy_mean"]) == pytest.approx(statistics.mean(final))
        assert float(row["final_accuracy_std"]) == pytest.approx(statistics.stdev(final))
        assert float(row["best_accuracy_mean"]) == pytest.approx(statistics.mean(best))
        assert int(row["reached_target"]) == len(reached)
        if reached:
            assert float(row["rounds_to_target_mean"]) == pytest.approx(
                statistics.mean(r["round"][i] + 1 for r, i in reached)
            )
            assert float(row["time_to_target_s_mean"]) == pytest.approx(
                statistics.mean(r["t_end"][i] for r, i in reached)
            )
        else:
            assert row["rounds_to_target_mean"] == row["time_to_target_s_mean"] == ""
        for column, source in [
            ("bytes_total_mean", "bytes_total"),
            ("delivered_mean", "arrived"),
            ("lost_mean", "lost"),
            ("late_mean", "late"),
            ("failed_mean", "failed"),
        ]:
            assert float(row[column]) == pytest.approx(statistics.mean(sum(r[source]) for r in runs)), column
        # every run here is DP-SGD: its epsilon is sample-level, the client-level column stays empty
        assert float(row["sample_level_max_epsilon_mean"]) == pytest.approx(
            statistics.mean(r["max_epsilon"][-1] for r in runs)
        )
        assert row["client_level_max_epsilon_mean"] == ""
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
    sql = (
        "select r.config, count(distinct r.run) as runs, count(*) as rounds from rounds r "
        "join runs using (run) where runs.\"links.dropout.p\" = '0.3' group by r.config order by r.config"
    )
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
    assert len(shown) == 50 == len(set(shown)) and set(troubled) <= set(shown)  # 10 troubled: all shown
    assert shown[0] == 0 and shown[-1] == 999
    assert how.startswith("50 of 1,000 clients: 10 of the 10 with a loss")
    all_late = {(0, c): {"late": 1.0} for c in range(200)}
    shown, _ = gantt_clients(all_late, limit=50)
    assert len(shown) == 50 and shown[0] == 0 and shown[-1] == 199  # no calm clients: all 50 troubled


# --- figures that tell the truth (issue 14) ----------------------------------------------------


def copy_run(source: Path, dest: Path, **scenario_dp) -> Path:
    """A copy of a run whose run.json says other dp.* values (and privacy_mechanism, if given)."""
    shutil.copytree(source, dest)
    manifest = json.loads((dest / "run.json").read_text())
    mechanism = scenario_dp.pop("mechanism", None)
    if mechanism:
        manifest["privacy_mechanism"] = mechanism
    manifest["scenario"]["dp"].update(scenario_dp)
    (dest / "run.json").write_text(json.dumps(manifest))
    return dest


@pytest.fixture
def drawn(monkeypatch):
    """The figures plots.* draws, by file name, kept open instead of saved."""
    from analysis import plots

    figures = {}

    def keep(fig, path: Path) -> Path:
        figures[path.name] = fig
        return path

    monkeypatch.setattr(plots, "_save", keep)
    return figures


def groups_of(*paths: Path):
    from analysis.load import discover
    from analysis.summary import analysed_runs

    return analysed_runs(discover([str(p) for p in paths]))


def test_epsilon_panels_carry_their_own_delta_and_budget_and_share_y_only_within_a_privacy_kind(
    sweep_dir, tmp_path, drawn
):
    from analysis import plots

    src = sweep_dir / "dp.sigma=0.5/links.dropout.p=0.0/seed=0"
    copy_run(src, tmp_path / "s/dp.delta=1e-05/seed=0", delta=1e-5, epsilon=8.0, mechanism="rdp")
    copy_run(src, tmp_path / "s/dp.delta=0.001/seed=0", delta=1e-3, epsilon=50.0, mechanism="rdp")
    copy_run(src, tmp_path / "s/dp.delta=0.01/seed=0", delta=1e-2, mechanism="fu_gaussian")
    plots.epsilon_per_client(groups_of(tmp_path / "s"), tmp_path)
    panels = [ax for ax in drawn["epsilon_per_client.png"].axes if ax.get_title()]
    titles = [ax.get_title() for ax in panels]
    assert any("dp.delta=1e-05" in t and "sample-level ε at δ = 1e-05" in t for t in titles)
    assert any("dp.delta=0.001" in t and "sample-level ε at δ = 0.001" in t for t in titles)
    assert any("dp.delta=0.01" in t and "client-level ε at δ = 0.01" in t for t in titles)
    budgets = {
        ax.get_title().split()[0]: [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
        for ax in panels
    }
    assert budgets == {"dp.delta=1e-05": [8.0], "dp.delta=0.001": [50.0], "dp.delta=0.01": []}  # inf: no line
    by_title = dict(zip(titles, panels, strict=True))
    sample = [ax for t, ax in by_title.items() if "sample-level" in t]
    client = next(ax for t, ax in by_title.items() if "client-level" in t)
    assert sample[0].get_ylim() == sample[1].get_ylim() != client.get_ylim()


def with_sparse_clients(source: Path, dest: Path, copies: int) -> Path:
    """A copy of a run whose client_rounds holds `copies` copies of its rows, copy k's client ids shifted by
    k * 10^6 (a run of many registered clients selects ids far apart)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    shutil.copytree(source, dest)
    rows = pq.read_table(source / "client_rounds")
    shifted = [
        rows.set_column(rows.schema.get_field_index("client"), "client", pc.add(rows["client"], k * 10**6))
        for k in range(copies)
    ]
    shutil.rmtree(dest / "client_rounds")
    (dest / "client_rounds").mkdir()
    pq.write_table(pa.concat_tables(shifted), dest / "client_rounds" / "round-000000.parquet")
    return dest


def test_impact_factors_draw_a_row_per_selected_client_labelled_with_its_id(sweep_dir, tmp_path, drawn):
    from analysis import plots
    from analysis.load import discover

    run_dir = with_sparse_clients(sweep_dir / "dp.sigma=0.5/links.dropout.p=0.0/seed=0", tmp_path / "r", copies=3)
    rows = pq.read_table(run_dir / "client_rounds").to_pydict()
    ids = sorted(set(rows["client"]))
    plots.impact_heatmap(discover([str(run_dir)]).runs[0], tmp_path)
    ax = drawn["impact_factors.png"].axes[0]
    grid = ax.get_images()[0].get_array()
    assert grid.shape == (len(ids), len(set(rows["round"])))  # not the 2 * 10^6 ids between the first and last
    for client, rnd, factor in zip(rows["client"], rows["round"], rows["impact_factor"], strict=True):
        assert grid[ids.index(client), rnd] == pytest.approx(factor)
    label = ax.yaxis.get_major_formatter()
    assert [label(i, None) for i in range(len(ids))] == [str(c) for c in ids]


def test_epsilon_per_client_draws_dots_past_the_clients_a_line_each_can_show(sweep_dir, tmp_path, drawn):
    from analysis import plots

    source = sweep_dir / "dp.sigma=0.5/links.dropout.p=0.0/seed=0"
    n = len(set(pq.read_table(source / "client_rounds")["client"].to_pylist()))
    copies = plots.LINES_MAX_CLIENTS // n + 1
    run_dir = with_sparse_clients(source, tmp_path / "s/seed=0", copies=copies)
    plots.epsilon_per_client(groups_of(run_dir), tmp_path)
    ax = next(ax for ax in drawn["epsilon_per_client.png"].axes if ax.get_title())
    dots = [line for line in ax.get_lines() if line.get_linestyle() == "None"]
    rows = pq.read_table(run_dir / "client_rounds").to_pydict()
    (line,) = dots
    assert sorted(zip(line.get_xdata(), line.get_ydata(), strict=True)) == sorted(
        zip(rows["round"], rows["epsilon"], strict=True)
    )
    assert f"{n * copies:,} clients" in line.get_label()


def test_accuracy_vs_epsilon_has_one_point_per_configuration_at_the_seed_means(sweep_dir, tmp_path, drawn):
    from analysis import plots

    groups = groups_of(sweep_dir)
    plots.accuracy_vs_epsilon(groups, tmp_path)
    (ax,) = drawn["accuracy_vs_epsilon.png"].axes
    finals = {bars.get_label(): bars.lines[0] for bars in ax.containers if not bars.get_label().startswith("_")}
    # each configuration labelled with its privacy unit and accountant: every run here is DP-SGD's, rdp
    assert sorted(finals) == sorted(f"{config} (sample-level, rdp)" for config in groups)
    for label, line in finals.items():
        config = label.removesuffix(" (sample-level, rdp)")
        runs = [rounds_of(r.dir) for r in groups[config]]
        assert line.get_xdata()[0] == pytest.approx(statistics.mean(r["max_epsilon"][-1] for r in runs))
        assert line.get_ydata()[0] == pytest.approx(statistics.mean(r["test_accuracy"][-1] for r in runs))
    assert ax.get_xlabel() == "final max ε over clients (sample-level)"


def test_accuracy_vs_epsilon_puts_dp_fedavg_beside_dp_sgd_each_labelled_with_unit_and_accountant(
    sweep_dir, tmp_path, drawn
):
    """Client-level DP-FedAvg (fixed and adaptive clipping, a real two-round sweep) in its own panel beside
    the sample-level DP-SGD runs: every point says its privacy unit and accountant."""
    from analysis import plots
    from emulator.__main__ import main as emulator

    args = ["scenario=dp_fedavg.yaml", "clients.n=40", "clients.per_round=10", "budget.rounds=2", "workers=1"]
    sweep = ["--multirun", *args, "dp_fedavg.adaptive.enabled=false,true", "output.progress=false"]
    assert emulator([*sweep, f"output.dir={tmp_path}", "output.name=dpf"]) == 0
    plots.accuracy_vs_epsilon(groups_of(sweep_dir, tmp_path / "dpf"), tmp_path)
    panels = {ax.get_xlabel(): ax for ax in drawn["accuracy_vs_epsilon.png"].axes}
    assert sorted(panels) == ["final max ε over clients (client-level)", "final max ε over clients (sample-level)"]
    labels = {
        unit: sorted(b.get_label() for b in ax.containers if not b.get_label().startswith("_"))
        for unit, ax in panels.items()
    }
    assert labels["final max ε over clients (client-level)"] == [
        f"dpf: dp_fedavg.adaptive.enabled={a} (client-level, dp_fedavg_poisson, rdp)" for a in ("false", "true")
    ]
    assert len(labels["final max ε over clients (sample-level)"]) == len(groups_of(sweep_dir))
    assert all(x.endswith(" (sample-level, rdp)") for x in labels["final max ε over clients (sample-level)"])


def test_accuracy_vs_a_swept_key_is_drawn_only_for_a_sweep_of_numeric_keys(sweep_dir, analysis_dir, tmp_path, drawn):
    from analysis import plots
    from analysis.report import WHEN_SWEPT

    assert (analysis_dir / "accuracy_vs_swept_key.png").read_bytes().startswith(PNG_MAGIC)
    assert all(f"]({name})" in (analysis_dir / "report.md").read_text() for name in WHEN_SWEPT)
    plots.accuracy_vs_swept_key(groups_of(sweep_dir), tmp_path)
    panels = drawn["accuracy_vs_swept_key.png"].axes
    assert [ax.get_xlabel() for ax in panels] == ["dp.sigma", "links.dropout.p"]
    assert sorted(bars.get_label() for bars in panels[1].containers) == ["dp.sigma=0.5", "dp.sigma=1.0"]
    assert plots.accuracy_vs_swept_key(groups_of(sweep_dir / "dp.sigma=0.5/links.dropout.p=0.0"), tmp_path) is None
    assert plots.staleness(groups_of(sweep_dir), tmp_path) is None  # synchronous rounds have no staleness


def test_arrivals_per_round_stack_the_outcomes_of_each_round(sweep_dir, tmp_path, drawn):
    from analysis import plots

    config = sweep_dir / "dp.sigma=1.0/links.dropout.p=0.3"
    plots.arrivals_per_round(groups_of(config), tmp_path)
    (ax,) = drawn["arrivals_per_round.png"].axes
    runs = [rounds_of(config / f"seed={s}") for s in (0, 1)]
    tops = [patch.get_y() + patch.get_height() for patch in ax.containers[-1]]  # the failed bars sit on top
    assert tops == pytest.approx(
        [
            statistics.mean(r["arrived"][i] + r["late"][i] + r["lost"][i] + r["failed"][i] for r in runs)
            for i in range(len(runs[0]["round"]))
        ]
    )


def test_accuracy_vs_bytes_up_puts_each_evaluated_round_at_the_bytes_uploaded_by_its_end(sweep_dir, tmp_path, drawn):
    from analysis import plots

    run_dir = sweep_dir / "dp.sigma=1.0/links.dropout.p=0.3/seed=1"
    plots.accuracy_vs_bytes_up(groups_of(run_dir), tmp_path)
    (ax,) = drawn["accuracy_vs_bytes_up.png"].axes
    (line,) = ax.get_lines()
    r = rounds_of(run_dir)
    cumulative = [sum(r["bytes_up"][: i + 1]) / 1e6 for i in range(len(r["round"]))]
    points = dict(zip(line.get_xdata(), line.get_ydata(), strict=True))
    assert [points[x] for x in cumulative] == pytest.approx(r["test_accuracy"])
    assert min(line.get_xdata()) == cumulative[0] and max(line.get_xdata()) == cumulative[-1]
    assert ax.get_xscale() == "symlog" and ax.get_xlabel().startswith("cumulative MB uploaded")


def test_accuracy_vs_energy_puts_each_evaluated_round_at_the_joules_spent_by_its_end(sweep_dir, tmp_path, drawn):
    import pyarrow as pa

    from analysis import plots

    source = sweep_dir / "dp.sigma=1.0/links.dropout.p=0.3/seed=1"
    assert plots.accuracy_vs_energy(groups_of(source), tmp_path) is None  # energy.radio = none: not drawn
    run_dir = copy_run(source, tmp_path / "lte/seed=1")
    manifest = json.loads((run_dir / "run.json").read_text())
    manifest["scenario"]["energy"] = {"radio": "lte"}
    (run_dir / "run.json").write_text(json.dumps(manifest))
    for f in sorted((run_dir / "rounds").glob("*.parquet")):  # each round's joules: 100 J more than the one before
        t = pq.read_table(f)
        rnd = t["round"][0].as_py()
        pq.write_table(t.set_column(t.schema.get_field_index("energy_j"), "energy_j", pa.array([100.0 * (rnd + 1)])), f)
    plots.accuracy_vs_energy(groups_of(run_dir), tmp_path)
    (ax,) = drawn["accuracy_vs_energy.png"].axes
    (line,) = ax.get_lines()
    r = rounds_of(run_dir)
    cumulative = [sum(100.0 * (k + 1) for k in range(i + 1)) / 1e3 for i in range(len(r["round"]))]
    points = dict(zip(line.get_xdata(), line.get_ydata(), strict=True))
    assert [points[x] for x in cumulative] == pytest.approx(r["test_accuracy"])
    assert ax.get_xlabel().startswith("cumulative kJ")


def test_the_titles_of_a_one_configuration_figure_fit_inside_it(sweep_dir, tmp_path, drawn):
    """One configuration draws the narrowest figures (one panel): no headline or panel title runs off their edges."""
    from analysis import plots

    groups = groups_of(sweep_dir / "dp.sigma=0.5/links.dropout.p=0.0")
    for draw in (
        plots.accuracy_vs_round,
        plots.accuracy_vs_time,
        plots.tau_per_round,
        plots.epsilon_per_client,
        plots.accuracy_vs_epsilon,
        plots.arrivals_per_round,
        plots.bytes_vs_budget,
        plots.accuracy_vs_bytes_up,
    ):
        draw(groups, tmp_path)
    for name, fig in drawn.items():
        fig.tight_layout()
        renderer = fig.canvas.get_renderer()
        titles = [t for t in [fig._suptitle, *(ax.title for ax in fig.axes)] if t is not None and t.get_text()]
        assert titles, name
        for title in titles:
            extent = title.get_window_extent(renderer)
            assert 0 <= extent.x0 and extent.x1 <= fig.bbox.width, f"{name}: {title.get_text()!r} runs off the figure"


def test_labels_are_the_scenario_name_and_swept_keys_never_a_timestamp(sweep_dir, tmp_path):
    src = sweep_dir / "dp.sigma=0.5/links.dropout.p=0.0/seed=0"
    copy_run(src, tmp_path / "20260101-120000-000001")
    copy_run(src, tmp_path / "20260101-120500-000002", sigma=2.0)
    copy_run(src, tmp_path / "sweep-20260101-130000/dp.q=0.1/seed=0")
    configs = sorted(groups_of(*sorted(tmp_path.iterdir())))
    assert configs == ["default (dp.sigma=0.5)", "default (dp.sigma=2.0)", "default: dp.q=0.1"]


def test_paper_style_draws_no_titles(sweep_dir, tmp_path, drawn):
    from analysis import plots

    with plots.style("paper"):
        plots.accuracy_vs_round(groups_of(sweep_dir), tmp_path)
    assert drawn["accuracy_vs_round.png"].axes[0].get_title() == ""


def test_paper_style_writes_pdf_and_svg_beside_each_png(sweep_dir, tmp_path):
    out = tmp_path / "paper"
    assert main([str(sweep_dir / "dp.sigma=0.5"), "--out", str(out), "--style", "paper"]) == 0
    for name in FIGURES:
        assert (out / name).with_suffix(".pdf").read_bytes().startswith(b"%PDF"), name
        assert b"<svg" in (out / name).with_suffix(".svg").read_bytes()[:2000], name


DOC_RUN, DOC_SWEEP = "runs/noise/dp.sigma=2.0/seed=0", "runs/noise"  # the run and sweep docs/analysis.md reads


def doc_snippets() -> list[str]:
    """docs/analysis.md's Python blocks that open the tables with pandas or polars (also run as they
    stand by tests/e2e/test_doc_snippets.py; here each table they print is checked to hold rows)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "analysis.md").read_text(), flags=re.S)
    return [b for b in blocks if "to_pandas" in b or "polars" in b]


def printed(statement: ast.stmt) -> ast.expr | None:
    """X of a `print(X)` statement, else None."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    if (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "print"
        and len(call.args) == 1
    ):
        return call.args[0]
    return None


@pytest.mark.skipif(
    importlib.util.find_spec("pandas") is None or importlib.util.find_spec("polars") is None,
    reason="pandas and polars are not installed (pip install '.[analysis]')",
)
def test_the_docs_snippets_open_real_tables_in_pandas_polars_and_duckdb(sweep_dir):
    run_dir = sweep_dir / POINTS[0]
    snippets = doc_snippets()
    assert len(snippets) == 1
    for snippet in snippets:
        code = snippet.replace(DOC_RUN, str(run_dir)).replace(DOC_SWEEP, str(sweep_dir))
        namespace: dict = {}
        for statement in ast.parse(code).body:  # every table it prints has the run's rows
            shown = printed(statement)
            if shown is not None:
                value = eval(compile(ast.Expression(shown), "docs/analysis.md", "eval"), namespace)
                rows = len(value.fetchall()) if hasattr(value, "fetchall") else len(value)
                assert rows > 0, ast.unparse(statement)
            else:
                exec(compile(ast.Module([statement], []), "docs/analysis.md", "exec"), namespace)
    assert (
        len(namespace["pl"].read_parquet(f"{run_dir}/client_rounds/*.parquet"))
        == pq.read_table(run_dir / "client_rounds").num_rows
    )

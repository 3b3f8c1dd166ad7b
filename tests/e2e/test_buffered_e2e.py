"""round.mode=buffered|async end to end on dropout.yaml: the same tables whatever the number of workers,
arrivals in virtual-time order, the staleness rule's factors, budgets never exceeded, and a run killed
with clients in flight resumes to the uninterrupted run's tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emulator.__main__ import main
from emulator.config import load
from emulator.output.results import read_table
from emulator.run.lifecycle import run
from tests.conftest import FAST, killed_after_round, killed_runs_checkpoint_state, rows

ROOT = Path(__file__).resolve().parents[2]
BUFFERED = [
    "clients.n=8",
    "budget.rounds=6",
    "round.mode=buffered",
    "clients.select=uniform",
    "buffered.concurrency=4",
    "buffered.k=2",
    "buffered.staleness=polynomial",
]
ASYNC = [*BUFFERED, "round.mode=async", "buffered.staleness=hinge", "buffered.staleness_b=1"]


@pytest.mark.parametrize("mode", [BUFFERED, ASYNC], ids=["buffered", "async"])
def test_buffered_modes_give_the_same_tables_whatever_the_number_of_workers(emulate, mode):
    one = emulate("workers=1", *mode, scenario="dropout.yaml")
    two = emulate("workers=2", *mode, scenario="dropout.yaml")
    for name in ("rounds", "client_rounds", "events"):
        assert rows(one, name) == rows(two, name), name
    versions, clients = rows(one, "rounds"), rows(one, "client_rounds")
    assert [r["round"] for r in versions] == list(range(6))
    k = 1 if "round.mode=async" in mode else 2
    assert all(r["arrived"] == k for r in versions)  # each version applies k updates
    for v in versions:  # a version's arrivals are its first k by virtual time, before its end
        mine = [c for c in clients if c["round"] == v["round"]]
        arrived = sorted(c["t_upload_end"] for c in mine if c["outcome"] == "arrived")
        assert arrived[-1] == v["t_end"] and all(v["t_start"] <= t for t in arrived)
        assert len({c["client"] for c in mine}) == len(mine)  # a client once per version
        for c in mine:
            assert c["staleness"] == v["round"] - c["version_start"] >= 0
            if c["outcome"] != "arrived":
                assert c["impact_factor"] == 0.0
            elif k == 1:  # FedAsync: alpha * hinge(a=0.5, b=1)
                s = 1.0 if c["staleness"] <= 1 else 1 / (0.5 * (c["staleness"] - 1) + 1)
                assert c["impact_factor"] == pytest.approx(0.6 * s, rel=1e-12)
            else:  # FedBuff: server_lr * (t + 1)^-0.5 / K
                assert c["impact_factor"] == pytest.approx((c["staleness"] + 1) ** -0.5 / 2, rel=1e-12)
    assert any(c["staleness"] > 0 for c in clients if c["outcome"] == "arrived")


def test_buffered_mode_never_exceeds_its_budgets(emulate):
    by_bytes = emulate(*BUFFERED, "budget.rounds=50", "budget.bytes=2.0e6", scenario="dropout.yaml")
    spent = sum(r["bytes_total"] for r in rows(by_bytes, "rounds"))
    manifest = json.loads((by_bytes / "run.json").read_text())
    assert spent <= 2.0e6 and manifest["stop_reason"].startswith("byte budget")
    by_time = emulate(*BUFFERED, "budget.rounds=50", "budget.time_s=6", scenario="dropout.yaml")
    assert max(e["t"] for e in rows(by_time, "events")) <= 6.0
    assert json.loads((by_time / "run.json").read_text())["stop_reason"] == "time budget 6.0 s reached"
    by_privacy = emulate(*BUFFERED, "budget.rounds=200", "dp.epsilon=2.2", scenario="dropout.yaml")
    clients = rows(by_privacy, "client_rounds")
    assert max(c["epsilon"] for c in clients) <= 2.2
    assert "privacy budget exhausted" in json.loads((by_privacy / "run.json").read_text())["stop_reason"]


RESUMED = [
    *FAST,
    *BUFFERED,
    "budget.rounds=24",
    "buffered.concurrency=5",
    "buffered.k=3",
    "eval.every=1",
]


def test_a_buffered_run_killed_with_clients_in_flight_resumes_to_the_uninterrupted_tables(tmp_path):
    reference = run(load("dropout.yaml", [*RESUMED, f"output.dir={tmp_path}", "output.name=ref"]))
    out = [f"output.dir={tmp_path}", "output.name=killed"]
    run_dir = tmp_path / "killed"
    killed_after_round(["scenario=dropout.yaml", *RESUMED, *out], run_dir, 8)
    assert len(read_table(run_dir, "rounds")) < 24
    state = killed_runs_checkpoint_state(run_dir)
    assert state["buffered"]["flights"], "the checkpoint holds no client in flight"
    assert main(["resume", str(run_dir)]) == 0
    for name in ("rounds", "client_rounds", "events", "privacy"):
        assert rows(run_dir, name) == rows(reference, name), name
    got, want = (json.loads((d / "run.json").read_text()) for d in (run_dir, reference))
    assert got["status"] == "complete" and len(got["resumed"]) == 1 and got["resumed"][0]["at_round"] >= 8
    assert got["privacy"] == want["privacy"]


def test_the_staleness_plot_shows_the_share_of_applied_updates_by_staleness(emulate, tmp_path, monkeypatch):
    from analysis import plots
    from analysis.load import discover
    from analysis.summary import analysed_runs

    figures = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.setdefault(path.name, fig) and path)
    run_dir = emulate(*BUFFERED, scenario="dropout.yaml")
    assert plots.staleness(analysed_runs(discover([str(run_dir)])), tmp_path) == tmp_path / "staleness.png"
    (ax,) = figures["staleness.png"].axes
    applied = [c["staleness"] for c in rows(run_dir, "client_rounds") if c["impact_factor"] > 0]
    bars = {round(p.get_x() + p.get_width() / 2): p.get_height() for p in ax.patches}
    assert bars == {t: pytest.approx(applied.count(t) / len(applied)) for t in set(applied)}

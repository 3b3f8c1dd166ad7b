"""The server's evaluation in real runs: every eval.every rounds and the last, overlapped with the next
round's training or not, through interrupts, errors and resume; and what the summaries make of NaN rounds."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from analysis import plots
from analysis.summary import analysed_runs, run_numbers
from emulator.__main__ import Terminated, main
from emulator.output import checkpoint
from emulator.output.results import RunWriter, read_table
from emulator.output.summary import summarise_run
from nodes.transport.evaluator import EvaluatorError, EvaluatorProcess
from nodes.transport.pool import WorkerPool
from tests.conftest import FAST, killed_after_round, rows
from tests.e2e.test_faults import running

ROOT = Path(__file__).resolve().parents[2]
GE = [
    "links.dropout.model=gilbert_elliott",
    "links.dropout.p_good_to_bad=0.3",
    "links.dropout.loss_bad=0.7",
    "round.deadline_s=1.5",
]
EVALUATION = ("test_loss", "test_accuracy")


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def without(table: list[dict], keys=EVALUATION) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in keys} for r in table]


def evaluated(run_dir: Path) -> list[int]:
    return [r["round"] for r in rows(run_dir, "rounds") if r["test_accuracy"] != "nan"]


def test_every_k_th_round_and_the_last_are_evaluated_and_nothing_else_changes(emulate):
    every_round = emulate("budget.rounds=5", *GE)
    every_2nd = emulate("budget.rounds=5", "eval.every=2", *GE)
    assert evaluated(every_2nd) == [1, 3, 4]  # after the 2nd and 4th rounds, and the run's last
    by_round = {r["round"]: r for r in rows(every_round, "rounds")}
    for r in rows(every_2nd, "rounds"):
        want = [by_round[r["round"]][k] for k in EVALUATION] if r["round"] in (1, 3, 4) else ["nan", "nan"]
        assert [r[k] for k in EVALUATION] == want
    assert without(rows(every_2nd, "rounds")) == without(rows(every_round, "rounds"))
    for name in ("client_rounds", "events"):
        assert rows(every_2nd, name) == rows(every_round, name), name


def _probe_bytes(emulate) -> int:
    return rows(emulate("budget.rounds=1"), "rounds")[0]["bytes_total"]


STOPS = {  # each ends the run before the round budget of 50; the first three are found as the next round is planned
    "byte budget": lambda probe: [f"budget.bytes={int(3.5 * probe)}"],
    "privacy budget exhausted": lambda probe: ["dp.epsilon=3", "dp.sigma=1.5", "dp.q=0.1", "dp.tau=15"],
    "Fu et al.: T_g": lambda probe: ["policy=fu_tuning", "fu_tuning.local_iters=2", "fu_tuning.iterations=8"],
    "time budget": lambda probe: [
        "budget.time_s=2.5",
        "round.deadline_s=1.0",
        "links.dropout.model=bernoulli",
        "links.dropout.p=0.5",
    ],
}


@pytest.mark.parametrize("stop", STOPS)
def test_the_last_round_is_evaluated_whatever_stops_the_run(emulate, stop):
    settings = ["budget.rounds=50", *STOPS[stop](_probe_bytes(emulate) if stop == "byte budget" else 0)]
    each = emulate(*settings)
    rarely = emulate(*settings, "eval.every=20")
    assert stop in manifest(rarely)["stop_reason"] and manifest(rarely)["status"] == "complete"
    last = len(rows(each, "rounds")) - 1
    assert 1 <= last < 19 and evaluated(rarely) == [last]
    assert rows(rarely, "rounds")[last] == rows(each, "rounds")[last]


@pytest.mark.parametrize("policy", ["fedavg_dp", "adap_dpfl"])  # overlap allowed / the policy reads the evaluation
def test_tables_and_checkpoints_are_the_same_with_and_without_overlap_and_any_worker_count(emulate, policy):
    runs = {
        (overlap, workers): emulate(f"policy={policy}", f"eval.overlap={overlap}", f"workers={workers}", *GE)
        for overlap, workers in [(True, 1), (True, 3), (False, 1)]
    }
    reference = runs[(False, 1)]
    for run_dir in runs.values():
        for name in ("rounds", "client_rounds", "events"):
            assert rows(run_dir, name) == rows(reference, name), name
        for f in (checkpoint.FILE, checkpoint.PREVIOUS):  # the last two checkpoints: rounds 1 and 2
            (w, state), (w_ref, state_ref) = (checkpoint._read(d / f) for d in (run_dir, reference))
            assert state == state_ref and w.keys() == w_ref.keys()
            assert all(np.array_equal(w[k], w_ref[k]) for k in w)
    assert "nan" not in {r["test_accuracy"] for r in rows(reference, "rounds")}


@pytest.mark.parametrize("policy", ["fedavg_dp", "adap_dpfl"])  # evaluated after the round / within it
def test_with_overlap_a_rounds_rows_and_checkpoint_are_written_while_the_next_round_trains(
    emulate, monkeypatch, tmp_path, policy
):
    done, run_dir = [], tmp_path / "run1"  # the second run's

    class Watched(WorkerPool):
        def run_tasks(self, rnd, frames, meanwhile=None):
            def watched():  # the round before's rows are on disk once the server's work meanwhile is done
                out = [w.task is not None for w in self.workers.values()]
                written = (run_dir / "rounds" / f"round-{rnd - 1:06d}.parquet").exists
                before = written()
                if not meanwhile():
                    return False
                kept = checkpoint._read(run_dir / checkpoint.FILE)[1]["next_round"] if rnd else 0
                done.append((rnd, any(out), before, written(), kept))
                return True

            return super().run_tasks(rnd, frames, watched if meanwhile else None)

    reference = emulate(f"policy={policy}", "budget.rounds=4", "eval.overlap=false")
    monkeypatch.setattr("emulator.run.lifecycle.WorkerPool", Watched)
    assert emulate(f"policy={policy}", "budget.rounds=4") == run_dir
    # round r - 1's rows and checkpoint written with round r's tasks out (round 0 has no round before it):
    # for every round when the policy evaluates within the round; else when its evaluation was in in time
    written = [d for d in done if d[0] > 0]
    assert all(d[1:] == (True, False, True, d[0]) for d in written), done
    assert len(written) == 3 or policy == "fedavg_dp"
    for name in ("rounds", "client_rounds", "events"):
        assert rows(run_dir, name) == rows(reference, name), name


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, Terminated])  # Ctrl-C, SIGTERM
def test_an_interrupt_while_the_next_round_trains_writes_the_round_being_evaluated(
    emulate, monkeypatch, tmp_path, interrupt
):
    reference = emulate("budget.rounds=4")

    interrupted = []

    class Interrupted(WorkerPool):
        def run_tasks(self, rnd, frames, meanwhile=None):
            if rnd == 2 and not interrupted:  # once: the resume below trains round 2
                interrupted.append(rnd)
                raise interrupt()
            return super().run_tasks(rnd, frames, meanwhile)

    monkeypatch.setattr("emulator.run.lifecycle.WorkerPool", Interrupted)
    with pytest.raises(interrupt):
        emulate("budget.rounds=4")  # round 1 is being evaluated while round 2 trains (eval.overlap)
    run_dir = tmp_path / "run1"
    m = manifest(run_dir)
    assert m["status"] == "interrupted" and not any(running(p) for p in m["workers"].values())
    assert rows(run_dir, "rounds") == rows(reference, "rounds")[:2]  # round 1 written, evaluated
    assert checkpoint._read(run_dir / checkpoint.FILE)[1]["next_round"] == 2
    assert main(["resume", str(run_dir)]) == 0
    for name in ("rounds", "client_rounds", "events"):
        assert rows(run_dir, name) == rows(reference, name), name


def kill_the_evaluator_at(monkeypatch, *rounds: int) -> None:
    """SIGKILL the evaluator process as the server asks it for the evaluation of each of `rounds`, once
    each: it is dead before the request leaves, so the server is always waiting for that evaluation."""
    original, left = EvaluatorProcess._evaluate, list(rounds)

    def evaluate(self, rnd, weights):
        if rnd in left:
            left.remove(rnd)
            os.kill(self.proc.pid, signal.SIGKILL)
        return original(self, rnd, weights)

    monkeypatch.setattr(EvaluatorProcess, "_evaluate", evaluate)


@pytest.mark.parametrize("overlap", [True, False])
def test_an_evaluator_killed_at_an_evaluation_is_restarted_and_the_tables_are_the_uninterrupted_runs(
    emulate, monkeypatch, overlap
):
    """With overlap, round 1's evaluation is in flight as round 2 trains; it is asked again of the new
    evaluator (round 3's too, to see it serve on)."""
    scenario = ["budget.rounds=5", f"eval.overlap={overlap}", *GE]
    reference = emulate(*scenario)
    kill_the_evaluator_at(monkeypatch, 1, 3)
    run_dir = emulate(*scenario)
    for name in ("rounds", "client_rounds", "events"):
        assert rows(run_dir, name) == rows(reference, name), name
    m = manifest(run_dir)
    assert m["status"] == "complete" and m["transport"]["restarts"] == 0  # no worker's
    pids = m["evaluator"]
    assert list(pids) == ["evaluator.0", "evaluator.1", "evaluator.2"] and not any(running(p) for p in pids.values())
    deaths = m["transport"]["evaluator_deaths"]
    assert [{k: v for k, v in d.items() if k != "time"} for d in deaths] == [
        {"process": name, "pid": pids[name], "exit": -9, "signal": "SIGKILL", "round": r, "restarted": True}
        for name, r in [("evaluator.0", 1), ("evaluator.1", 3)]
    ]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", d["time"]) for d in deaths)


@pytest.mark.parametrize("overlap", [True, False])
def test_an_evaluator_out_of_restarts_fails_the_run_after_the_rounds_before_it(emulate, monkeypatch, tmp_path, overlap):
    """Killed as round 1's evaluation is asked for, and again as the new one is asked for round 2's
    (an evaluation that raises there is the same error: tests/e2e/test_evaluator.py)."""
    kill_the_evaluator_at(monkeypatch, 1, 2)
    error = (
        r"the evaluator process ended \(exit -9\) before its evaluation, for round 2: "
        r"not restarted \(transport.max_restarts = 1, all spent\)"
    )
    with pytest.raises(EvaluatorError, match=f"^{error}$"):
        emulate("budget.rounds=4", f"eval.overlap={overlap}", "transport.max_restarts=1")
    m = manifest(tmp_path / "run0")
    assert m["status"] == "failed" and re.fullmatch(f"EvaluatorError: {error}", m["error"])
    assert [(d["round"], d["restarted"]) for d in m["transport"]["evaluator_deaths"]] == [(1, True), (2, False)]
    assert [r["round"] for r in rows(tmp_path / "run0", "rounds")] == [0, 1]
    assert checkpoint._read(tmp_path / "run0" / checkpoint.FILE)[1]["next_round"] == 2
    assert not any(running(p) for p in [*m["workers"].values(), *m["evaluator"].values()])


# --- resume with eval.every > 1 ------------------------------------------------------------

# Ends on the privacy budget after 11 rounds of 5 steps (56 fit): found only as round 11 is planned.
RESUMABLE = [*FAST, "budget.rounds=30", "eval.every=3", "dp.epsilon=3", "dp.sigma=1.5", "dp.q=0.1", "dp.tau=5"]


@pytest.fixture(scope="module")
def resumable_reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref")
    assert main([*RESUMABLE, f"output.dir={out}", "output.name=ref"]) == 0
    return out / "ref"


def test_a_run_killed_before_its_last_round_was_evaluated_gets_it_on_resume(resumable_reference, tmp_path):
    ref = resumable_reference
    last = len(rows(ref, "rounds")) - 1
    assert evaluated(ref) == [*range(2, last, 3), last] and last % 3 != 2
    assert "privacy" in manifest(ref)["stop_reason"]
    killed = shutil.copytree(ref, tmp_path / "killed")  # as a kill between the row and its evaluation leaves it
    m = manifest(killed)
    (killed / "run.json").write_text(json.dumps({**m, "status": "running"}))
    RunWriter(killed).write_evaluation(last, math.nan, math.nan)
    assert main(["resume", str(killed)]) == 0
    for name in ("rounds", "client_rounds", "events"):
        assert rows(killed, name) == rows(ref, name), name
    assert manifest(killed)["status"] == "complete"


def test_resume_after_sigkill_with_overlap_and_eval_every_gives_the_uninterrupted_tables(resumable_reference, tmp_path):
    run_dir = tmp_path / "killed"
    killed_after_round([*RESUMABLE, f"output.dir={tmp_path}", "output.name=killed"], run_dir, 3)
    assert manifest(run_dir)["status"] == "running"
    assert main(["resume", str(run_dir)]) == 0
    for name in ("rounds", "client_rounds", "events"):
        assert rows(run_dir, name) == rows(resumable_reference, name), name


# --- what the summaries make of rounds without an evaluation --------------------------------


@pytest.fixture(scope="module")
def stopped_early(resumable_reference, tmp_path_factory) -> Path:
    """The reference as an interrupt after round 4 leaves it: rounds 0-4, the last evaluated one round 2."""
    d = shutil.copytree(resumable_reference, tmp_path_factory.mktemp("early") / "run")
    for f in d.glob("*/round-*.parquet"):
        if int(f.stem.split("-")[1]) > 4:
            f.unlink()
    (d / "run.json").write_text(json.dumps({**manifest(d), "status": "interrupted", "stop_reason": None}))
    return d


def accuracy(run_dir: Path) -> list[float]:
    return read_table(run_dir, "rounds").sort_by("round")["test_accuracy"].to_pylist()


def test_the_run_summary_reads_final_and_best_from_the_evaluated_rounds(resumable_reference, stopped_early):
    acc = accuracy(resumable_reference)
    seen = [a for a in acc if not math.isnan(a)]
    line = summarise_run(resumable_reference).splitlines()[3]
    best = max(range(len(acc)), key=lambda i: -1 if math.isnan(acc[i]) else acc[i])
    assert line == f"accuracy  final {acc[-1]:.4f}, best {max(seen):.4f} (round {best})"
    early = summarise_run(stopped_early).splitlines()[3]
    assert early.startswith(f"accuracy  final {acc[2]:.4f} (round 2), best ")


def test_analysis_numbers_skip_rounds_without_an_evaluation(stopped_early):
    from analysis.load import discover

    (run,) = discover([str(stopped_early)]).runs
    acc = accuracy(stopped_early)
    assert math.isnan(acc[3]) and math.isnan(acc[4]) and not math.isnan(acc[2])
    numbers = run_numbers(run, target=acc[2])
    assert numbers.final_accuracy == numbers.best_accuracy == acc[2]
    assert numbers.rounds_to_target == 3  # the first evaluated round at or above the target: round 2, the third
    assert math.isnan(run_numbers(run, target=1.01).rounds_to_target)


def test_accuracy_curves_join_the_evaluated_rounds(resumable_reference, tmp_path, monkeypatch):
    from analysis.load import discover

    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.setdefault(path.name, fig))
    groups = analysed_runs(discover([str(resumable_reference)]))
    acc = accuracy(resumable_reference)
    plots.accuracy_vs_round(groups, tmp_path)
    (line,) = drawn["accuracy_vs_round.png"].axes[0].get_lines()
    assert list(line.get_xdata()) == evaluated(resumable_reference)
    assert list(line.get_ydata()) == [a for a in acc if not math.isnan(a)]
    plots.accuracy_vs_time(groups, tmp_path)
    (line,) = drawn["accuracy_vs_time.png"].axes[0].get_lines()
    t_end = read_table(resumable_reference, "rounds").sort_by("round")["t_end"].to_pylist()
    first, last = t_end[evaluated(resumable_reference)[0]], t_end[-1]
    x, y = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
    assert x[0] == first and x[-1] == last and np.isfinite(y).all()

"""A worker that answers with a finite but absurd update (tests/faulty_worker.py's POISON), in real
processes: the server rejects it as `implausible` and the run goes on (sync, async); without a bound, a
model that becomes non-finite ends the run in one line, exit 1, run.json `failed`, the rounds before
kept with their checkpoint. An async run prints no numpy warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from emulator.output import checkpoint
from tests.conftest import FAST, REPO, rows


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def faulty_cli(tmp_path: Path, poison_at: str, *overrides: str) -> subprocess.CompletedProcess:
    """`python -m tests.faulty_emulator` on the FAST scenario with DPFL_FAULT_POISON_AT; output in tmp_path/run."""
    return subprocess.run(
        [sys.executable, "-m", "tests.faulty_emulator", *FAST, f"output.dir={tmp_path}", "output.name=run", *overrides],
        cwd=REPO,
        env={**os.environ, "DPFL_FAULT_POISON_AT": poison_at},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_poisoned_sign_update_is_rejected_as_implausible_and_the_honest_clients_go_on(
    emulate, monkeypatch, faulty_workers
):
    monkeypatch.setenv("DPFL_FAULT_POISON_AT", "1:2")  # client 2's round-1 reply: a sign scale of 3e38
    run = emulate("compression.kind=sign", "budget.rounds=4")
    cr = {(r["round"], r["client"]): r for r in rows(run, "client_rounds")}
    assert cr[(1, 2)]["outcome"] == "implausible" and cr[(1, 2)]["failure"].startswith("implausible update: norm ")
    assert cr[(1, 2)]["impact_factor"] == 0.0 and cr[(1, 2)]["bytes_up"] > 0
    assert all(r["outcome"] == "arrived" for k, r in cr.items() if k != (1, 2))  # no "sign scale nan" after it
    rounds = rows(run, "rounds")
    assert [r["failed"] for r in rounds] == [0, 1, 0, 0]
    assert all(r["test_loss"] < 10 for r in rounds)  # the model was never poisoned
    assert manifest(run)["status"] == "complete"


def test_without_a_bound_a_model_made_non_finite_fails_the_run_in_one_line_keeping_the_rounds_before(tmp_path):
    # FedBuff's server learning rate 10 applies one update at a time: 10 x 3e38 overflows float32
    done = faulty_cli(
        tmp_path,
        "2:*",  # every client of the third dispatch
        "round.mode=buffered",
        "clients.select=uniform",
        "buffered.concurrency=3",
        "buffered.k=1",
        "buffered.server_lr=10",
        "aggregate.max_update_norm=inf",
        "budget.rounds=6",
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    error = lines[0]
    assert (
        error.startswith("error: round ")
        and "the global model has non-finite values after aggregation (client " in error
    )
    bad = int(error.removeprefix("error: round ").split(":")[0])
    assert "'s update has the largest norm, 7.41e+39, of the 1 policy fedavg_dp aggregated; first in " in error
    run = tmp_path / "run"
    m = manifest(run)
    assert m["status"] == "failed" and m["error"] == "ModelNotFinite: " + error.removeprefix("error: ")
    assert [r["round"] for r in rows(run, "rounds")] == list(range(bad))  # the bad version is not written
    assert checkpoint._read(run / checkpoint.FILE)[1]["next_round"] == bad


def test_an_async_run_rejects_a_poisoned_update_and_prints_no_numpy_warning(tmp_path):
    # dp.q = 0.001 of 60 samples: nearly every update's batches are empty, its train_loss NaN (np.nanmean of
    # NaNs warned); the first dispatch's clients answer with 3e38s
    done = faulty_cli(
        tmp_path,
        "0:*",
        "round.mode=async",
        "clients.select=uniform",
        "buffered.concurrency=3",
        "buffered.k=1",
        "dp.q=0.001",
        "dp.tau=1",
        "budget.rounds=4",
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "warn" not in done.stderr.lower(), done.stderr
    run = tmp_path / "run"
    outcomes = [r["outcome"] for r in rows(run, "client_rounds")]
    assert outcomes.count("implausible") == 3 and manifest(run)["status"] == "complete"
    assert sum(r["failed"] for r in rows(run, "rounds")) == 3

"""End-to-end compression: the upload's bytes against each codec's analytic frame sizes, and the
same tables whatever the number of workers, with error feedback's residuals crossing the wire, and
after a kill and a resume."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from emulator.__main__ import main
from emulator.config import load
from emulator.run.lifecycle import run
from nodes.contracts.codecs import part_bytes
from nodes.contracts.schema import CompressionConfig
from tests.conftest import FAST, gone, killed_after_round, killed_runs_checkpoint_state, rows

# A model large enough that the messages' headers (names, shapes, metrics) are a small share of
# even the top-1 % update: 145,418 float32 parameters.
BIG = ["model.name=mlp", "model.hidden=2048", "budget.rounds=1", "clients.n=3"]
CODECS = {
    "qsgd8": CompressionConfig(kind="qsgd", bits=8),
    "topk1%": CompressionConfig(kind="topk", fraction=0.01),
    "sign": CompressionConfig(kind="sign"),
}


def shapes(run_dir) -> dict[str, tuple[int, ...]]:
    with np.load(run_dir / "checkpoint.npz") as z:
        return {k: z[k].shape for k in z.files if k != "__state__"}


def test_bytes_up_shrink_by_each_codecs_analytic_ratio(emulate):
    plain = emulate(*BIG)
    sizes = [int(np.prod(s)) for s in shapes(plain).values()]
    up = sum(r["bytes_up"] for r in rows(plain, "rounds"))
    for name, codec in CODECS.items():
        run = emulate(
            *BIG,
            f"compression.kind={codec.kind}",
            f"compression.bits={codec.bits}",
            f"compression.fraction={codec.fraction}",
        )
        measured = up / sum(r["bytes_up"] for r in rows(run, "rounds"))
        analytic = sum(4 * n for n in sizes) / sum(part_bytes(codec, n) for n in sizes)
        assert measured == pytest.approx(analytic, rel=0.05), (name, measured, analytic)
        # R_s and the policies estimate the upload at the compressed update's size, less its metrics
        estimate = json.loads((run / "run.json").read_text())["derived_budgets"]["update_bytes"]
        assert all(0 < r["bytes_up"] - estimate < 1000 for r in rows(run, "client_rounds")), (name, estimate)
        # the download is the plain task's, and the clock timed the smaller upload
        assert [r["bytes_down"] for r in rows(run, "client_rounds")] == [
            r["bytes_down"] for r in rows(plain, "client_rounds")
        ]
    assert sum(4 * n for n in sizes) / sum(part_bytes(CODECS["topk1%"], n) for n in sizes) > 45
    assert "update_bytes" not in json.loads((plain / "run.json").read_text())["derived_budgets"]


QSGD4 = ["compression.kind=qsgd", "compression.bits=4", "budget.rounds=4"]
EF = [*QSGD4, "compression.error_feedback=true"]


def test_compressed_runs_with_error_feedback_are_the_same_whatever_the_number_of_workers(emulate):
    one = emulate("workers=1", *EF)
    two = emulate("workers=2", *EF)
    for name in ("rounds", "client_rounds", "events"):
        assert rows(one, name) == rows(two, name), name
    # the residuals change the model, and cross the wire uncharged: the links carry what they would without
    without = emulate("workers=1", *QSGD4)
    assert rows(one, "rounds")[-1]["test_loss"] != rows(without, "rounds")[-1]["test_loss"]
    for name in ("bytes_down", "bytes_up"):
        assert [r[name] for r in rows(one, "client_rounds")] == [r[name] for r in rows(without, "client_rounds")]


# Error feedback across a SIGKILL: 3 of 6 clients a round (a residual waits out the rounds its client
# sits out), transfers lost on a Bernoulli link (a task lost on the way down leaves the residual as it
# was, an upload lost on the way up does not), QSGD's draws from the per-(round, client) streams.
RESUMED = [
    *FAST,
    "compression.kind=qsgd",
    "compression.bits=8",
    "compression.error_feedback=true",
    "budget.rounds=30",
    "clients.select=uniform",
    "clients.per_round=3",
    "links.dropout.model=bernoulli",
    "links.dropout.p=0.2",
]
KILL_AT_ROUND = 4


def test_a_run_with_error_feedback_killed_and_resumed_gives_the_uninterrupted_tables(tmp_path):
    reference = run(load(None, [*RESUMED, "workers=1", f"output.dir={tmp_path}", "output.name=ref"]))
    run_dir = tmp_path / "killed"
    killed_after_round([*RESUMED, "workers=2", f"output.dir={tmp_path}", "output.name=killed"], run_dir, KILL_AT_ROUND)
    m = json.loads((run_dir / "run.json").read_text())
    assert m["status"] == "running" and len(rows(run_dir, "rounds")) < 30
    state = killed_runs_checkpoint_state(run_dir)
    assert state["residuals"], "the checkpoint holds no residual: nothing of error feedback was resumed"
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in m["workers"].values()):  # the orphaned workers notice
        assert time.monotonic() < deadline, "workers outlived their server"
        time.sleep(0.1)

    assert main(["resume", str(run_dir)]) == 0
    for name in ("rounds", "client_rounds", "events", "privacy"):
        assert rows(run_dir, name) == rows(reference, name), name
    assert (
        json.loads((run_dir / "run.json").read_text())["privacy"]
        == json.loads((reference / "run.json").read_text())["privacy"]
    )
    outcomes = {r["outcome"] for r in rows(reference, "client_rounds")}
    assert {"arrived", "lost_down", "lost_up"} <= outcomes
    assert all(r["selected"] == 3 for r in rows(reference, "rounds"))

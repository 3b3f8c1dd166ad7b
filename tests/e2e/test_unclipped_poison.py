"""Non-private unclipped training (dp.clip = 0, dp.sigma = 0), where no bound derives from the task: a worker
answering with 3e38s (tests/faulty_worker.py's POISON) is rejected as `implausible` by float32's bound
(emulator.aggregate.plausibility.beyond_float32), and the honest clients go on with a model that stays sane."""

from __future__ import annotations

import math

from tests.conftest import rows
from tests.e2e.test_poisoned_updates import faulty_cli, manifest


def test_a_poisoned_reply_in_unclipped_training_is_implausible_and_the_model_never_poisoned(tmp_path):
    done = faulty_cli(tmp_path, "1:2", "dp.clip=0", "dp.sigma=0", "budget.rounds=4")
    assert done.returncode == 0, done.stderr
    run = tmp_path / "run"
    cr = {(r["round"], r["client"]): r for r in rows(run, "client_rounds")}
    assert cr[(1, 2)]["outcome"] == "implausible"
    assert "a value of magnitude 3e+38 in the model it trained, 2^64 or more" in cr[(1, 2)]["failure"]
    assert all(r["outcome"] == "arrived" for k, r in cr.items() if k != (1, 2))  # none non-finite after it
    rounds = rows(run, "rounds")
    assert [r["failed"] for r in rounds] == [0, 1, 0, 0]
    assert all(math.isfinite(r["test_loss"]) and r["test_loss"] < 10 for r in rounds)
    m = manifest(run)
    assert m["status"] == "complete" and m["transport"]["rejected"] == 0  # no worker sent a non-finite update

"""End-to-end train.bundle = K: real server and workers, bundles on the wire (nodes/training/bundle.py)."""

import json

import numpy as np

from emulator.output.summary import summarise_run
from tests.conftest import rows

BUNDLED = ["clients.n=20", "train.bundle=8", "transport.wire_log=true", "data.samples_per_client=30"]


def test_a_bundled_run_charges_each_client_its_own_bytes_and_records_k(emulate):
    """Each client's link is charged its own task's and update's bytes, as at K = 1; the wire carried one
    message per bundle down (its bytes on the bundle's first client's line) and one per client up."""
    run = emulate(*BUNDLED)
    assert json.loads((run / "run.json").read_text())["scenario"]["train"]["bundle"] == "8"
    cr = rows(run, "client_rounds")
    assert {r["outcome"] for r in cr} == {"arrived"} and len(cr) == 3 * 20
    assert len({r["bytes_down"] for r in cr}) == 1  # every client's task is the same size
    wire = {(w["round"], w["client"]): w for w in map(json.loads, (run / "wire.jsonl").read_text().splitlines())}
    assert all(r["bytes_up"] == wire[(r["round"], r["client"])]["sent"] for r in cr)
    firsts = sorted(c for (rnd, c), w in wire.items() if w["received"] and rnd == 0)
    assert firsts == [0, 8, 16]  # 20 clients in id order: bundles of 8, 8 and 4
    bundle_bytes = [wire[(0, c)]["received"] for c in firsts]
    assert bundle_bytes[0] < 2 * cr[0]["bytes_down"]  # the global model crossed once for 8 clients


def test_bundled_runs_give_identical_tables_whatever_the_number_of_workers(emulate):
    """Bundles are a pure function of the round's plan and K: one worker or two, the same tables; and
    each client's update is its K = 1 update within float32 rounding (compounded over the rounds)."""
    one = emulate("workers=1", *BUNDLED)
    two = emulate("workers=2", *BUNDLED)
    alone = emulate("workers=2", *BUNDLED, "train.bundle=1")
    for name in ("rounds", "client_rounds", "events"):
        assert rows(one, name) == rows(two, name), name
    bundled, single = rows(one, "client_rounds"), rows(alone, "client_rounds")
    assert [(r["bytes_down"], r["bytes_up"]) for r in bundled] == [(r["bytes_down"], r["bytes_up"]) for r in single]
    np.testing.assert_allclose([r["update_norm"] for r in bundled], [r["update_norm"] for r in single], rtol=1e-3)


def test_auto_trains_the_k_it_chose_and_says_so(emulate):
    """train.bundle = auto (the default; FAST pins 1) on a dense model: 6 clients a round over 2 workers give K = 3.
    run.json records the choice and keeps K in the resolved scenario (what a resume trains); the wire
    carried bundles of 3; the tables are those of a run at train.bundle = 3; the summary names K."""
    auto = emulate("train.bundle=auto", "transport.wire_log=true")
    doc = json.loads((auto / "run.json").read_text())
    why = "dense model on cpu: 6 clients a round over 2 workers"
    assert doc["bundle"] == {"setting": "auto", "chosen": 3, "why": why}
    assert doc["scenario"]["train"]["bundle"] == "3"
    wire = [json.loads(line) for line in (auto / "wire.jsonl").read_text().splitlines()]
    assert sorted(w["client"] for w in wire if w["received"] and w["round"] == 0) == [0, 3]
    explicit = emulate("train.bundle=3")
    assert "bundle" not in json.loads((explicit / "run.json").read_text())
    for name in ("rounds", "client_rounds", "events"):
        assert rows(auto, name) == rows(explicit, name), name
    assert f"bundles   K = 3 (train.bundle=auto: {why})" in summarise_run(auto)
    assert "bundles   K = 3 (train.bundle)" in summarise_run(explicit)

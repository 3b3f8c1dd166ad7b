"""A user's loss model without forking: links.dropout.model=package.module:ClassName and its
links.dropout.args, end to end from the command line (the plug-in: tests/plugins/link_loss.py)."""

import json

from emulator.output.results import read_table
from tests.cli import emulator

EVERY_KTH = "tests.plugins.link_loss:EveryKthClient"


def test_a_user_loss_model_decides_every_transfer_end_to_end(tmp_path):
    r = emulator(
        tmp_path,
        f"links.dropout.model={EVERY_KTH}",
        "links.dropout.args.k=3",
        "workers=1",
        "clients.n=6",
        "budget.rounds=3",
        "dp.tau=2",
        "data.samples_per_client=60",
        "output.dir=runs",
        "output.name=k3",
        "output.progress=false",
    )
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "runs" / "k3"
    outcomes = [(c["round"], c["client"], c["outcome"]) for c in read_table(run_dir, "client_rounds").to_pylist()]
    # clients 0 and 3 lose their task on the way down in every round, and no one else loses anything
    assert outcomes == [(rnd, c, "lost_down" if c % 3 == 0 else "arrived") for rnd in range(3) for c in range(6)]
    lost = [(e["round"], e["client"]) for e in read_table(run_dir, "events").to_pylist() if "lost" in e["kind"]]
    assert lost == [(rnd, c) for rnd in range(3) for c in (0, 3)]
    assert [r["arrived"] for r in read_table(run_dir, "rounds").to_pylist()] == [4, 4, 4]
    dropout = json.loads((run_dir / "run.json").read_text())["scenario"]["links"]["dropout"]
    assert (dropout["model"], dropout["args"]) == (EVERY_KTH, {"k": 3})


def test_a_loss_model_option_that_does_not_fit_is_one_line_exit_2(tmp_path):
    r = emulator(tmp_path, f"links.dropout.model={EVERY_KTH}", "links.dropout.args.k=0")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "links.dropout.args.k = 0: expected an integer in [1, 1000000]" in r.stderr

"""dp_fedavg end to end: real workers, what its tables and run.json say (issue 35)."""

import itertools
import json

import numpy as np
import pytest

from emulator.config import load
from emulator.output.results import read_table
from emulator.output.summary import summarise_run
from emulator.run.lifecycle import run
from tests.conftest import privacy_ledgers
from tests.golden.runs import result_of

pytestmark = pytest.mark.e2e


def run_dp_fedavg(tmp_path, name, *overrides, scenario="dp_fedavg.yaml"):
    output = [f"output.dir={tmp_path}", f"output.name={name}", "output.progress=false"]
    d = run(load(scenario, ["policy=dp_fedavg", *output, *overrides]))
    manifest = json.loads((d / "run.json").read_text())
    assert manifest["status"] == "complete"
    return d, manifest, read_table(d, "rounds").to_pylist()


def states(rounds):
    return [json.loads(r["policy_state"]) for r in rounds]


def test_one_or_two_workers_give_the_same_tables(tmp_path):
    one, m1, _ = run_dp_fedavg(tmp_path, "one", "workers=1", "budget.rounds=4")
    two, m2, _ = run_dp_fedavg(tmp_path, "two", "workers=2", "budget.rounds=4")
    a, b = result_of(one), result_of(two)
    for name, table in a.tables.items():
        assert table.equals(b.tables[name]), name
    assert m1["privacy"] == m2["privacy"] and m1["privacy"]["population"]["rounds"] == 4
    assert a.tables["privacy"].equals(b.tables["privacy"]) and len(a.tables["privacy"]) > 0


def test_adaptive_clipping_tracks_the_target_quantile_of_the_update_norms(tmp_path):
    """Andrew et al. Alg. 1 on a near-stationary population (40 clients every round, a small local
    lr so the update norms drift slowly): S starts at 0.1, far below the median norm, and after 50
    rounds stays within 10 % of the round's true median of the unclipped norms."""
    _, manifest, rounds = run_dp_fedavg(
        tmp_path,
        "track",
        "clients.n=40",
        "clients.per_round=0",
        "dp.lr=0.02",
        "dp.epsilon=inf",
        "dp_fedavg.adaptive.noise=0",  # sigma_b = m / 20 = 2
        "budget.rounds=60",
    )
    s = states(rounds)
    clip = np.array([x["clip"] for x in s])
    median = np.array([x["norm_quantile"] for x in s])
    assert clip[0] == 0.1 and median[0] > 2 * clip[0]  # it has a long way to go
    error = np.abs(clip[50:] / median[50:] - 1)
    assert error.max() <= 0.1, error
    assert abs(clip[50:].mean() / median[50:].mean() - 1) <= 0.1
    assert all(x["clip_next"] == y["clip"] for x, y in itertools.pairwise(s))  # each round's S is the last's next
    assert manifest["privacy"]["population"]["amplification_valid"]


def test_availability_marks_the_amplified_epsilon_invalid_and_the_summary_says_why(tmp_path):
    d, manifest, rounds = run_dp_fedavg(
        tmp_path, "cellular", "dp.epsilon=inf", "budget.rounds=3", scenario="cellular.yaml"
    )
    population = manifest["privacy"]["population"]
    assert not population["amplification_valid"]
    assert population["amplification_invalid_reason"].startswith("availability.model=diurnal")
    assert all(not x["amplification_valid"] and not x["epsilon_valid"] for x in states(rounds))
    sampling = next(line for line in summarise_run(d).splitlines() if line.startswith("sampling"))
    assert "does NOT hold: availability.model=diurnal" in sampling
    # without amplification: q = 1 for the rounds each client trained in, whatever availability did
    trained = {c: v["rounds_trained"] for c, v in privacy_ledgers(d).items()}
    assert manifest["privacy"]["clients_charged"] == len(trained) > 0
    clients = read_table(d, "client_rounds").to_pylist()
    for c, k in trained.items():
        assert k == sum(1 for row in clients if row["client"] == int(c) and row["local_steps"] > 0)


def test_local_noise_with_dropouts_records_its_short_rounds(tmp_path):
    """dropout.yaml's losses and deadline: a round whose uploads did not all arrive carries less than
    the accounted noise, and says so."""
    _, manifest, rounds = run_dp_fedavg(
        tmp_path, "local", "dp_fedavg.noise=local", "dp.epsilon=inf", "budget.rounds=4", scenario="dropout.yaml"
    )
    short = [r["round"] for r in rounds if r["arrived"] < r["selected"]]
    assert short, "dropout.yaml loses some uploads in 4 rounds"
    population = manifest["privacy"]["population"]
    assert not population["noise_complete"] and population["noise_short_reason"]
    assert [x["epsilon_valid"] for x in states(rounds)] == [r["round"] < short[0] for r in rounds]
    for r, x in zip(rounds, states(rounds)):
        assert x["noise_std"] == pytest.approx(x["z"] * x["clip"] * np.sqrt(r["arrived"] / r["selected"]) / x["m"])

"""Each paper policy end to end: real workers, its shipped scenario, and what the Parquet tables show."""

import itertools
import json
import math

import pytest

from emulator.config import load
from emulator.output.results import read_privacy, read_table
from emulator.run.lifecycle import run

TOL = 1e-9  # client-level calibrations land on the target up to rounding


def run_scenario(tmp_path, scenario, *overrides):
    cfg = load(scenario, ["workers=2", f"output.dir={tmp_path}", "output.progress=false", *overrides])
    d = run(cfg)
    manifest = json.loads((d / "run.json").read_text())
    assert manifest["status"] == "complete"
    rounds = read_table(d, "rounds").to_pylist()
    clients = read_table(d, "client_rounds").to_pylist()
    assert rounds and clients
    return cfg, manifest, rounds, clients


def privacy_of(out):
    """The privacy table of the one run in `out`: a row per client charged."""
    (run_dir,) = (d for d in out.iterdir() if (d / "run.json").is_file())
    return read_privacy(run_dir).to_pylist()


def state(row):
    return json.loads(row["policy_state"])


def assert_within_budget(cfg, manifest, rounds, clients):
    target = cfg.dp.epsilon * (1 + TOL)
    assert all(c["epsilon"] <= target for c in clients)
    assert all(r["max_epsilon"] <= target for r in rounds)
    assert all(c["impact_factor"] >= 0 for c in clients)
    assert manifest["privacy"]["clients_charged"] > 0  # the accountant's final word: privacy.parquet


def mean_tau(rounds):
    return sum(r["tau"] for r in rounds) / len(rounds)


def test_ali_dpfl_half_the_bytes_lowers_R_s_and_raises_tau(tmp_path):
    # eps = 1.5: R_c = 8 steps. 570 kB buys R_s = 10 >= R_c rounds (tau* = 1, Lemma 1); half buys 5 < R_c.
    cfg, full_m, full, _ = run_scenario(
        tmp_path, "ali_dpfl.yaml", "dp.epsilon=1.5", "budget.bytes=5.7e+5", "output.name=full"
    )
    _, half_m, half, half_c = run_scenario(
        tmp_path, "ali_dpfl.yaml", "dp.epsilon=1.5", "budget.bytes=2.85e+5", "output.name=half"
    )
    R_s_full, R_s_half = full_m["derived_budgets"]["R_s"], half_m["derived_budgets"]["R_s"]
    R_c = state(full[0])["R_c"]
    assert R_s_full >= R_c == 8 > R_s_half and R_s_half < R_s_full
    assert {r["tau"] for r in full} == {1.0} and len(full) == R_c  # tau* = 1 until t = R_c
    assert mean_tau(half) > mean_tau(full)
    assert full_m["stop_reason"].startswith("ALI-DPFL: t = 8")
    # per round: tau, mu (from the previous round's updates), T = min(R_s * previous tau, R_c)
    for prev, row in itertools.pairwise(half):
        assert row["mu"] == state(prev)["mu_measured"] > 0
        assert row["horizon"] == min(R_s_half * prev["tau"], R_c)
        assert row["tau"] == min(math.floor(state(row)["tau_star"] + 0.5), R_c - state(row)["t"])
    assert sum(r["tau"] for r in half) <= R_c
    assert_within_budget(cfg, half_m, half, half_c)


def test_adap_dpfl_sigma_decays_and_ledgers_compose_it(tmp_path):
    # 20 rounds: the test loss must stall twice in a row at least once (it does at rounds 15-16)
    cfg, m, rounds, clients = run_scenario(tmp_path, "adap_dpfl.yaml", "adap_dpfl.patience=2", "budget.rounds=20")
    sigmas = [r["sigma"] for r in rounds]
    assert sigmas[0] == 1.5 and min(sigmas) < 1.5 and sigmas == sorted(sigmas, reverse=True)
    assert {c["sigma"] for c in clients} == set(sigmas)
    ledger = json.loads(next(r["ledger"] for r in privacy_of(tmp_path) if r["client"] == 0))
    assert {e["sigma"] for e in ledger["entries"]} == set(sigmas)
    assert_within_budget(cfg, m, rounds, clients)


def test_fu_tuning_output_noise_spends_eps_over_T_l_rounds(tmp_path):
    cfg, m, rounds, clients = run_scenario(tmp_path, "fu_tuning.yaml", "fu_tuning.iterations=36")
    assert len(rounds) == 6 and m["stop_reason"].startswith("Fu et al.")  # E = 36^(1/2), T_g = 36 / E
    assert {r["tau"] for r in rounds} == {6.0} and {r["selected"] for r in rounds} == {5}
    assert [sorted(c["client"] for c in clients if c["round"] == k) for k in (0, 1)] == [
        [0, 1, 2, 3, 4],
        [5, 6, 7, 8, 9],
    ]
    assert state(rounds[0])["T_l"] == 3 and rounds[0]["sigma"] > 0
    assert all(c["local_steps"] == 6 and c["sigma"] == 0.0 for c in clients)  # noise-free local steps
    charged = privacy_of(tmp_path)
    assert len(charged) == 10 and m["privacy"]["clients_charged"] == 10  # round robin: every client released
    for e in charged:
        assert e["epsilon"] == pytest.approx(cfg.dp.epsilon, rel=TOL)
    assert_within_budget(cfg, m, rounds, clients)


def test_padpfl_noise_and_impact_factors_per_round(tmp_path):
    cfg, m, rounds, clients = run_scenario(tmp_path, "padpfl.yaml")
    sigma_C = {state(r)["sigma_C"] for r in rounds}
    assert len(sigma_C) == 1 and sigma_C.pop() > 0
    assert any(state(r)["sigma_S"] > 0 for r in rounds)
    before, after = (phase.values for phase in cfg.impact.schedule)  # the schedule changes at round 5
    assert all(c["impact_planned"] == (before if c["round"] < 5 else after)[c["client"]] for c in clients)
    for rnd in {c["round"] for c in clients}:
        arrived = [c["impact_factor"] for c in clients if c["round"] == rnd and c["outcome"] == "arrived"]
        assert sum(arrived) == pytest.approx(1.0)
    assert_within_budget(cfg, m, rounds, clients)


def test_udp_crd_discounts_T_and_spends_exactly_eps(tmp_path):
    # zeta this large discounts after every round from round 1 on; T: 10, 10, 9, 8, 7, 6 and
    # round 5 is the last (floor(0.9 * 1) + 5 = 5), so eq. 25 spreads the budget exactly.
    cfg, m, rounds, clients = run_scenario(tmp_path, "udp_crd.yaml", "udp_crd.horizon=10", "udp_crd.zeta=1e9")
    assert [r["horizon"] for r in rounds] == [10, 10, 9, 8, 7, 6]
    assert [state(r)["discounted"] for r in rounds] == [False] + [True] * 5
    assert m["stop_reason"].startswith("UDP: horizon")
    sigmas = [r["sigma"] for r in rounds]
    assert sigmas[1] == pytest.approx(sigmas[0]) and all(b < a for a, b in itertools.pairwise(sigmas[1:]))
    assert {r["selected"] for r in rounds} == {5}
    charged = privacy_of(tmp_path)
    assert charged and m["privacy"]["clients_charged"] == len(charged)
    for e in charged:
        assert abs(e["epsilon"] - cfg.dp.epsilon) < 1e-6
    assert_within_budget(cfg, m, rounds, clients)
    assert math.isclose(max(r["max_epsilon"] for r in rounds), cfg.dp.epsilon, rel_tol=1e-9)

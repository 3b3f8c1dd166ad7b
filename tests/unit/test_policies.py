"""The five paper policies, their accountants and the trainer's generic mechanisms, without workers.

Expected values are computed by hand from the papers' equations, not by the code under test.
"""

import json
import math

import numpy as np
import pytest
import torch

from emulator.config import SCENARIO_DIR, ConfigError, load, round_settings
from emulator.policies import POLICIES, ClientResult, ClientTask, RunContext
from emulator.policies.accounting import (
    MechanismMismatch,
    RdpAccountant,
    ReleaseAccountant,
)
from emulator.policies.ali_dpfl import estimate_mu, optimal_tau
from emulator.policies.fu_tuning import local_iterations
from emulator.policies.udp_crd import discounted_horizon, wei_crd_sigma, wei_epsilon
from emulator.privacy import max_steps
from emulator.rounds.budgets import Budgets
from emulator.rounds.round import play_round
from emulator.timemodel.clock import Clock
from emulator.timemodel.resources import build_resources
from nodes.contracts.rng import stream
from nodes.transport.dispatch import Reply
from tests.policies import scenario_policy

# Opacus's backward hooks fire on the first layer's data input in the trainer tests: expected, harmless.
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

SIZES = [100, 200, 300, 400]
D = 50  # model parameters


def policy(name, *overrides, sizes=SIZES, rounds_budget=10):
    cfg = load(None, [f"policy={name}", f"clients.n={len(sizes)}", *overrides])
    return scenario_policy(
        cfg, RunContext(n_clients=len(sizes), data_sizes=list(sizes), num_params=D, rounds_budget=rounds_budget)
    )


def weights(value):
    return {"w": np.full((2, 3), value, dtype=np.float32), "b": np.full(3, value, dtype=np.float32)}


def result(client, value, **metrics):
    return ClientResult(
        client=client, weights=weights(value), steps=1, train_loss=0.0, update_norm=0.0, metrics=metrics
    )


def play(p, rnd, loss, **metrics):
    """The real round (emulator.rounds.round.play_round) on fresh default links, every selected client
    training in-process: each uploads weights(1.0) and `metrics`; the server's test loss is `loss`."""
    cfg = p.scenario
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, cfg.seed)

    def train(rnd, frames):
        update = {
            "model": weights(1.0),
            "metrics": {"steps": 1, "train_loss": 0.0, "update_norm": 0.0, **metrics},
        }
        return {c: Reply(client=c, message=dict(update), nbytes=1000) for c, _ in frames}

    record = play_round(
        rnd,
        weights(0.0),
        settings=round_settings(p.scenario),
        policy=p,
        clock=Clock(resources, p.ctx.settings.seed),
        budgets=Budgets(
            p.scenario.budget,
            resources,
            task_bytes=1000,
            per_round=p.scenario.clients.per_round or p.scenario.clients.n,
            tau=p.ctx.settings.dp.tau,
            deadline_s=p.scenario.round.deadline_s,
        ),
        train=train,
        evaluate=lambda w: (loss, 0.5),
    )
    return record.plan


# --- registry, config, wire ------------------------------------------------------------


def test_registry_has_all_nine_policies():
    assert set(POLICIES) == {
        "fedavg_dp",
        "ali_dpfl",
        "adap_dpfl",
        "fu_tuning",
        "padpfl",
        "udp_crd",
        "fedcs",
        "oort",
        "dp_fedavg",
    }


def test_every_policy_file_is_registered_by_its_one_line():
    """A policy class defined under emulator/policies/ but missing from BUILT_IN would be a
    policy no scenario can name; each registry line names the file that defines the class."""
    import importlib
    import inspect
    import pkgutil

    import emulator.policies as package
    from emulator.policies import BUILT_IN, Policy

    defined = set()
    for info in pkgutil.iter_modules(package.__path__):
        if info.name == "boundary":  # CheckedPolicy wraps the run's policy: it is no policy to name
            continue
        module = importlib.import_module(f"emulator.policies.{info.name}")
        for cls in vars(module).values():
            if (
                inspect.isclass(cls)
                and issubclass(cls, Policy)
                and cls is not Policy
                and cls.__module__ == module.__name__
            ):
                defined.add(f"{info.name}:{cls.__name__}")
    assert defined == set(BUILT_IN)
    assert [POLICIES[name].__name__ for name in POLICIES] == [entry.split(":")[1] for entry in BUILT_IN]


@pytest.mark.parametrize(
    "override, key",
    [
        ("udp_crd.beta=1.0", "udp_crd.beta"),
        ("adap_dpfl.decay=0", "adap_dpfl.decay"),
        ("adap_dpfl.patience=0", "adap_dpfl.patience"),
        ("fu_tuning.mechanism=cauchy", "fu_tuning.mechanism"),
        ("padpfl.bound=0", "padpfl.bound"),
        ("ali_dpfl.gamma=-1", "ali_dpfl.gamma"),
    ],
)
def test_bad_policy_settings_name_the_key(override, key):
    chosen = f"policy={key.split('.')[0]}"  # only the chosen policy's section is read, and so checked
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load(None, [chosen, override])


def test_fu_tuning_without_E_or_T_fills_the_round_budget():
    # issue 12 item 7: T = R_s^(z+1), so E = R_s^z and T_g = T / E = R_s
    gaussian = policy("fu_tuning", rounds_budget=7)
    assert (gaussian.E, gaussian.T_g) == (7, 7)
    laplace = policy("fu_tuning", "fu_tuning.mechanism=laplace", rounds_budget=7)
    assert (laplace.E, laplace.T_g) == (49, 7)


@pytest.mark.parametrize("name", ["ali_dpfl", "adap_dpfl", "fu_tuning", "padpfl", "udp_crd", "ali_dpfl_vs_fixed"])
def test_shipped_scenarios_load(name):
    cfg = load(f"{name}.yaml")
    assert cfg.policy == (name if name in POLICIES else "ali_dpfl")
    assert cfg.data.dataset == "synthetic" and cfg.workers == 2
    assert (SCENARIO_DIR / f"{name}.yaml").is_file()


def test_task_wire_round_trip_keeps_types():
    t = ClientTask(
        client=3,
        steps=2,
        lr=0.1,
        sigma=0.0,
        clip=1.0,
        q=1.0,
        prox_mu=0.5,
        weight_clip=2.0,
        output_noise="laplace",
        output_noise_scale=0.25,
        report_grad_diff=True,
    )
    back = ClientTask.from_wire(t.to_wire())
    assert back == t and isinstance(back.output_noise, str) and back.report_grad_diff is True


# --- ALI-DPFL ---------------------------------------------------------------------------


def test_eq9_by_hand():
    # mu = 2, T = 10, C = 1, sigma = 1, d = 100, B = 10, Gamma = 1: sigma^2 C^2 d / B^2 = 1;
    # numerator 4/4 + 3 + 2*1*10*2 + 1 = 45, denominator (2 + 1/10)(1 + 1) = 4.2.
    assert optimal_tau(2.0, 10, 1.0, 1.0, 100, 10.0, 1.0) == pytest.approx(math.sqrt(1 + 45 / 4.2), rel=1e-12)
    # Gamma = 0, T = 4, mu = 1, C = 2, sigma = 0.5, d = 16, B = 2: noise = 0.25*4*16/4 = 4;
    # numerator 4 + 12 + 0 + 4 = 20, denominator (2.25)(4 + 4) = 18.
    assert optimal_tau(1.0, 4, 2.0, 0.5, 16, 2.0, 0.0) == pytest.approx(math.sqrt(1 + 20 / 18), rel=1e-12)


def test_mu_estimate_is_the_factor_weighted_ratio():
    rs = [result(0, 0.0, grad_change=3.0, param_change=1.5), result(1, 0.0, grad_change=1.0, param_change=2.0)]
    assert estimate_mu(rs, {0: 0.25, 1: 0.75}) == pytest.approx(0.25 * 2.0 + 0.75 * 0.5)
    assert estimate_mu([result(0, 0.0, grad_change=1.0, param_change=0.0)], {0: 1.0}) is None


ALI = ["dp.q=0.1", "dp.sigma=1.5", "dp.epsilon=3", "dp.delta=1e-5", "dp.tau=3", "dp.clip=1.0", "ali_dpfl.gamma=2"]


def test_ali_dpfl_rounds_follow_eq9_with_T_from_previous_tau():
    p = policy("ali_dpfl", *ALI, rounds_budget=8)
    R_c = max_steps(0.1, 1.5, 1e-5, 3.0)
    assert p.R_c == R_c == 56 and p.B_hat == pytest.approx(0.1 * 100)
    first = play(p, 0, 2.0, grad_change=4.0, param_change=2.0)  # mu = 2
    assert [t.steps for t in first.tasks] == [3] * 4 and all(t.report_grad_diff for t in first.tasks)
    assert first.state["T"] == min(8 * 3, R_c) and first.state["mu"] is None
    second = play(p, 1, 1.9, grad_change=1.0, param_change=1.0)  # mu = 1
    want = optimal_tau(2.0, 24, 1.0, 1.5, D, 10.0, 2.0)
    assert second.state["tau_star"] == pytest.approx(want) and second.state["mu"] == 2.0
    assert second.state["tau"] == math.floor(want + 0.5) == second.tasks[0].steps
    third = p.configure_round(2, [0, 1, 2, 3])
    T = min(8 * math.floor(want + 0.5), R_c)  # T from the previous tau*
    assert third.state["T"] == T
    assert third.state["tau_star"] == pytest.approx(optimal_tau(1.0, T, 1.0, 1.5, D, 10.0, 2.0))


def test_ali_dpfl_tau_is_1_when_R_s_reaches_R_c_and_stops_at_R_c():
    p = policy("ali_dpfl", *ALI, rounds_budget=100)  # R_s = 100 >= R_c = 56
    for rnd in range(56):
        assert not p.should_stop()
        plan = play(p, rnd, 1.0, grad_change=5.0, param_change=1.0)
        assert plan.state["tau"] == 1.0 and {t.steps for t in plan.tasks} == {1}
        assert not plan.tasks[0].report_grad_diff  # mu is not needed
    assert "R_c" in p.should_stop()


def test_ali_dpfl_last_round_is_capped_at_R_c_and_stops_at_R_s():
    p = policy("ali_dpfl", *ALI, rounds_budget=2)
    p.t = 55
    assert {t.steps for t in p.configure_round(0, [0, 1]).tasks} == {1}  # 56 - 55 steps left
    q = policy("ali_dpfl", *ALI, rounds_budget=2)
    play(q, 0, 1.0, grad_change=1.0, param_change=1.0)
    play(q, 1, 1.0, grad_change=1.0, param_change=1.0)
    assert "R_s" in q.should_stop()


# --- Adap DP-FL -------------------------------------------------------------------------


def test_adap_dpfl_decays_exactly_after_4_non_improving_rounds():
    p = policy("adap_dpfl", "dp.sigma=2.0", "adap_dpfl.decay=0.5")
    sigmas = []
    for rnd, loss in enumerate([1.0, 0.9, 0.95, 0.91, 0.9, 0.92, 0.8, 0.85, 0.81, 0.82, 0.83]):
        sigmas.append(play(p, rnd, loss).state["sigma"])
    # best 0.9 at round 1; rounds 2-5 do not beat it -> decay before round 6; new best at 6, then 4 more stalls
    assert sigmas == [2.0] * 6 + [1.0] * 5
    assert p.configure_round(11, [0]).tasks[0].sigma == 0.5


def test_adap_dpfl_ledger_composes_each_rounds_sigma():
    p = policy("adap_dpfl", "dp.sigma=2.0", "dp.q=0.1", "dp.tau=2", "adap_dpfl.decay=0.5", "adap_dpfl.patience=1")
    play(p, 0, 1.0)
    play(p, 1, 1.0)  # no improvement: sigma halves for round 2
    play(p, 2, 0.5)
    assert p.accountant.ledgers[0].history() == [(0.1, 2.0, 4), (0.1, 1.0, 2)]


# --- Fu et al. --------------------------------------------------------------------------


def test_fu_E_formula():
    assert local_iterations(100, "gaussian") == 10  # z = 1: T^(1/2)
    assert local_iterations(64, "laplace") == 16  # z = 2: T^(2/3)
    assert local_iterations(1000, "laplace") == 100
    assert local_iterations(30, "gaussian") == 5  # 5.48 rounds to 5
    assert local_iterations(1, "laplace") == 1
    assert local_iterations(6, "gaussian") == 2  # 2.449
    assert local_iterations(42, "gaussian") == 6  # 6.48: half up, not to even


FU = ["clients.per_round=2", "dp.lr=0.1", "dp.clip=1.0", "dp.epsilon=10", "dp.delta=1e-4"]


def test_fu_gaussian_noise_is_theorem_2_for_T_l_rounds():
    p = policy("fu_tuning", *FU, "fu_tuning.iterations=100", rounds_budget=30)
    assert (p.E, p.T_g, p.T_l) == (10, 10, 5)  # T_g = 100 / 10, T_l = 2 * 10 / 4
    Xi = 0.1 * 10 * 1.0
    assert p.scale == pytest.approx(Xi * math.sqrt(2 * math.log(1.25 / 1e-4)) * math.sqrt(5) / 10)
    plan = p.configure_round(0, [0, 1, 2, 3])
    t = plan.tasks[0]
    assert (t.steps, t.sigma, t.clip, t.q, t.output_noise) == (10, 0.0, 1.0, 1.0, "gaussian")
    assert [t.client for t in plan.tasks] == [0, 1]
    assert [t.client for t in p.configure_round(1, [0, 1, 2, 3]).tasks] == [2, 3]  # round robin


def test_fu_laplace_spends_eps_over_T_l_uploads_then_refuses():
    p = policy("fu_tuning", *FU, "fu_tuning.mechanism=laplace", "fu_tuning.local_iters=3", rounds_budget=6)
    assert (p.E, p.T_g, p.T_l) == (3, 6, 3)
    Xi = 0.1 * 3 * 1.0
    assert p.scale == pytest.approx(3 * Xi / 10)  # Lap(0, T_l Xi_1 / eps)
    assert p.clip == pytest.approx(1.0 / math.sqrt(D))  # L1 bound via per-sample L2 clip
    for rnd in range(6):
        play(p, rnd, 1.0)
    assert [p.accountant.epsilon(i) for i in range(4)] == pytest.approx([10.0] * 4, rel=1e-12)
    task = p.configure_round(6, [0]).tasks[0]
    assert not p.accountant.eligible(0) and not p.accountant.allows(task)
    assert "T_g" in p.should_stop()


# --- Talaei & Izadi ---------------------------------------------------------------------

PAD = ["dp.epsilon=20", "dp.delta=0.01", "padpfl.bound=3", "padpfl.prox_mu=0.1", "dp.tau=2"]
C = math.sqrt(2 * math.log(1.25 / 0.01))


def test_padpfl_client_noise_is_eq8():
    p = policy("padpfl", *PAD, "clients.per_round=2", "clients.select=uniform", rounds_budget=10)
    assert p.R == 5  # ceil(10 * 2 / 4)
    t = p.configure_round(0, [0, 1, 2, 3]).tasks[0]
    assert t.output_noise_scale == pytest.approx(2 * 3 * 5 * C / (100 * 20))  # 2 B R c / (min m eps)
    assert (t.weight_clip, t.prox_mu, t.output_noise, t.sigma, t.clip) == (3.0, 0.1, "gaussian", 0.0, 0.0)


def test_padpfl_server_noise_is_eq13_with_the_rounds_factors():
    p = policy("padpfl", *PAD, "padpfl.revelations=2", rounds_budget=10)
    p.configure_round(4, [0, 1, 2])
    factors = {0: 0.7, 1: 0.2, 2: 0.1}
    out, recorded = p.aggregate(4, weights(0.0), [result(0, 1.0), result(1, 2.0), result(2, 3.0)], factors)
    # T = 10 > R sqrt(sum p^2) / max p = 2 * 0.7348 / 0.7: sigma_S = 2 B c sqrt(T^2 max p^2 - R^2 sum p^2) / (min m eps)
    sigma_S = 2 * 3 * C * math.sqrt(100 * 0.49 - 4 * 0.54) / (100 * 20)
    assert recorded["sigma_S"] == pytest.approx(sigma_S)
    mean = 0.7 * 1.0 + 0.2 * 2.0 + 0.1 * 3.0
    rng = stream(p.ctx.settings.seed, "server_noise", 4)
    want = {
        k: (np.full(v.shape, mean) + rng.normal(0.0, sigma_S, v.shape)).astype(np.float32)
        for k, v in weights(0.0).items()
    }
    for k in want:
        np.testing.assert_allclose(out[k], want[k], rtol=1e-6)


def test_padpfl_no_server_noise_below_the_threshold():
    p = policy("padpfl", *PAD, "padpfl.revelations=10", rounds_budget=10)  # R = T: clients' noise suffices
    p.configure_round(0, [0, 1])
    out, recorded = p.aggregate(0, weights(0.0), [result(0, 1.0), result(1, 3.0)], {0: 0.5, 1: 0.5})
    assert recorded["sigma_S"] == 0.0
    np.testing.assert_allclose(out["w"], 2.0)


def test_padpfl_epsilon_reaches_target_after_R_uploads():
    p = policy("padpfl", *PAD, "padpfl.revelations=3", rounds_budget=10)
    for rnd in range(3):
        play(p, rnd, 1.0)
    assert p.accountant.epsilon(2) == pytest.approx(20.0, rel=1e-12)
    assert not p.accountant.eligible(2)


# --- Wei et al. -------------------------------------------------------------------------

WEI = ["dp.lr=0.5", "dp.clip=1.0", "dp.epsilon=4", "dp.delta=1e-5", "clients.per_round=2"]


def eq10(n, T, q=0.5, eps=4.0):
    return 2 * 0.5 * 1.0 / n * math.sqrt(2 * q * T * math.log(1e5)) / eps


def test_udp_sigma_is_eq10_and_eq25_keeps_it_while_T_is_unchanged():
    p = policy("udp_crd", *WEI, "udp_crd.crd=false", "udp_crd.horizon=6")
    for rnd in range(6):
        plan = play(p, rnd, 1.0)  # no improvement, but CRD is off
        assert plan.state["T"] == 6.0
        for t in plan.tasks:
            assert t.output_noise_scale == pytest.approx(eq10(SIZES[t.client], 6), rel=1e-12)
    assert len({t.client for t in plan.tasks}) == 2  # K of N
    assert [p.accountant.epsilon(i) for i in range(4)] == pytest.approx([4.0] * 4, rel=1e-9)
    assert "horizon" in p.should_stop()


def test_crd_horizon_formula():
    assert discounted_horizon(30, 3, 0.9) == 27  # floor(0.9 * 27) + 3
    assert discounted_horizon(10, 1, 0.5) == 5  # floor(4.5) + 1
    assert discounted_horizon(6, 5, 0.9) == 5  # the last round: T = t, training ends


def test_crd_discounts_T_and_eq25_still_spends_exactly_eps():
    p = policy("udp_crd", *WEI, "udp_crd.horizon=10", "udp_crd.beta=0.5", "udp_crd.zeta=0.5")
    horizons, sigmas = [], []
    for rnd, loss in enumerate([2.0, 1.0, 0.4, 0.35, -1.0]):  # improvements 1.0, 0.6, 0.05 (< zeta), 1.35
        plan = play(p, rnd, loss)
        horizons.append(plan.state["T"])
        sigmas.append(plan.state["sigma_unit"] * 2 * 0.5 * 1.0 / SIZES[0])  # client 0's: Delta_0 s^t
    assert horizons == [10, 10, 10, 10, 6]  # after t = 3: floor(0.5 * 7) + 3 = 6
    assert sigmas[3] == pytest.approx(sigmas[0], rel=1e-12) and sigmas[4] < sigmas[3]
    # eq. 25 by hand for round 4 (T = 6): sqrt((T - t) / (eps^2 / (2 q D^2 ln(1/delta)) - sum 1/sigma^2))
    d0 = 2 * 0.5 * 1.0 / 100
    left = 16 / (2 * 0.5 * d0**2 * math.log(1e5)) - 4 / sigmas[0] ** 2
    assert sigmas[4] == pytest.approx(math.sqrt((6 - 4) / left), rel=1e-12)
    play(p, 5, -2.0)
    assert p.t == 6 and "horizon" in p.should_stop()
    assert [p.accountant.epsilon(i) for i in range(4)] == pytest.approx([4.0] * 4, rel=1e-9)


def test_one_unit_std_gives_every_clients_own_eq10_and_eq25_std_and_eps():
    """The std of a unit sensitivity, scaled by each client's Delta_l, is what eq. 10 and eq. 25 give each
    client from its own history of stds (every client charged every round); so is each one's eq. 29 eps."""
    sizes = [37, 100, 256, 999]
    p = policy("udp_crd", *WEI, "udp_crd.horizon=10", "udp_crd.beta=0.5", "udp_crd.zeta=0.5", sizes=sizes)
    own: list[list[float]] = [[] for _ in sizes]
    delta_l = [2 * 0.5 * 1.0 / n for n in sizes]
    for rnd, loss in enumerate([2.0, 1.0, 0.4, 0.35, -1.0, -1.01]):
        plan = play(p, rnd, loss)
        T = int(plan.state["T"])
        expected = [wei_crd_sigma(4.0, 1e-5, T, own[i], delta_l[i], 0.5) for i in range(len(sizes))]
        for t in plan.tasks:
            assert t.output_noise_scale == pytest.approx(expected[t.client], rel=1e-12)
        for i, sigma in enumerate(expected):
            own[i].append(sigma)
        for i in range(len(sizes)):
            assert p.accountant.epsilon(i) == pytest.approx(wei_epsilon(own[i], 1e-5, delta_l[i], 0.5), rel=1e-12)
    assert len(set(map(len, own))) == 1 and p.accountant.max_epsilon(len(sizes)) == pytest.approx(4.0, rel=1e-9)


# --- accountants ------------------------------------------------------------------------


def test_rdp_accountant_blocks_the_task_that_would_exceed_eps():
    cfg = load(None, ["dp.q=0.1", "dp.sigma=1.5", "dp.epsilon=3"])
    acc = RdpAccountant(cfg.dp, 2)
    acc.charge([ClientTask(client=0, steps=50, lr=0.1, sigma=1.5, clip=1.0, q=0.1)])
    assert acc.eligible(0) and acc.allows(ClientTask(client=0, steps=6, lr=0.1, sigma=1.5, clip=1.0, q=0.1))
    assert not acc.allows(ClientTask(client=0, steps=7, lr=0.1, sigma=1.5, clip=1.0, q=0.1))  # R_c = 56
    assert acc.epsilon(1) == 0.0
    assert list(acc.client_rows()) == [  # client 1, never charged, has no row
        {
            "client": 0,
            "epsilon": acc.epsilon(0),
            "epsilon_unamplified": None,
            "ledger": json.dumps({"entries": [{"q": 0.1, "sigma": 1.5, "steps": 50}]}),
        }
    ]


def test_a_ledger_of_another_mechanism_is_refused_and_an_untagged_one_loads():
    p = policy("padpfl")
    state = p.state_dict()
    assert state["accountant"]["mechanism"] == "talaei_gaussian"
    with pytest.raises(MechanismMismatch, match="'rdp'"):
        p.load_state_dict({**state, "accountant": {**state["accountant"], "mechanism": "rdp"}})
    del state["accountant"]["mechanism"]  # a checkpoint written before the tag
    p.load_state_dict(state)


def test_dp_sgd_ledgers_are_tagged_with_dp_accountant_and_read_by_any_of_the_three():
    """The (q, sigma, steps) history is the mechanism's, not a theorem's: a checkpoint written under one
    accountant is read whole by another (its epsilons are then the new accountant's); an output-noise
    ledger is still refused."""
    pytest.importorskip("dp_accounting", reason="dp.accountant=pld: pip install 'dpfl-emulator[pld]'")
    task = ClientTask(client=0, steps=50, lr=0.1, sigma=1.5, clip=1.0, q=0.1)
    states = {}
    for name in ("rdp", "prv", "pld"):
        p = policy("fedavg_dp", f"dp.accountant={name}", "dp.q=0.1", "dp.sigma=1.5")
        assert p.accountant.mechanism == name
        p.accountant.charge([task])
        states[name] = p.state_dict()
        assert states[name]["accountant"]["ledgers"] == states["rdp"]["accountant"]["ledgers"]
    eps = {}
    for reader in ("rdp", "prv", "pld"):
        p = policy("fedavg_dp", f"dp.accountant={reader}", "dp.q=0.1", "dp.sigma=1.5")
        for written in states.values():
            p.load_state_dict(written)
            assert p.accountant.epsilon(0) == _fifty_steps_epsilon(reader)
        eps[reader] = p.accountant.epsilon(0)
    assert eps["pld"] < eps["rdp"] and eps["prv"] < eps["rdp"]
    with pytest.raises(MechanismMismatch, match="'talaei_gaussian'"):
        p.load_state_dict(
            {**states["rdp"], "accountant": {**states["rdp"]["accountant"], "mechanism": "talaei_gaussian"}}
        )


def _fifty_steps_epsilon(accountant):
    from emulator.privacy import epsilon

    return epsilon([(0.1, 1.5, 50)], 1e-5, accountant=accountant)


def test_prv_accountant_admits_steps_past_rdps_budget_and_not_past_its_own():
    """eligible asks RDP first (cheap, and above PRV): past RDP's R_c = 56 it asks PRV itself."""
    cfg = load(None, ["dp.accountant=prv", "dp.q=0.1", "dp.sigma=1.5", "dp.epsilon=3"])
    R_c = max_steps(0.1, 1.5, 1e-5, 3.0, accountant="prv")
    assert R_c > 56
    acc = RdpAccountant(cfg.dp, 2)
    acc.charge([ClientTask(client=0, steps=R_c - 1, lr=0.1, sigma=1.5, clip=1.0, q=0.1)])
    acc.charge([ClientTask(client=1, steps=R_c, lr=0.1, sigma=1.5, clip=1.0, q=0.1)])
    assert acc.eligible(0) and not acc.eligible(1)
    assert acc.epsilon(1) <= 3.0 < acc.epsilon_after(ClientTask(client=1, steps=1, lr=0.1, sigma=1.5, clip=1.0, q=0.1))


def test_ali_dpfl_R_c_is_the_scenario_accountants():
    pytest.importorskip("dp_accounting", reason="dp.accountant=pld: pip install 'dpfl-emulator[pld]'")
    for name in ("prv", "pld"):
        p = policy("ali_dpfl", *ALI, f"dp.accountant={name}")
        assert p.R_c == max_steps(0.1, 1.5, 1e-5, 3.0, accountant=name) > 56  # 56: RDP's


def test_release_accountant_with_unlimited_budget_never_blocks():
    acc = ReleaseAccountant(math.inf, 1, lambda c, s: math.inf if s else 0.0, "test")
    t = ClientTask(client=0, steps=1, lr=0.1, sigma=0.0, clip=0.0, q=1.0)
    acc.charge([t])
    assert acc.eligible(0) and acc.allows(t)


# --- trainer mechanisms -----------------------------------------------------------------


@pytest.fixture(scope="module")
def trainer():
    from nodes.data import load_federated
    from nodes.training.trainer import build_trainer, state_to_numpy

    torch.set_num_threads(1)
    cfg = load(None, ["clients.n=3"])
    tr = build_trainer(cfg, load_federated(cfg.data, 3, cfg.seed), torch.device("cpu"))
    w0 = {k: v.copy() for k, v in state_to_numpy(tr.model).items()}

    class Copying:  # the trainer's arrays alias the model's memory until the worker packs them
        def train(self, rnd, t, w):
            new, metrics = tr.train(rnd, t, w)
            return {k: v.copy() for k, v in new.items()}, metrics

    return Copying(), w0


def task(**kw):
    base = dict(client=1, steps=3, lr=0.5, sigma=0.0, clip=0.0, q=1.0)
    return ClientTask(**{**base, **kw})


def flat(w):
    return np.concatenate([v.ravel().astype(np.float64) for v in w.values()])


def test_weight_clip_bounds_the_uploaded_model(trainer):
    tr, w0 = trainer
    new, _ = tr.train(0, task(weight_clip=0.5), w0)
    assert np.linalg.norm(flat(new)) == pytest.approx(0.5, rel=1e-5)


def test_output_noise_is_seeded_per_round_and_client(trainer):
    tr, w0 = trainer
    plain, _ = tr.train(0, task(), w0)
    a, _ = tr.train(0, task(output_noise="gaussian", output_noise_scale=0.1), w0)
    b, _ = tr.train(0, task(output_noise="gaussian", output_noise_scale=0.1), w0)
    c, _ = tr.train(1, task(output_noise="gaussian", output_noise_scale=0.1), w0)
    noise = flat(a) - flat(plain)
    assert np.array_equal(flat(a), flat(b)) and not np.array_equal(flat(a), flat(c))
    assert noise.std() == pytest.approx(0.1, rel=0.15)
    lap, _ = tr.train(0, task(output_noise="laplace", output_noise_scale=0.1), w0)
    assert np.abs(flat(lap) - flat(plain)).mean() == pytest.approx(0.1, rel=0.15)  # E|Lap(0, b)| = b


def test_unknown_output_noise_is_an_error(trainer):
    tr, w0 = trainer
    with pytest.raises(ValueError, match="output_noise"):
        tr.train(0, task(output_noise="cauchy", output_noise_scale=1.0), w0)


def test_prox_term_pulls_towards_the_global_model(trainer):
    tr, w0 = trainer
    _free, m_free = tr.train(0, task(steps=10), w0)
    _prox, m_prox = tr.train(0, task(steps=10, prox_mu=1.0), w0)
    assert 0 < m_prox["update_norm"] < m_free["update_norm"]


def test_grad_diff_report(trainer):
    tr, w0 = trainer
    _, m = tr.train(0, task(report_grad_diff=True), w0)
    assert m["param_change"] == pytest.approx(m["update_norm"], rel=1e-5) and m["grad_change"] > 0
    _, m = tr.train(0, task(), w0)
    assert "grad_change" not in m

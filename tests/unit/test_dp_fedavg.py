"""dp_fedavg (McMahan et al. Alg. 1, Andrew et al. Alg. 1) without workers: its population ledger
against the accounting libraries, its sampling, clipping, noise and clip update, its participation
honesty, and the optional task field that leaves every other task's message as it was.

Expected values come from the libraries called directly or from the papers' formulas by hand."""

import json
import math

import numpy as np
import pytest
import torch

from emulator.aggregate.compression import task_frame
from emulator.config import ConfigError, load, round_settings
from emulator.output.summary import privacy_label, summarise_run
from emulator.policies import ClientResult, ClientTask, RunContext
from emulator.policies.accounting import MechanismMismatch
from emulator.policies.dp_fedavg import (
    fixed_sample,
    next_clip,
    noised_unclipped_share,
    poisson_sample,
    server_noise,
    update_noise_multiplier,
)
from emulator.policies.population import (
    Z_REL_TOL,
    PopulationAccountant,
    participation_caveat,
    without_replacement_epsilon,
)
from emulator.privacy import epsilon
from emulator.privacy.rdp import DEFAULT_ORDERS
from emulator.rounds.budgets import Budgets
from emulator.rounds.round import play_round
from emulator.timemodel.clock import Clock
from emulator.timemodel.resources import build_resources
from tests.policies import scenario_policy
from tests.unit.test_privacy import PINNED_TOLERANCE as PRIVACY_PINNED_TOLERANCE

dp_accounting = pytest.importorskip("dp_accounting", reason="the [pld] extra: pip install 'dpfl-emulator[pld]'")

DELTA = 1e-5
# the shipped scenario's q = 0.1 and z = 1, as 10 of 100 clients a round, for 30 rounds
Q, Z, ROUNDS, N, K = 0.1, 1.0, 30, 100, 10
# (eps, delta = 1e-5) of those 30 rounds, each the library's own number (the test below computes them)
PINNED = {"rdp": 4.848039837634082, "prv": 4.18855485888563, "pld": 4.178223609042274, "fixed": 32.26971690201039}
# The pinned figures' tolerances for another CPU (tests/unit/test_privacy.py); dp_accounting's RDP
# without replacement is a log-sum-exp over the orders as Opacus's is.
PINNED_TOLERANCE = {**PRIVACY_PINNED_TOLERANCE, "fixed": PRIVACY_PINNED_TOLERANCE["rdp"]}


def policy(*overrides, sizes=(100,) * 4):
    cfg = load(None, ["policy=dp_fedavg", f"clients.n={len(sizes)}", f"dp_fedavg.noise_multiplier={Z}", *overrides])
    return scenario_policy(
        cfg, RunContext(n_clients=len(sizes), data_sizes=list(sizes), num_params=6, rounds_budget=10)
    )


def weights(value, shape=(2, 3)):
    return {"w": np.full(shape, value, dtype=np.float32), "b": np.full(3, value, dtype=np.float32)}


def result(client, w):
    return ClientResult(client=client, weights=w, steps=1, train_loss=0.0, update_norm=0.0)


def flat(w):
    return np.concatenate([v.ravel().astype(np.float64) for v in w.values()])


# --- the population ledger against the libraries --------------------------------------------


def _library_epsilon(accountant, q, z, rounds, delta=DELTA):
    """The reference library's own epsilon for `rounds` Poisson-sampled Gaussian releases."""
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds
    )
    if accountant == "rdp":
        acc = dp_accounting.rdp.RdpAccountant(orders=DEFAULT_ORDERS)
    elif accountant == "pld":
        acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    else:  # PRV: Opacus's, dp_accounting has none
        from opacus.accountants import PRVAccountant

        prv = PRVAccountant()
        prv.history = [(z, q, rounds)]
        return float(prv.get_epsilon(delta, eps_error=0.01))
    acc.compose(event)
    return acc.get_epsilon(delta)


def _own_library_epsilon(accountant, q, z, rounds, delta=DELTA):
    """The accountant's own library: Opacus's RDPAccountant for rdp (dp_accounting's leaves out the
    fractional orders at which its series does not converge, q = 0.5 among them), else as above."""
    if accountant != "rdp":
        return _library_epsilon(accountant, q, z, rounds, delta)
    from opacus.accountants import RDPAccountant

    opacus = RDPAccountant()
    opacus.history = [(z, q, rounds)]
    return opacus.get_epsilon(delta)


@pytest.mark.parametrize("accountant", ["rdp", "prv", "pld"])
def test_the_poisson_ledger_is_the_librarys_epsilon(accountant):
    p = policy(f"clients.n={N}", f"clients.per_round={K}", f"dp.accountant={accountant}", sizes=(100,) * N)
    acc = p.accountant
    for _ in range(ROUNDS):
        acc.charge([])
    ours = acc.epsilon(0)
    assert ours == pytest.approx(_library_epsilon(accountant, Q, Z, ROUNDS), rel=1e-6, abs=0)
    if accountant == "rdp":  # the rdp accountant is Opacus's analysis: its RDPAccountant too
        from opacus.accountants import RDPAccountant

        opacus = RDPAccountant()
        opacus.history = [(Z, Q, ROUNDS)]
        assert ours == pytest.approx(opacus.get_epsilon(DELTA), rel=1e-6, abs=0)
    assert ours == pytest.approx(PINNED[accountant], **PINNED_TOLERANCE[accountant])
    assert ours <= epsilon([(Q, Z, ROUNDS)], DELTA)  # PRV and PLD: at most RDP's
    assert all(acc.epsilon(i) == ours for i in range(N))  # every client's is the population's


# A cross-device setting (N = 10^6 clients, m = 1,000 a round, z = 1, 2,000 rounds, delta = 1e-6): each
# accountant's epsilon as its own library gives it (the test below asks them), pinned.
CROSS_DEVICE = {"rdp": 0.8819115723301332, "prv": 0.26222839766395095, "pld": 0.2522818192222209}


@pytest.mark.parametrize("accountant", sorted(CROSS_DEVICE))
def test_a_cross_device_population_is_the_librarys_epsilon(accountant):
    dp = load(None, [f"dp.accountant={accountant}", "dp.delta=1e-6"]).dp
    ours = PopulationAccountant(dp, 10**6, "poisson", 1e-3, 1000, 1.0).population_epsilon(2000)
    assert ours == pytest.approx(_own_library_epsilon(accountant, 1e-3, 1.0, 2000, 1e-6), rel=1e-6, abs=0)
    assert ours == pytest.approx(CROSS_DEVICE[accountant], **PINNED_TOLERANCE[accountant])
    assert ours <= CROSS_DEVICE["rdp"] * (1 + 1e-12)  # rdp's own: its pinned value, within another CPU's ulps


def test_the_fixed_size_ledger_is_dp_accountings_rdp_without_replacement():
    p = policy(f"clients.n={N}", f"clients.per_round={K}", "dp_fedavg.sampling=fixed", sizes=(100,) * N)
    for _ in range(ROUNDS):
        p.accountant.charge([])
    # replace-one neighbours: one client's update swapped moves the clipped sum by 2S, so z / 2
    ref = dp_accounting.rdp.RdpAccountant(
        orders=DEFAULT_ORDERS, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    ref.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(N, K, dp_accounting.GaussianDpEvent(Z / 2)), ROUNDS
        )
    )
    assert p.accountant.epsilon(0) == pytest.approx(ref.get_epsilon(DELTA), rel=1e-6, abs=0)
    assert p.accountant.epsilon(0) == pytest.approx(PINNED["fixed"], **PINNED_TOLERANCE["fixed"])
    assert without_replacement_epsilon(N, K, 0.0, 3, DELTA) == math.inf
    assert without_replacement_epsilon(N, K, Z, 0, DELTA) == 0.0


def test_the_unamplified_epsilon_composes_only_the_rounds_a_client_trained_in():
    p = policy("clients.per_round=2")
    acc = p.accountant
    task = ClientTask.dp_sgd(0, p.ctx.settings.dp)
    acc.charge([task])
    acc.charge([task, ClientTask.dp_sgd(2, p.ctx.settings.dp)])
    acc.charge([])  # a released round nobody trained in (an empty draw)
    assert acc.ledger.steps() == 3 and acc.trained == {0: 2, 2: 1}  # the clients that trained only
    assert acc.unamplified(0) == epsilon([(1.0, Z, 2)], DELTA)  # q = 1, its two rounds only
    assert acc.unamplified(2) == epsilon([(1.0, Z, 1)], DELTA)
    assert acc.unamplified(1) == 0.0 and acc.unamplified_max() == acc.unamplified(0)
    assert acc.epsilon(1) == epsilon([(0.5, Z, 3)], DELTA)  # amplified: every round, q = 2/4
    rows = list(acc.client_rows())  # the clients that trained, 0 and 2
    assert [r["client"] for r in rows] == [0, 2]
    assert rows[0] == {
        "client": 0,
        "epsilon": acc.epsilon(0),
        "epsilon_unamplified": acc.unamplified(0),
        "ledger": json.dumps({"rounds_trained": 2}),
    }
    population = acc.run_privacy()["population"]
    assert population["amplification_valid"] and population["noise_complete"]


def test_amplification_is_marked_invalid_when_availability_decides_who_can_be_selected(tmp_path):
    p = policy("availability.model=diurnal")
    population = p.accountant.run_privacy()["population"]
    assert not population["amplification_valid"]
    assert population["amplification_invalid_reason"].startswith("availability.model=diurnal: who could be selected")
    assert not policy().accountant.run_privacy()["population"]["amplification_invalid_reason"]
    manifest = {"privacy_mechanism": p.accountant.mechanism, "privacy": p.accountant.run_privacy()}
    assert privacy_label(manifest) == "client-level, dp_fedavg_poisson, rdp, amplification does not hold"


def test_the_ledger_and_its_verdicts_survive_a_checkpoint():
    p = policy("availability.model=diurnal", "dp_fedavg.noise=local")
    p.accountant.charge([ClientTask.dp_sgd(1, p.ctx.settings.dp)])
    p.accountant.short_rounds.append(0)
    p.clip = 0.3
    state = json.loads(json.dumps(p.state_dict()))
    q = policy()
    q.load_state_dict(state)
    assert (q.clip, q.accountant.trained, q.accountant.short_rounds) == (0.3, {1: 1}, [0])
    assert q.accountant.amplification_invalid == p.accountant.amplification_invalid
    assert q.accountant.epsilon(0) == p.accountant.epsilon(0) and not q.accountant.valid()
    with pytest.raises(MechanismMismatch, match="dp_fedavg_poisson"):
        policy("dp_fedavg.sampling=fixed").load_state_dict(state)


@pytest.mark.parametrize("accountant", ["rdp", "prv", "pld"])
def test_a_calibrated_z_spends_the_budget_in_the_runs_rounds(accountant):
    """noise_multiplier = 0: the smallest z (within Z_REL_TOL) whose R_s = 10 rounds (the RunContext's)
    stay within dp.epsilon under the run's accountant; no noise for an unlimited budget."""
    p = policy("dp_fedavg.noise_multiplier=0", "dp.epsilon=5", "clients.per_round=2", f"dp.accountant={accountant}")
    acc, z = p.accountant, p.accountant.z
    assert z > 0 and p.z == z and p.configure_round(0, [0, 1, 2, 3]).state["z"] == z
    library = _own_library_epsilon(accountant, 0.5, z, 10)
    assert acc.population_epsilon(10) == pytest.approx(library, rel=1e-6) and library <= 5.0
    assert _own_library_epsilon(accountant, 0.5, z * (1 - Z_REL_TOL), 10) > 5.0  # a smaller z would overspend
    assert policy("dp_fedavg.noise_multiplier=0").accountant.z == 0.0  # dp.epsilon = inf
    assert policy("dp_fedavg.noise_multiplier=2", "dp.epsilon=50").accountant.z == 2.0  # as set


@pytest.mark.parametrize(
    "path, overrides, reason",
    [
        (None, [], ""),
        ("dropout.yaml", [], ""),  # a deadline, but each client's time its own: late or lost independently
        ("bandwidth.yaml", [], ""),  # a shared server link, but no deadline: every drawn update arrives
        ("cellular.yaml", [], "availability.model=diurnal: who could be selected"),
        ("cellular.yaml", ["availability.model=always"], "round.deadline_s with a shared server link"),
        ("bandwidth.yaml", ["budget.time_s=100"], "budget.time_s with a shared server link"),
        (
            "cellular.yaml",
            ["availability.model=always", "links.server_up_bps=0"],
            "round.deadline_s with links.trace, compute.trace: whether an update beat the deadline depended on "
            "the virtual time",
        ),
        ("cellular.yaml", ["availability.model=always", "links.server_up_bps=0", "round.deadline_s=inf"], ""),
        (
            None,
            ["compute.schedule=[{t: 10, factor: 2}]", "round.deadline_s=3"],
            "round.deadline_s with compute.schedule",
        ),
        (None, ["links.dropout.outages=[{start: 0, end: 10}]"], "links.dropout.outages: whether an update was lost"),
        (
            None,
            ["links.dropout.model=tests.plugins.link_loss:EveryKthClient"],
            "links.dropout.model=tests.plugins.link_loss:EveryKthClient: a user's loss model sees",
        ),
    ],
)
def test_what_decides_participation_besides_the_draw_invalidates_amplification(path, overrides, reason):
    cfg = load(path, ["policy=dp_fedavg", *overrides])
    caveat = participation_caveat(cfg.availability, cfg.links, cfg.compute, cfg.round, cfg.budget)
    assert caveat.startswith(reason) and bool(caveat) == bool(reason)
    ctx = RunContext(n_clients=cfg.clients.n, data_sizes=[100] * cfg.clients.n, num_params=6, rounds_budget=2)
    population = scenario_policy(cfg, ctx).accountant.summary()
    assert population["amplification_invalid_reason"] == caveat and population["amplification_valid"] == (not caveat)


def test_the_budget_stops_everyone_at_once():
    p = policy("dp.epsilon=6.0", "clients.per_round=2")
    acc = p.accountant
    while acc.eligible(0):
        assert all(acc.eligible(i) for i in range(4))
        acc.charge([])
    assert not any(acc.eligible(i) for i in range(4))
    assert acc.ledger.steps() >= 2 and acc.epsilon(0) <= 6.0 < acc.population_epsilon(acc.ledger.steps() + 1)
    assert p.configure_round(9, []).tasks == ()  # nothing to release: the runtime stops the run


# --- sampling -------------------------------------------------------------------------------


def test_poisson_counts_are_binomial():
    """The selected count of 4,000 rounds against Binomial(N, q) by a chi-square test at a false-failure
    rate of 1e-4 (bins with expected counts >= 5 after pooling the tails), and its mean and variance."""
    from scipy import stats

    n, q, rounds = 100, 0.1, 4000
    counts = np.array([len(poisson_sample(7, r, n, q, range(n))) for r in range(rounds)])
    lo, hi = int(stats.binom.ppf(0.005, n, q)), int(stats.binom.ppf(0.995, n, q))
    observed = [np.sum(counts <= lo), *(np.sum(counts == k) for k in range(lo + 1, hi)), np.sum(counts >= hi)]
    p = [
        stats.binom.cdf(lo, n, q),
        *(stats.binom.pmf(k, n, q) for k in range(lo + 1, hi)),
        stats.binom.sf(hi - 1, n, q),
    ]
    expected = rounds * np.array(p)
    assert expected.min() >= 5 and sum(p) == pytest.approx(1.0)
    assert stats.chisquare(observed, expected).pvalue > 1e-4
    assert counts.mean() == pytest.approx(n * q, abs=4 * math.sqrt(n * q * (1 - q) / rounds))


def test_every_id_is_sampled_with_probability_q_the_first_and_last_included():
    """Geometric gaps that started one id off would never sample id 0 or would sample n; each id's share of
    20,000 rounds is within 5 standard deviations of q (a fixed seed: the test gives one answer)."""
    n, q, rounds = 40, 0.25, 20_000
    hits = np.zeros(n + 1)
    for r in range(rounds):
        hits[poisson_sample(9, r, n, q, range(n + 1))] += 1  # n itself a candidate: it must never be drawn
    assert hits[n] == 0
    assert np.abs(hits[:n] / rounds - q).max() < 5 * math.sqrt(q * (1 - q) / rounds)
    assert poisson_sample(9, 0, n, 1.0, range(n)) == list(range(n))


def test_a_round_samples_a_billion_ids_without_an_array_of_them():
    import tracemalloc

    tracemalloc.start()
    chosen = poisson_sample(1, 0, 10**9, 1e-6, range(10**9))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert 900 < len(chosen) < 1100 and chosen == sorted(set(chosen)) and chosen[-1] < 10**9
    assert peak < 2**20  # the ids sampled, not a uniform per id (8 GB)


def test_each_round_draws_from_its_own_stream():
    n = 50
    a = poisson_sample(3, 5, n, 0.3, range(n))
    assert a == poisson_sample(3, 5, n, 0.3, range(n))  # per (run, round): the same draw every time
    assert a != poisson_sample(3, 6, n, 0.3, range(n)) and a != poisson_sample(4, 5, n, 0.3, range(n))
    half = range(0, n, 2)  # a client's draw does not depend on who else was a candidate
    assert poisson_sample(3, 5, n, 0.3, half) == [i for i in a if i % 2 == 0]
    fixed = fixed_sample(3, 5, 10, list(range(n)))
    assert len(fixed) == len(set(fixed)) == 10 and fixed == fixed_sample(3, 5, 10, list(range(n)))
    assert fixed != fixed_sample(3, 6, 10, list(range(n)))


def test_the_plan_is_plain_sgd_for_the_drawn_clients():
    p = policy("clients.per_round=2", "dp.tau=4", "dp.lr=0.3")
    plan = p.configure_round(2, [0, 1, 2, 3])
    drawn = poisson_sample(p.ctx.settings.seed, 2, 4, 0.5, range(4))
    assert [t.client for t in plan.tasks] == drawn
    assert all((t.steps, t.lr, t.sigma, t.clip, t.q) == (4, 0.3, 0.0, 0.0, p.ctx.settings.dp.q) for t in plan.tasks)
    assert all(t.output_noise == "none" and t.update_clip == 0 for t in plan.tasks)  # central: nothing on the client
    assert plan.state["m"] == 2 and plan.state["q"] == 0.5 and plan.empty_round is (not drawn)


# --- clipping, noise, the clip's update --------------------------------------------------------


def test_the_server_clips_each_update_and_divides_by_the_expected_count():
    p = policy("clients.per_round=2", "dp_fedavg.noise_multiplier=0", "dp_fedavg.clip=1.0")
    p.configure_round(0, [0, 1, 2, 3])
    w0 = weights(0.0)
    big, small = weights(1.0), weights(0.1)  # norms 3.0 and 0.3
    new, state = p.aggregate(0, w0, [result(0, big), result(1, small)], {0: 0.5, 1: 0.5})
    expected = (flat(big) / 3.0 + flat(small)) / 2  # the first scaled to norm S = 1, the second as it is; / m = 2
    assert flat(new) == pytest.approx(expected, rel=1e-6)
    assert state["noise_std"] == 0.0 and state["norm_quantile"] == pytest.approx(np.quantile([3.0, 0.3], 0.5))


def test_central_noise_has_std_z_delta_S_over_m():
    """The same aggregate with and without noise differ by the round's server noise / m, whose std is
    z S / m (here on 200,000 coordinates: within 1 %)."""
    overrides = ["clients.per_round=4", "dp_fedavg.clip=0.5", "dp_fedavg.noise_multiplier=1.5"]
    noisy, clean = policy(*overrides), policy(*overrides[:2], "dp_fedavg.noise_multiplier=0")
    w0 = {"w": np.zeros((400, 500), np.float32)}
    results = [result(c, {"w": np.full((400, 500), 1e-4 * (c + 1), np.float32)}) for c in range(3)]
    for p in (noisy, clean):
        p.configure_round(4, [0, 1, 2, 3])
    a, state = noisy.aggregate(4, w0, results, {})
    b, _ = clean.aggregate(4, w0, results, {})
    diff = a["w"].astype(np.float64) - b["w"]
    assert diff.std() == pytest.approx(1.5 * 0.5 / 4, rel=0.01) and state["noise_std"] == 1.5 * 0.5 / 4
    drawn = server_noise(noisy.ctx.settings.seed, 4, 1.5 * 0.5, w0)["w"] / 4
    assert diff == pytest.approx(drawn, abs=1e-6)  # the round's own stream, float32 rounding apart


def test_andrew_et_al_update_rule_by_hand():
    # Thm 1: z = 1, sigma_b = 1: z_Delta = (1 - 1/4)^(-1/2) = 2 / sqrt(3)
    assert update_noise_multiplier(1.0, 1.0) == pytest.approx(2 / math.sqrt(3), rel=1e-12)
    assert update_noise_multiplier(0.0, 0.0) == 0.0
    with pytest.raises(ValueError, match="z/2"):
        update_noise_multiplier(2.0, 1.0)
    # 3 of 4 unclipped, noise 0.4, m = 4: b = (3 * 0.5 - 0.5 + 0.4) / 4 + 0.5 = 0.85
    share = noised_unclipped_share([True, True, False, True], 0.4, 4)
    assert share == pytest.approx(0.85, rel=1e-12)
    # S = 2, gamma = 0.5, eta = 0.2: S exp(-0.2 * 0.35)
    assert next_clip(2.0, share, 0.5, 0.2) == pytest.approx(2.0 * math.exp(-0.07), rel=1e-12)
    assert next_clip(2.0, 0.5, 0.5, 0.2) == 2.0  # at the target: unchanged


def test_adaptive_rounds_move_the_clip_and_record_it():
    p = policy("clients.per_round=2", "dp_fedavg.adaptive.enabled=true", "dp_fedavg.adaptive.noise=1.0")
    assert p.z_delta == pytest.approx(2 / math.sqrt(3))
    plan = p.configure_round(0, [0, 1, 2, 3])
    assert plan.state["clip"] == 1.0 and plan.state["z_delta"] == p.z_delta
    _, state = p.aggregate(0, weights(0.0), [result(0, weights(1.0)), result(1, weights(0.1))], {})
    from nodes.contracts.rng import stream

    noise = stream(p.ctx.settings.seed, "dp_fedavg_count", 0).normal(0.0, 1.0)
    share = (0.5 - 0.5 + noise) / 2 + 0.5  # norm 3 clipped, norm 0.3 not
    assert state["unclipped_noised"] == pytest.approx(share) and state["unclipped_share"] == 0.5
    assert p.clip == state["clip_next"] == pytest.approx(math.exp(-0.2 * (share - 0.5)))
    assert p.configure_round(1, [0, 1, 2, 3]).state["clip"] == p.clip
    assert state["noise_std"] == pytest.approx(p.z_delta * 1.0 / 2)


def test_local_noise_is_each_clients_share_and_a_short_round_is_recorded():
    p = policy("clients.per_round=2", "dp_fedavg.noise=local", "dp_fedavg.clip=0.5", "dp_fedavg.noise_multiplier=2")
    plan = p.configure_round(0, [0, 1, 2, 3])
    k = len(plan.tasks)
    assert k >= 2, "seed 0's round 0 draws at least two clients"
    for t in plan.tasks:
        assert (t.update_clip, t.output_noise) == (0.5, "gaussian")
        assert t.output_noise_scale == pytest.approx(2 * 0.5 / math.sqrt(k))  # the k shares sum to z^2 S^2
    w0 = weights(0.0)
    new, state = p.aggregate(0, w0, [result(plan.tasks[0].client, weights(1.0))], {})  # one of k arrived
    assert flat(new) == pytest.approx(flat(weights(1.0)) / 2)  # not clipped again: the client did
    assert p.accountant.short_rounds == [0] and not state["epsilon_valid"]
    assert state["noise_std"] == pytest.approx(2 * 0.5 * math.sqrt(1 / k) / 2)
    assert "lacked the noise" in p.accountant.run_privacy()["population"]["noise_short_reason"]


def test_an_empty_poisson_draw_is_still_a_round_of_noise():
    """The real round (emulator.rounds.round.play_round) with nobody drawn: no task, the model moves by the
    server's noise / m, and the population is charged a round."""
    p = policy("clients.per_round=1", "dp_fedavg.clip=2.0")
    empty = next(r for r in range(100) if not poisson_sample(p.ctx.settings.seed, r, 4, 0.25, range(4)))
    resources = build_resources(p.scenario.links, p.scenario.compute, p.scenario.availability, 4, p.ctx.settings.seed)
    budgets = Budgets(p.scenario.budget, resources, task_bytes=1000, per_round=1, tau=5, deadline_s=math.inf)

    def train(rnd, frames):
        assert not frames
        return {}

    w0 = weights(0.0)
    record = play_round(
        empty,
        w0,
        settings=round_settings(p.scenario),
        policy=p,
        clock=Clock(resources, 0),
        budgets=budgets,
        train=train,
        evaluate=None,
    )
    assert record.round_row()["selected"] == 0 and not record.tasks
    assert flat(record.weights) == pytest.approx(flat(server_noise(p.ctx.settings.seed, empty, 2.0, w0)), abs=1e-6)
    assert p.accountant.ledger.steps() == 1 and not p.accountant.trained


# --- the trainer's update clip and the task's wire -------------------------------------------


def test_the_trainer_clips_the_update_before_its_noise():
    from nodes.data import load_federated
    from nodes.training.trainer import build_trainer, state_to_numpy

    torch.set_num_threads(1)
    cfg = load(None, ["clients.n=3"])
    tr = build_trainer(cfg, load_federated(cfg.data, 3, cfg.seed), torch.device("cpu"))
    w0 = {k: v.copy() for k, v in state_to_numpy(tr.model).items()}
    base = dict(client=1, steps=3, lr=0.5, sigma=0.0, clip=0.0, q=1.0)
    free = {k: v.copy() for k, v in tr.train(0, ClientTask(**base), w0)[0].items()}
    clipped, metrics = tr.train(0, ClientTask(**base, update_clip=0.01), w0)
    update, free_update = flat(clipped) - flat(w0), flat(free) - flat(w0)
    assert np.linalg.norm(free_update) > 0.01
    assert np.linalg.norm(update) == pytest.approx(0.01, rel=1e-4) == metrics["update_norm"]
    assert update == pytest.approx(free_update * 0.01 / np.linalg.norm(free_update), rel=1e-3, abs=1e-7)


def test_update_clip_travels_only_when_set():
    dp = load(None, []).dp
    plain = ClientTask.dp_sgd(3, dp)
    assert "update_clip" not in plain.to_wire()  # every other policy's task: the same message as before
    assert ClientTask.from_wire(plain.to_wire()) == plain
    clipped = ClientTask.dp_sgd(3, dp, update_clip=0.5)
    assert clipped.to_wire()["update_clip"] == 0.5 and ClientTask.from_wire(clipped.to_wire()) == clipped
    before = plain.to_wire()
    assert sorted(before) == sorted(
        ["client", "steps", "lr", "sigma", "clip", "q", "prox_mu", "weight_clip", "output_noise"]
        + ["output_noise_scale", "report_grad_diff", "report_last_step"]
    )  # the fields, and so the bytes, of the task message before update_clip existed
    assert len(task_frame(0, clipped, weights(0.0))) > len(task_frame(0, plain, weights(0.0)))
    for bad in ({k: v for k, v in before.items() if k != "lr"}, {**before, "extra": 1}):
        with pytest.raises(ValueError, match="update_clip optional"):
            ClientTask.from_wire(bad)


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["dp_fedavg.noise=secure"], r"^dp_fedavg\.noise = 'secure': expected central \| local$"),
        (["dp_fedavg.sampling=shuffled"], r"^dp_fedavg\.sampling = 'shuffled'"),
        (
            ["dp.epsilon=3", "dp_fedavg.noise_multiplier=1"],
            r"^dp\.epsilon = 3\.0: expected at least one round's client-level epsilon, 4\.73 at",
        ),
        (["dp_fedavg.sampling=fixed", "dp.accountant=pld"], r"^dp\.accountant = 'pld \(improved\)': expected rdp"),
        (["dp_fedavg.adaptive.enabled=true", "dp_fedavg.noise=local"], r"^dp_fedavg\.adaptive\.enabled = True"),
        (
            ["dp_fedavg.adaptive.enabled=true", "dp_fedavg.noise_multiplier=1"],
            r"^dp_fedavg\.adaptive\.noise = 0\.5: expected .* > z/2 = 0\.5 ",
        ),
        # z calibrated to spend eps = 5 in budget.rounds = 20 rounds of q = 1: 4.26, past 2 sigma_b = 1
        (
            ["dp_fedavg.adaptive.enabled=true", "dp.epsilon=5"],
            r"^dp_fedavg\.adaptive\.noise = 0\.5: expected .* > z/2 = 2\.13",
        ),
        (["dp_fedavg.clip=0"], r"^dp_fedavg\.clip = 0\.0: expected a number in \(0, "),
    ],
)
def test_what_dp_fedavg_refuses_is_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        load(None, ["policy=dp_fedavg", *overrides])
    assert "\n" not in str(e.value)


def test_the_summary_gives_both_figures_and_says_whether_each_holds(tmp_path):
    import pyarrow as pa

    from emulator.output.results import SCHEMAS, RunWriter

    p = policy("availability.model=diurnal")
    for _ in range(3):
        p.accountant.charge([ClientTask.dp_sgd(1, p.ctx.settings.dp)])
    writer = RunWriter(tmp_path)
    schema = SCHEMAS["rounds"]
    row = {f.name: 0 if pa.types.is_integer(f.type) else None for f in schema}
    writer.write_round(0, {"rounds": [row | {"max_epsilon": p.accountant.epsilon(0), "test_accuracy": 0.5}]})
    manifest = {
        "scenario": {"name": "x", "policy": "dp_fedavg", "dp": {"delta": DELTA}},
        "status": "complete",
        "virtual_time_s": 1.0,
        "privacy_mechanism": p.accountant.mechanism,
        "privacy": p.accountant.run_privacy(),
    }
    (tmp_path / "run.json").write_text(json.dumps(manifest))
    lines = dict(line.split(None, 1) for line in summarise_run(tmp_path).splitlines())
    assert lines["privacy"].startswith("client-level (noise on the clipped updates' sum, dp_fedavg_poisson)")
    amplified, unamplified = p.accountant.epsilon(0), p.accountant.unamplified(1)
    assert lines["sampling"] == (
        f"ε = {amplified:.4g} with amplification by sampling (poisson, q = 1, rdp): does NOT hold: "
        "availability.model=diurnal: who could be selected depended on availability, not only on the server's "
        f"random draw; ε = {unamplified:.4g} without it (the rounds each client trained in, largest)"
    )

"""Privacy accounting: Opacus agreement, classic conversion, R_c search, ledgers, and the
papers' noise calibrations (Fu Thm 1-2, Wei eq. 10/25, Talaei eq. 8/13)."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from emulator.policies import fu_tuning, udp_crd
from emulator.policies.fu_tuning import gaussian_sigma, laplace_scale
from emulator.policies.padpfl import talaei_client_sigma, talaei_server_sigma
from emulator.policies.udp_crd import wei_crd_sigma, wei_epsilon, wei_sigma
from emulator.privacy import LedgerEntry, PrivacyLedger, epsilon, max_steps, numerical, pld, prv
from emulator.privacy import rdp as rdp_accountant
from emulator.privacy.ledger import rdp
from emulator.privacy.rdp import DEFAULT_ORDERS

DELTA = 1e-5


def _random_triples(n=20, seed=1234):
    rng = np.random.default_rng(seed)
    return [
        (float(rng.uniform(0.001, 0.5)), float(rng.uniform(0.5, 5.0)), int(rng.integers(1, 5001))) for _ in range(n)
    ]


TRIPLES = _random_triples()


def _opacus_eps(history, delta=DELTA):
    acc = RDPAccountant()
    acc.history = [(sigma, q, steps) for q, sigma, steps in history]
    return acc.get_epsilon(delta)


# --- Opacus agreement --------------------------------------------------------------------


def test_default_orders_are_opacus_alphas():
    assert DEFAULT_ORDERS == list(RDPAccountant.DEFAULT_ALPHAS)


@pytest.mark.parametrize("q,sigma,steps", TRIPLES)
def test_improved_matches_opacus_accountant(q, sigma, steps):
    ours = epsilon([(q, sigma, steps)], DELTA, conversion="improved")
    ref = _opacus_eps([(q, sigma, steps)])
    assert math.isfinite(ref) and ref > 0
    assert ours == pytest.approx(ref, rel=1e-9, abs=0)


ORDER_GRID = [1.01, 1.1, 1.5, 2, 2.5, 3, 7.3, 12, 32, 63, 64, 128, 256]


@pytest.mark.filterwarnings("ignore:Optimal order")  # get_privacy_spent's, at the grid's extreme orders
@pytest.mark.parametrize("q", [0.0, 1e-4, 0.01, 0.05, 0.3, 0.999, 1.0])
@pytest.mark.parametrize("sigma", [0.3, 0.7, 1.0, 2.5, 10.0])
def test_rdp_is_opacus_compute_rdp_over_a_grid(q, sigma):
    """Ours is Opacus's analysis loaded from its file (the server never imports opacus): the
    same numbers as the package's compute_rdp and get_privacy_spent, at every order and step count."""
    for steps in (1, 7, 1000, 123_457):
        ours = rdp([(q, sigma, steps)], ORDER_GRID)
        ref = compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=ORDER_GRID)
        np.testing.assert_allclose(ours, ref, rtol=1e-15, atol=0)
        if 0 < q:
            got = epsilon([(q, sigma, steps)], DELTA, orders=ORDER_GRID)
            want = get_privacy_spent(orders=ORDER_GRID, rdp=ref, delta=DELTA)[0]
            assert got == pytest.approx(max(float(want), 0.0), rel=1e-15, abs=0)


def test_heterogeneous_sigma_composes_like_opacus_steps():
    q, s1, n1, s2, n2 = 0.02, 1.1, 300, 0.8, 200
    acc = RDPAccountant()
    for _ in range(n1):
        acc.step(noise_multiplier=s1, sample_rate=q)
    for _ in range(n2):
        acc.step(noise_multiplier=s2, sample_rate=q)
    assert acc.history == [(s1, q, n1), (s2, q, n2)]
    ours = epsilon([(q, s1, n1), (q, s2, n2)], DELTA)
    assert ours == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9, abs=0)
    # composition adds RDP, so it is strictly more than either run alone
    assert ours > max(epsilon([(q, s1, n1)], DELTA), epsilon([(q, s2, n2)], DELTA))
    np.testing.assert_allclose(rdp([(q, s1, n1), (q, s2, n2)]), rdp([(q, s1, n1)]) + rdp([(q, s2, n2)]), rtol=1e-12)


def test_remembered_epsilons_answer_only_their_own_question():
    """epsilon() remembers each history's value (the server asks for every client every round):
    a history asked again with another delta, conversion or orders gets that question's answer."""
    h = [(0.02, 1.1, 300), (0.02, 0.8, 200)]
    questions = [
        dict(delta=DELTA),
        dict(delta=1e-3),
        dict(delta=DELTA, conversion="classic"),
        dict(delta=DELTA, orders=ORDER_GRID),
    ]
    fresh = []
    for kw in questions:
        rdp_accountant._epsilon_of.cache_clear()
        fresh.append(epsilon(h, **kw))
    assert len(set(fresh)) == len(fresh)  # four different answers
    rdp_accountant._epsilon_of.cache_clear()
    for _ in range(2):
        assert [epsilon(h, **kw) for kw in questions] == fresh
        assert [epsilon([LedgerEntry(*e) for e in h], **kw) for kw in questions] == fresh
    assert epsilon(h[:1], DELTA) != fresh[0]  # another history is another question
    assert rdp_accountant._epsilon_of.cache_info().hits == 12


def test_edge_cases_empty_zero_sigma_zero_steps():
    assert epsilon([], DELTA) == 0.0
    assert epsilon([], DELTA, conversion="classic") == 0.0
    assert epsilon([(0.1, 1.0, 0)], DELTA) == 0.0
    assert epsilon([(0.1, 0.0, 5)], DELTA) == math.inf
    assert epsilon([(0.1, 1.0, 10), (0.1, 0.0, 1)], DELTA, conversion="classic") == math.inf
    assert epsilon([(0.1, 0.0, 0), (0.1, 1.0, 10)], DELTA) == epsilon([(0.1, 1.0, 10)], DELTA)
    r = rdp([(0.1, 0.0, 3)])
    assert np.all(np.isinf(r))
    assert np.all(rdp([(0.1, 1.0, 0)]) == 0.0)
    with pytest.raises(ValueError):
        epsilon([(0.1, 1.0, 10)], DELTA, conversion="prv")
    with pytest.raises(ValueError):
        epsilon([(1.5, 1.0, 10)], DELTA)
    with pytest.raises(ValueError):
        epsilon([(0.1, 1.0, 10)], 0.0)


# --- classic conversion (ALI-DPFL Theorem 2) ---------------------------------------------


def test_classic_full_batch_by_hand():
    # q = 1: the Gaussian mechanism, RDP(alpha) = steps * alpha / (2 sigma^2).
    sigma, steps, delta = 2.0, 10, 1e-5
    alphas = list(range(2, 65)) + [128, 256, 512]
    by_hand = min(steps * a / (2 * sigma**2) + math.log(1 / delta) / (a - 1) for a in alphas)
    # the minimiser is alpha = 4: 5 + ln(1e5)/3
    assert by_hand == pytest.approx(5 + math.log(1e5) / 3, rel=1e-15)
    assert epsilon([(1.0, sigma, steps)], delta, conversion="classic") == pytest.approx(by_hand, rel=1e-12)


def test_classic_subsampled_by_hand_eq15():
    # ALI-DPFL eq. 15: A_alpha = sum_k C(alpha,k) (1-q)^(alpha-k) q^k exp((k^2-k)/(2 sigma^2)),
    # RDP = steps * log(A_alpha) / (alpha-1); eps by eq. 12 (with the log of eq. 13/15).
    q, sigma, steps, delta = 0.05, 1.5, 400, 1e-5

    def rdp_alpha(a):  # log A_alpha by log-sum-exp (the terms overflow a float at alpha ~ 64)
        logs = [
            math.log(math.comb(a, k)) + (a - k) * math.log(1 - q) + k * math.log(q) + (k * k - k) / (2 * sigma**2)
            for k in range(a + 1)
        ]
        top = max(logs)
        log_a = top + math.log(sum(math.exp(x - top) for x in logs))
        return steps * log_a / (a - 1)

    by_hand = min(rdp_alpha(a) + math.log(1 / delta) / (a - 1) for a in range(2, 65))
    ours = epsilon([(q, sigma, steps)], delta, conversion="classic")
    assert ours == pytest.approx(by_hand, rel=1e-9)


@pytest.mark.parametrize("q,sigma,steps", TRIPLES[:10])
def test_classic_is_looser_than_improved(q, sigma, steps):
    h = [(q, sigma, steps)]
    classic = epsilon(h, DELTA, conversion="classic")
    assert classic >= epsilon(h, DELTA, conversion="improved")
    # on the same orders this is a theorem (the improved bound subtracts positive terms)
    assert classic >= epsilon(h, DELTA, conversion="improved", orders=rdp_accountant.CLASSIC_ORDERS)


# --- R_c (ALI-DPFL Algorithm 3) ----------------------------------------------------------

MAX_STEPS_CASES = [
    (0.01, 1.0, 1e-5, 8.0),
    (0.001, 0.6, 1e-5, 3.0),
    (0.02, 1.2, 1e-6, 2.0),
    (1.0, 4.0, 1e-5, 5.0),
]


@pytest.mark.parametrize("conversion", ["improved", "classic"])
@pytest.mark.parametrize("q,sigma,delta,target", MAX_STEPS_CASES)
def test_max_steps_is_exact(q, sigma, delta, target, conversion):
    n = max_steps(q, sigma, delta, target, conversion=conversion)
    assert n >= 1
    assert epsilon([(q, sigma, n)], delta, conversion) <= target
    assert epsilon([(q, sigma, n + 1)], delta, conversion) > target


@pytest.mark.parametrize("conversion", ["improved", "classic"])
def test_max_steps_with_prior_history(conversion):
    prior = [(0.01, 2.0, 500), (0.01, 0.9, 300)]
    q, sigma, target = 0.01, 1.0, 6.0
    n = max_steps(q, sigma, DELTA, target, history=prior, conversion=conversion)
    fresh = max_steps(q, sigma, DELTA, target, conversion=conversion)
    assert 0 < n < fresh
    assert epsilon(prior + [(q, sigma, n)], DELTA, conversion) <= target
    assert epsilon(prior + [(q, sigma, n + 1)], DELTA, conversion) > target
    ledger = PrivacyLedger()
    for e in prior:
        ledger.record(*e)
    assert ledger.max_steps(q, sigma, DELTA, target, conversion=conversion) == n


def test_max_steps_limits_and_degenerate_cases():
    assert max_steps(0.01, 1.0, DELTA, math.inf) == 10**7
    assert max_steps(0.01, 1.0, DELTA, math.inf, limit=123) == 123
    # target below the cost of one step
    one = epsilon([(0.01, 1.0, 1)], DELTA)
    assert max_steps(0.01, 1.0, DELTA, one * 0.5) == 0
    assert max_steps(0.01, 1.0, DELTA, one) == 1
    # history already over budget
    assert max_steps(0.01, 1.0, DELTA, 1.0, history=[(0.5, 0.7, 1000)]) == 0
    # target never reached within the limit
    assert max_steps(0.001, 50.0, DELTA, 10.0, limit=1000) == 1000
    assert max_steps(0.01, 0.0, DELTA, 100.0) == 0
    assert max_steps(0.0, 1.0, DELTA, 1.0, limit=77) == 77


# --- dp.accountant: rdp | prv | pld ----------------------------------------------------------
# Versions the pinned numbers were computed with: opacus 1.6.0, dp-accounting 0.6.0 (numpy 2.4.6,
# scipy 1.17.1). A library release that moves them fails the literal, not the library comparison.

ACCOUNTANTS = ["rdp", "prv", "pld"]
# Abadi et al. 2016's MNIST setting: batch 256 of 60,000 for 60 epochs; steps = ceil(60 * 60000 / 256)
# = 14,063, as tensorflow_privacy's compute_dp_sgd_privacy counts them.
Q_MNIST, SIGMA_MNIST, STEPS_MNIST = 256 / 60000, 1.1, 14063
PINNED = {"rdp": 2.5966555286883684, "prv": 2.3918365361863954, "pld": 2.381778812581751}
# How far another machine may land from a pinned figure: its last bits are the CPU's (numpy's AVX-512
# exp/log, OpenBLAS's ddot kernel and thread count, the FFTs' order of sums). RDP is a well-conditioned
# log-sum-exp over the orders: a few ulps (rel=1e-12). PRV and PLD amplify an ulp of their inputs
# ~10^8-fold (1e-8 relative, measured) and may move a mass by one cell of their grids, so each is held
# to its accountant's own stated resolution: PRV's eps_error, PLD's loss discretisation interval.
PINNED_TOLERANCE = {
    "rdp": dict(rel=1e-12),
    "prv": dict(abs=prv.PRV_EPS_ERROR),
    "pld": dict(abs=pld.PLD_VALUE_DISCRETIZATION),
}
MIXED = [  # histories of several runs, (q, sigma) changing as ALI-DPFL's and dropout's do
    [(0.01, 1.0, 500), (0.01, 0.8, 300)],
    [(0.05, 1.0, 25), (0.1, 2.0, 25), (0.05, 1.0, 10)],
    [(1.0, 8.0, 3), (0.004, 1.1, 2000)],
    [(0.2, 1.5, 40)],
]


def _needs(accountant):
    if accountant == "pld":
        pytest.importorskip("dp_accounting", reason="dp.accountant=pld: pip install 'dpfl-emulator[pld]'")


def _library_eps(accountant, history, delta=DELTA):
    """The reference library's own epsilon, called directly: Opacus's RDPAccountant and PRVAccountant
    (same eps_error), dp_accounting's PLDAccountant (same discretisation)."""
    if accountant == "rdp":
        return _opacus_eps(history, delta)
    if accountant == "prv":
        from opacus.accountants import PRVAccountant

        acc = PRVAccountant()
        acc.history = [(sigma, q, steps) for q, sigma, steps in history]
        with np.errstate(divide="ignore"):  # q = 1: log(1 - q)
            return float(acc.get_epsilon(delta, eps_error=0.01))
    import dp_accounting

    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    for q, sigma, steps in history:
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        acc.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_each_accountant_is_its_library_on_the_dp_sgd_mnist_setting(accountant):
    _needs(accountant)
    h = [(Q_MNIST, SIGMA_MNIST, STEPS_MNIST)]
    ours = epsilon(h, DELTA, accountant=accountant)
    assert ours == pytest.approx(_library_eps(accountant, h), rel=1e-6, abs=0)
    assert ours == pytest.approx(PINNED[accountant], **PINNED_TOLERANCE[accountant])


@pytest.mark.parametrize("accountant", ["prv", "pld"])
def test_prv_and_pld_are_below_rdp_and_compose_runs_as_their_libraries_do(accountant):
    _needs(accountant)
    for h in MIXED:
        ours = epsilon(h, DELTA, accountant=accountant)
        assert 0 < ours <= epsilon(h, DELTA), h
        # equal (q, sigma) runs are one run of their summed steps (composition commutes)
        merged = numerical._merged(h)
        assert ours == pytest.approx(_library_eps(accountant, merged), rel=1e-6, abs=0), h
    # merging is the same question: a run split in two, in another order, gives the same epsilon
    split = [(0.05, 1.0, 10), (0.1, 2.0, 25), (0.05, 1.0, 25)]
    assert epsilon(split, DELTA, accountant=accountant) == epsilon(MIXED[1], DELTA, accountant=accountant)


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_max_steps_is_exact_under_each_accountant(accountant):
    _needs(accountant)
    for q, sigma, target, prior in [(0.05, 1.0, 3.0, []), (0.02, 1.2, 3.0, [(0.05, 1.2, 20)])]:
        n = max_steps(q, sigma, DELTA, target, history=prior, accountant=accountant)
        assert n >= 1
        assert epsilon(prior + [(q, sigma, n)], DELTA, accountant=accountant) <= target
        assert epsilon(prior + [(q, sigma, n + 1)], DELTA, accountant=accountant) > target
        if accountant != "rdp":  # tighter: more steps within the same budget
            assert n >= max_steps(q, sigma, DELTA, target, history=prior)
    assert max_steps(0.05, 1.0, DELTA, math.inf, accountant=accountant, limit=99) == 99
    assert max_steps(0.05, 0.0, DELTA, 3.0, accountant=accountant) == 0


@pytest.mark.parametrize("accountant", ["prv", "pld"])
def test_prv_and_pld_edge_cases_and_their_cache(accountant):
    _needs(accountant)
    assert epsilon([], DELTA, accountant=accountant) == 0.0
    assert epsilon([(0.1, 1.0, 0)], DELTA, accountant=accountant) == 0.0
    assert epsilon([(0.1, 0.0, 5)], DELTA, accountant=accountant) == math.inf
    # q = 0: no loss (the libraries take no such run)
    assert epsilon([(0.0, 1.0, 5), (0.1, 1.0, 3)], DELTA, accountant=accountant) == epsilon(
        [(0.1, 1.0, 3)], DELTA, accountant=accountant
    )
    with pytest.raises(ValueError, match="rdp accountant's"):
        epsilon([(0.1, 1.0, 3)], DELTA, conversion="classic", accountant=accountant)
    with pytest.raises(ValueError, match="rdp accountant's"):
        epsilon([(0.1, 1.0, 3)], DELTA, orders=ORDER_GRID, accountant=accountant)
    numerical._numerical_epsilon.cache_clear()
    h = [(0.05, 1.0, 40)]
    first = epsilon(h, DELTA, accountant=accountant)
    assert epsilon(h, DELTA, accountant=accountant) == first and numerical._numerical_epsilon.cache_info().hits == 1
    assert epsilon(h, 1e-3, accountant=accountant) < first  # another delta is another question
    # past eps = 100 (RDP's), RDP's epsilon, with a warning: their grids would take GBs
    huge = [(0.5, 0.3, 1000)]
    with pytest.warns(RuntimeWarning, match=f"dp.accountant={accountant}"):
        assert epsilon(huge, DELTA, accountant=accountant) == epsilon(huge, DELTA) > numerical.NUMERICAL_MAX_EPS


def test_unknown_accountant_is_refused():
    with pytest.raises(ValueError, match=r"^dp\.accountant = 'gdp': expected rdp \| prv \| pld"):
        epsilon([(0.1, 1.0, 3)], DELTA, accountant="gdp")
    with pytest.raises(ValueError, match=r"^dp\.accountant = 'gdp': expected rdp \| prv \| pld"):
        max_steps(0.1, 1.0, DELTA, 3.0, accountant="gdp")


def test_prv_past_its_grid_reports_rdp():
    # 10^6 steps: Opacus's PRV mesh shrinks with sqrt(steps), past PRV_MAX_POINTS here
    h = [(0.001, 1.0, 10**6)]
    with pytest.warns(RuntimeWarning, match="dp.accountant=prv"):
        assert epsilon(h, DELTA, accountant="prv") == epsilon(h, DELTA)


def test_prv_keeps_the_server_free_of_torch_and_opacus():
    """Opacus's PRV analysis is loaded from its files (as its RDP analysis is): the server, which
    never imports torch, does not for dp.accountant=prv either, and gets PRVAccountant's number."""
    code = (
        "import sys, json; from emulator.privacy import epsilon; "
        f"e = epsilon([({Q_MNIST}, {SIGMA_MNIST}, {STEPS_MNIST})], {DELTA}, accountant='prv'); "
        "print(json.dumps([e, 'torch' in sys.modules, [m for m in sys.modules if m.split('.')[0] == 'opacus']]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    eps, torch_imported, opacus_modules = json.loads(out.splitlines()[-1])
    assert (torch_imported, opacus_modules) == (False, [])
    assert eps == pytest.approx(PINNED["prv"], **PINNED_TOLERANCE["prv"])  # a float of this CPU's FFTs and BLAS


def test_run_summary_calls_each_accountants_ledgers_sample_level():
    from emulator.output.summary import privacy_kind

    for tag in ACCOUNTANTS:
        assert privacy_kind({"privacy_mechanism": tag}) == "sample-level"
    assert privacy_kind({"privacy_mechanism": "talaei_gaussian"}) == "client-level"


def test_dp_accountant_key_one_line_refusals(monkeypatch):
    from emulator.config import ConfigError, load

    assert load(None, []).dp.accountant == "rdp"
    assert load(None, ["dp.accountant=prv"]).dp.accountant == "prv"
    for overrides, key in [
        (["dp.accountant=gdp"], "dp.accountant"),
        (["dp.accountant=prv", "dp.conversion=classic"], "dp.conversion"),
    ]:
        with pytest.raises(ConfigError) as e:
            load(None, overrides)
        assert str(e.value).startswith(f"{key} = ") and len(str(e.value).splitlines()) == 1, str(e.value)
    assert load(None, ["dp.conversion=classic"]).dp.conversion == "classic"  # rdp's
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # as if not installed
    with pytest.raises(ConfigError) as e:
        load(None, ["dp.accountant=pld"])
    msg = str(e.value)
    assert msg.startswith("dp.accountant = 'pld'") and "pip install 'dpfl-emulator[pld]'" in msg, msg
    assert len(msg.splitlines()) == 1


# --- ledger -------------------------------------------------------------------------------


def test_ledger_record_merge_and_round_trip():
    led = PrivacyLedger()
    led.record(0.01, 1.0, 10)
    led.record(0.01, 1.0, 5)  # merges
    led.record(0.01, 0.8, 3)  # new sigma
    led.record(0.02, 0.8, 0)  # no-op
    led.record(0.01, 1.0, 2)  # not adjacent to the first run: new entry
    assert led.entries == [LedgerEntry(0.01, 1.0, 15), LedgerEntry(0.01, 0.8, 3), LedgerEntry(0.01, 1.0, 2)]
    assert led.steps() == 20
    d = led.to_dict()
    assert d == json.loads(json.dumps(d))
    back = PrivacyLedger.from_dict(d)
    assert back == led
    assert back.epsilon(DELTA) == led.epsilon(DELTA)
    assert led.epsilon(DELTA) == pytest.approx(_opacus_eps(led.history()), rel=1e-9)
    assert PrivacyLedger.from_dict({"entries": []}).epsilon(DELTA) == 0.0


def test_ledger_epsilon_monotone_in_steps():
    led = PrivacyLedger()
    prev = {"improved": 0.0, "classic": 0.0}
    for k in range(6):
        led.record(0.02, 1.0 if k % 3 else 1.3, 25)
        for conv in prev:
            e = led.epsilon(DELTA, conversion=conv)
            assert e > prev[conv]
            prev[conv] = e


# --- Fu et al.: Gaussian and Laplace calibration ------------------------------------------


def test_gaussian_sigma_values():
    c = math.sqrt(2 * math.log(1.25 / 1e-5))
    assert gaussian_sigma(1.0, 1e-5, 1.0) == pytest.approx(c, rel=1e-15)
    assert gaussian_sigma(1.0, 1e-5, 1.0) == pytest.approx(4.844805262605641, rel=1e-12)
    assert gaussian_sigma(2.0, 1e-5, 0.5, releases=9) == pytest.approx(0.5 * c * 3 / 2, rel=1e-15)
    # Fu Thm 2 form: sigma ~ sqrt(T_l); q=1 with default c_2 is the same calibration
    assert fu_tuning.fu_gaussian_sigma(2.0, 1e-5, T_l=9, Xi_2=0.5) == pytest.approx(
        gaussian_sigma(2.0, 1e-5, 0.5, releases=9), rel=1e-12
    )
    assert fu_tuning.fu_gaussian_sigma(1.0, 1e-4, T_l=4, q=0.5, c_2=2.0) == pytest.approx(
        2.0 * 0.5 * math.sqrt(4 * math.log(1e4)), rel=1e-15
    )
    assert gaussian_sigma(math.inf, 1e-5, 1.0) == 0.0
    with pytest.raises(ValueError):
        gaussian_sigma(0.0, 1e-5, 1.0)


def test_laplace_scale_values():
    assert laplace_scale(2.0, 3.0) == 1.5
    assert laplace_scale(2.0, 3.0, releases=10) == 15.0  # Fu Thm 1: T_l * Xi_1 / eps
    assert laplace_scale(0.5, fu_tuning.fu_sensitivity(0.1, 5, 2.0), releases=4) == pytest.approx(8.0)


# --- Wei et al. eq. 10 and 25 -------------------------------------------------------------


def test_wei_eq10_value():
    # sigma = Delta_l sqrt(2 q T ln(1/delta)) / eps
    s = wei_sigma(eps=4.0, delta=1e-3, T=50, sensitivity=0.02, q=0.5)
    assert s == pytest.approx(0.02 * math.sqrt(2 * 0.5 * 50 * math.log(1e3)) / 4.0, rel=1e-15)
    assert s == pytest.approx(0.0929230547212460, rel=1e-12)
    assert udp_crd.wei_sensitivity(eta=0.1, C=1.0, D_size=200) == pytest.approx(0.001)


def test_wei_eq25_unchanged_horizon_keeps_sigma():
    eps, delta, T, L, q = 4.0, 1e-3, 50, 0.02, 0.5
    s0 = wei_crd_sigma(eps, delta, T, [], L, q)
    assert s0 == pytest.approx(wei_sigma(eps, delta, T, L, q), rel=1e-12)  # t = 0: eq. 10
    hist = [s0]
    for _ in range(10):
        hist.append(wei_crd_sigma(eps, delta, T, hist, L, q))
    assert hist == pytest.approx([s0] * 11, rel=1e-12)  # eq. 30-31


def test_wei_eq25_horizon_change_meets_target():
    eps, delta, T, L, q, beta = 4.0, 1e-3, 50, 0.02, 0.5, 0.7
    hist = []
    for _ in range(10):
        hist.append(wei_crd_sigma(eps, delta, T, hist, L, q))
    t = len(hist)
    T_new = math.floor(beta * (T - t)) + t  # CRD discount: T <- floor(beta (T-t)) + t
    assert T_new == 38
    s_new = wei_crd_sigma(eps, delta, T_new, hist, L, q)
    assert s_new < hist[-1]  # fewer rounds left: less noise each
    while len(hist) < T_new:
        hist.append(wei_crd_sigma(eps, delta, T_new, hist, L, q))
    assert hist[t:] == pytest.approx([s_new] * (T_new - t), rel=1e-12)
    # eq. 29: ln(1/delta) < eps^2 / (2 q L^2 sum 1/sigma^2) -- met with equality by eq. 25
    assert wei_epsilon(hist, delta, L, q) == pytest.approx(eps, rel=1e-12)
    assert 2 * q * L**2 * math.log(1 / delta) * sum(1 / s**2 for s in hist) <= eps**2 * (1 + 1e-12)
    with pytest.raises(ValueError):
        wei_crd_sigma(eps, delta, T_new, hist, L, q)  # t == T: training has stopped
    # budget exhausted by very small past noise -> no finite sigma
    assert wei_crd_sigma(eps, delta, 100, [1e-6], L, q) == math.inf


# --- Talaei & Izadi eq. 8 and 13 ----------------------------------------------------------


def test_talaei_eq8_client_sigma():
    # sigma_C = 2 B R c / (min m_i eps)
    assert talaei_client_sigma(B=1.0, R=5, m=[200, 100, 300], epsilon=5.0, c=2.0) == pytest.approx(0.04, rel=1e-15)
    c = math.sqrt(2 * math.log(1.25 / 1e-5))
    assert talaei_client_sigma(B=2.0, R=3, m=50, epsilon=20.0, delta=1e-5) == pytest.approx(
        2 * 2.0 * 3 * c / (50 * 20.0), rel=1e-15
    )
    with pytest.raises(ValueError):
        talaei_client_sigma(B=1.0, R=5, m=[100], epsilon=5.0)


def test_talaei_eq13_server_sigma_and_zero_branch():
    B, R, m, eps, c = 1.0, 5, [100, 200], 5.0, 2.0
    p = [0.5, 0.5]
    # T = 10 > R sqrt(0.5)/0.5 = 7.07: sqrt(100*0.25 - 25*0.5) = sqrt(12.5)
    s = talaei_server_sigma(B=B, T=10, R=R, p=p, m=m, epsilon=eps, c=c)
    assert s == pytest.approx(2 * 1.0 * 2.0 * math.sqrt(12.5) / (100 * 5.0), rel=1e-15)
    assert s == pytest.approx(0.0282842712474619, rel=1e-12)
    # eq. 14: sigma_S^2 + sigma_AC^2 = sigma_A^2
    sc = talaei_client_sigma(B=B, R=R, m=m, epsilon=eps, c=c)
    sigma_ac2 = sum(sc**2 * pi**2 for pi in p)
    sigma_a = 2 * B * 10 * c * max(p) / (min(m) * eps)
    assert s**2 + sigma_ac2 == pytest.approx(sigma_a**2, rel=1e-12)
    # zero branch: T = 7 <= 7.07, and the boundary T == R sqrt(sum p^2)/max p
    assert talaei_server_sigma(B=B, T=7, R=R, p=p, m=m, epsilon=eps, c=c) == 0.0
    assert talaei_server_sigma(B=B, T=5, R=5, p=[1.0], m=m, epsilon=eps, c=c) == 0.0
    assert talaei_server_sigma(B=B, T=6, R=5, p=[1.0], m=m, epsilon=eps, c=c) == pytest.approx(
        2 * c * math.sqrt(36 - 25) / (100 * eps), rel=1e-15
    )

"""The accountants are total and bounded (issue 48): each input has a range refused at start in one line,
a budget no noise reaches is refused naming dp.epsilon, a library's own error is RDP's epsilon instead, and
PLD composes a history grown run by run once per run, with the library's epsilon."""

import itertools
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from emulator import privacy as P
from emulator.config import ConfigError, load
from emulator.policies.population import Z_MAX, calibrated_noise_multiplier
from emulator.privacy import numerical, pld

ROOT = Path(__file__).resolve().parents[2]
DELTA = 1e-5


def _needs_pld():
    pytest.importorskip("dp_accounting", reason="dp.accountant=pld: pip install 'dpfl-emulator[pld]'")


def _one_line(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1, msg
    return msg


@pytest.mark.parametrize("delta", ["0.999999", "0.5", "1e-13", "0"])
@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_a_delta_outside_where_the_accountants_answer_is_one_line(delta, accountant):
    msg = _one_line([f"dp.accountant={accountant}", f"dp.delta={delta}"])
    assert msg.startswith(f"dp.delta = {float(delta)!r}: expected a number in [1e-12, 0.1]"), msg
    for edge in ("1e-12", "0.1"):
        assert load(None, [f"dp.accountant={accountant}", f"dp.delta={edge}"]).dp.delta == float(edge)


def test_prv_near_delta_one_reports_rdp_instead_of_raising():
    # the library's RuntimeError("Cannot compute epsilon"), asked directly past the scenario's range
    h = [(0.05, 1.0, 25)]
    with pytest.warns(RuntimeWarning, match="dp.accountant=prv: a history past what its library computes"):
        assert P.epsilon(h, 0.999999, accountant="prv") == P.epsilon(h, 0.999999)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_a_budget_no_noise_reaches_is_one_line_naming_dp_epsilon(accountant):
    msg = _one_line(["policy=dp_fedavg", "dp.epsilon=0.001", f"dp.accountant={accountant}"])
    assert msg.startswith("dp.epsilon = 0.001: expected a budget dp_fedavg can calibrate noise to: ")
    assert f"needs a noise multiplier above {Z_MAX:g}" in msg and "dp.accountant=pld" in msg, msg
    # and the calibration itself says the same instead of overflowing (z doubled past 1e154)
    dp = load(None, [f"dp.accountant={accountant}"]).dp
    dp.epsilon = 0.001
    with pytest.raises(ValueError, match=r"^dp\.epsilon = 0\.001: expected .* needs a noise multiplier above"):
        calibrated_noise_multiplier(dp, 20, "poisson", 1.0, 20, 30)


def test_a_budget_within_reach_still_calibrates():
    dp = load(None, []).dp
    dp.epsilon = 0.5
    z = calibrated_noise_multiplier(dp, 20, "poisson", 1.0, 20, 30)
    assert 1 < z < Z_MAX and P.epsilon([(1.0, z, 30)], dp.delta) <= 0.5


def test_an_enormous_noise_multiplier_is_accounted_not_an_overflow():
    assert 0 <= P.epsilon([(1.0, 1e200, 5)], DELTA) < 0.2  # RDP's floor at its orders, not OverflowError


@pytest.mark.parametrize("accountant, fits", [("prv", "rdp | pld"), ("pld", "rdp")])
def test_a_policy_changing_sigma_past_the_runs_an_accountant_composes_is_refused(accountant, fits):
    if accountant == "pld":
        _needs_pld()
    most = P.ACCOUNTANTS.get(accountant).max_runs
    msg = _one_line(["policy=adap_dpfl", f"dp.accountant={accountant}", f"budget.rounds={most + 1}"])
    assert msg.startswith(f"dp.accountant = '{accountant}': expected {fits}: policy=adap_dpfl may give each round"), msg
    assert f"budget.rounds = {most + 1} distinct (q, sigma) runs, past the {most} that {accountant}" in msg, msg
    assert (
        load(None, ["policy=adap_dpfl", f"dp.accountant={accountant}", f"budget.rounds={most}"]).budget.rounds == most
    )
    # a policy whose sigma is the scenario's adds no distinct runs: any number of rounds
    assert load(None, ["policy=fedavg_dp", f"dp.accountant={accountant}", "budget.rounds=100000"]).policy == "fedavg_dp"


def test_a_run_whose_accounting_may_be_long_says_so_at_its_start(caplog):
    from emulator.privacy.prv import PRV_SECONDS_PER_RUN
    from emulator.run import lifecycle

    cfg = load(None, ["policy=adap_dpfl", "dp.accountant=prv", "budget.rounds=100", "clients.n=20"])
    with caplog.at_level("WARNING", logger="dpfl"):
        lifecycle._note_history_cost(cfg)
    (line,) = [r.getMessage() for r in caplog.records]
    minutes = 20 * PRV_SECONDS_PER_RUN * 100 * 101 / 2 / 60  # every client asked every round, a run more each
    assert (
        "dp.accountant=prv: policy=adap_dpfl may give each round a sigma of its own; over budget.rounds = 100" in line
    )
    assert f"up to about {minutes:.0f} min" in line, line
    caplog.clear()
    for quiet in (["dp.accountant=rdp"], ["policy=fedavg_dp", "dp.accountant=prv"], ["budget.rounds=10"]):
        with caplog.at_level("WARNING", logger="dpfl"):
            lifecycle._note_history_cost(
                load(None, ["policy=adap_dpfl", "dp.accountant=prv", "budget.rounds=100", "clients.n=20", *quiet])
            )
    assert not caplog.records


def test_the_refusals_from_the_command_line_are_one_line_exit_2(tmp_path):
    for args, key in [
        (["scenario=dropout.yaml", "dp.accountant=prv", "dp.delta=0.999999"], "dp.delta"),
        (["scenario=dropout.yaml", "policy=dp_fedavg", "dp.epsilon=0.001"], "dp.epsilon"),
        (["scenario=dropout.yaml", "policy=adap_dpfl", "dp.accountant=prv", "budget.rounds=101"], "dp.accountant"),
    ]:
        r = subprocess.run(
            [sys.executable, "-m", "emulator", *args, f"output.dir={tmp_path}", "output.progress=false"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"error: {key} = "), r.stderr
        assert not any(tmp_path.iterdir())


def test_a_fallback_is_recorded_at_every_answer_cached_or_not_until_the_next_run():
    numerical.reset_fallbacks()
    huge = [(0.5, 0.3, 1000)]  # RDP's epsilon is past NUMERICAL_MAX_EPS: neither grid is built
    for _ in range(2):  # the second answer is the cache's
        with pytest.warns(RuntimeWarning, match="dp.accountant=prv"):
            P.epsilon(huge, DELTA, accountant="prv")
        assert numerical.FALLBACKS == {"prv": "its grid"}
        numerical.reset_fallbacks()
    P.epsilon([(0.05, 1.0, 25)], DELTA, accountant="prv")
    assert numerical.FALLBACKS == {}


def test_a_run_whose_accountant_fell_back_says_so_in_run_json_and_its_summary(tmp_path):
    """Its epsilons are RDP's, not the named theorem's: never labelled with a theorem that did not compute them."""
    args = ["scenario=dropout.yaml", "dp.accountant=prv", "dp.sigma=0.2", "dp.q=1", "dp.epsilon=inf"]
    small = ["budget.rounds=1", "clients.n=2", "workers=1", f"output.dir={tmp_path}", "output.name=x"]
    r = subprocess.run(
        [sys.executable, "-m", "emulator", *args, *small, "output.progress=false"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "x" / "run.json").read_text())
    assert manifest["privacy_fallback"] == {"prv": "its grid"} and manifest["privacy_mechanism"] == "prv"
    assert "(DP-SGD, prv, RDP's ε where prv fell back: its grid)" in r.stdout


# --- PLD: the library's numbers, composed once per run -------------------------------------


def _library_pld(history, delta=DELTA):
    import dp_accounting

    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=pld.PLD_VALUE_DISCRETIZATION)
    for q, sigma, steps in history:
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        acc.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return acc.get_epsilon(delta)


# (0.05, 0.167) and (1.0, 0.5): wide PMFs, built from arrays here (_connect_dots_pmf); (1.0, 8.0): one the library
# keeps sparse, its own call
@pytest.mark.parametrize("q, sigma", [(0.05, 1.0), (1.0, 8.0), (0.004, 1.1), (0.05, 0.167), (1.0, 0.5)])
def test_the_vectorised_one_step_pld_is_the_librarys_bit_for_bit(q, sigma):
    _needs_pld()
    import dp_accounting
    import numpy as np

    ours = pld._pld_one_step(q, sigma)
    theirs = dp_accounting.pld.privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma, value_discretization_interval=pld.PLD_VALUE_DISCRETIZATION, sampling_prob=q
    )
    for a, b in [(ours._pmf_remove, theirs._pmf_remove), (ours._pmf_add, theirs._pmf_add)]:
        assert a._lower_loss == b._lower_loss and a._infinity_mass == b._infinity_mass
        assert np.array_equal(a._probs, b._probs)


# narrow PMFs to 5,000 steps; the wide ones (sigma < 1) to 64, whose library composition takes seconds a case
SELF_COMPOSED = [(q, s, n) for q, s in [(0.05, 1.0), (0.004, 1.1), (0.2, 3.0)] for n in (2, 7, 300, 5000)]
SELF_COMPOSED += [(q, s, n) for q, s in [(0.05, 0.167), (1.0, 0.5)] for n in (2, 64)]


@pytest.mark.parametrize("q, sigma, n", SELF_COMPOSED)
def test_the_vectorised_self_composition_is_the_librarys_bit_for_bit(q, sigma, n):
    _needs_pld()
    import numpy as np

    one = pld._pld_one_step(q, sigma)
    for pmf in (one._pmf_remove, one._pmf_add):
        if not pld._dense(pmf):
            pmf = pmf.to_dense_pmf()
        ours, theirs = pld._pmf_self_compose(pmf, n), pmf.self_compose(n)
        assert (ours._lower_loss, ours._infinity_mass) == (theirs._lower_loss, theirs._infinity_mass)
        assert np.array_equal(ours._probs, theirs._probs)


def test_a_history_grown_run_by_run_composes_each_run_once_with_the_librarys_epsilon():
    _needs_pld()
    P.clear_caches()
    runs = [(0.05, 1.0 + 0.05 * i, 5) for i in range(8)] + [(0.05, 1.0, 5)]  # the last: a sigma seen before
    before = pld.PLD_COUNTS["compositions"]
    grown = [P.epsilon(runs[: i + 1], DELTA, accountant="pld") for i in range(len(runs))]
    # a self-composition of each distinct (q, sigma, steps) run and one composition per question, not one
    # per run of the history each time it is asked (36 here)
    assert pld.PLD_COUNTS["compositions"] - before <= 8 + len(runs) + 1
    assert all(a <= b for a, b in itertools.pairwise(grown))
    for i in (2, len(runs) - 1):
        want = _library_pld(numerical._merged(runs[: i + 1]))
        # composition commutes; another order moves only the truncated tails' 1e-15 of mass
        assert grown[i] == pytest.approx(want, rel=1e-9, abs=0)
        assert grown[i] >= want * (1 - 1e-9)  # never below it by more than that


def test_a_sparse_pld_of_a_billion_steps_is_composed_once():
    _needs_pld()
    P.clear_caches()
    before = pld.PLD_COUNTS["compositions"]
    h = [(0.05, 1e6, 10**9)]
    eps = P.epsilon(h, DELTA, accountant="pld")  # the library's self_compose computed 3 ** (10 ** 9) first
    assert pld.PLD_COUNTS["compositions"] - before == 2
    assert 0 < eps <= P.epsilon(h, DELTA)  # both bound it: the smaller is reported


@pytest.mark.parametrize("accountant", ["prv", "pld"])
def test_past_the_most_distinct_runs_rdp_is_reported(accountant, monkeypatch):
    if accountant == "pld":
        _needs_pld()
    P.clear_caches()
    monkeypatch.setattr(P.ACCOUNTANTS.get(accountant), "max_runs", 3)
    h = [(0.05, 1.0 + 0.1 * i, 5) for i in range(4)]
    with pytest.warns(RuntimeWarning, match=f"dp.accountant={accountant}: a history past 3 distinct"):
        assert P.epsilon(h, DELTA, accountant=accountant) == P.epsilon(h, DELTA)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert P.epsilon(h[:3], DELTA, accountant=accountant) < P.epsilon(h[:3], DELTA)
    assert math.isfinite(P.epsilon(h, DELTA, accountant=accountant))


def _composed_pair(a, b):
    return pld._pld_one_step(*a[:2]).self_compose(a[2]), pld._pld_one_step(*b[:2]).self_compose(b[2])


def test_a_composition_the_window_does_not_shorten_is_the_librarys_bit_for_bit(monkeypatch):
    _needs_pld()
    a, b = _composed_pair((0.05, 1.0, 20), (0.01, 0.8, 7))
    monkeypatch.setattr(pld, "_window", lambda x, y: (0, len(x) + len(y) - 2))  # a window of the whole convolution
    ours, theirs = pld._pld_compose(a, b), a.compose(b)
    for x, y in [(ours._pmf_remove, theirs._pmf_remove), (ours._pmf_add, theirs._pmf_add)]:
        assert (x._lower_loss, x._infinity_mass) == (y._lower_loss, y._infinity_mass)
        assert np.array_equal(x._probs, y._probs)
        for delta in (1e-12, 1e-5, 0.05):
            assert pld._pmf_epsilon(x, delta) == pytest.approx(y.get_epsilon_for_delta(delta), rel=1e-12, abs=0)


@pytest.mark.parametrize("a, b", [((0.05, 1.0, 20), (0.01, 0.8, 7)), ((0.05, 0.6, 5), (0.05, 0.5, 5))])
def test_a_composition_over_its_window_is_the_librarys_epsilon(a, b, monkeypatch):
    _needs_pld()
    import dp_accounting

    a, b = _composed_pair(a, b)
    theirs = a.compose(b)

    def linear(*args):
        raise AssertionError("the window was not used")

    monkeypatch.setattr(dp_accounting.pld.pld_pmf.signal, "fftconvolve", linear)
    ours = pld._pld_compose(a, b)  # a circular convolution over the window, no linear one
    for x, y in [(ours._pmf_remove, theirs._pmf_remove), (ours._pmf_add, theirs._pmf_add)]:
        assert np.sum(x._probs) + x._infinity_mass == pytest.approx(np.sum(y._probs) + y._infinity_mass, abs=1e-12)
        # Both are FFTs of different lengths: their rounding (~1e-16 a grid point, negative ones included) is the
        # mass that decides epsilon at delta = 1e-12, where each is within one grid cell of the other; at the deltas
        # runs ask, within 1e-9 of it.
        assert pld._pmf_epsilon(x, 1e-12) == pytest.approx(
            y.get_epsilon_for_delta(1e-12), abs=pld.PLD_VALUE_DISCRETIZATION
        )
        for delta in (1e-5, 0.05):
            assert pld._pmf_epsilon(x, delta) == pytest.approx(y.get_epsilon_for_delta(delta), rel=1e-9, abs=0)


@pytest.mark.parametrize(
    "a, b", [((0.05, 2.0, 3), (0.05, 1.5, 2)), ((0.5, 1.0, 1), (0.05, 1.0, 4)), ((1.0, 4.0, 2), (1.0, 3.0, 1))]
)
def test_the_window_holds_all_but_its_tail_of_the_exact_convolution(a, b):
    _needs_pld()
    import numpy as np

    a, b = _composed_pair(a, b)
    for x, y in [(a._pmf_remove, b._pmf_remove), (a._pmf_add, b._pmf_add)]:
        x, y = np.asarray(x.to_dense_pmf()._probs), np.asarray(y.to_dense_pmf()._probs)
        lo, hi = pld._window(x, y)
        exact = np.convolve(x, y)  # direct sums in float64: no FFT rounding to hide a tail in
        assert 0 <= lo <= hi < len(exact)
        assert np.sum(exact[:lo]) <= pld.WINDOW_TAIL / 2 and np.sum(exact[hi + 1 :]) <= pld.WINDOW_TAIL / 2
        assert hi - lo + 1 < len(exact)  # a window shorter than the whole: the bound is not vacuous

"""dp.accountant's registry (emulator.privacy.registry): the built-in theorems by name, a user's
EpsilonTheorem subclass by package.module:ClassName (tests/plugins/accountant.py), the base class's
max_steps over a theorem that writes only epsilon, and the one-line errors."""

import math

import pytest

from emulator.config import ConfigError, load
from emulator.output.summary import privacy_kind
from emulator.policies.accounting import RdpAccountant
from emulator.privacy import ACCOUNTANTS, AccountantError, epsilon, max_steps, theorem
from emulator.privacy.pld import PldTheorem
from emulator.privacy.prv import PrvTheorem
from emulator.privacy.rdp import RdpTheorem
from nodes.contracts.schema import DPConfig
from nodes.contracts.tasks import ClientTask
from tests.plugins.accountant import UnamplifiedZcdp, zcdp_epsilon

USER = "tests.plugins.accountant:UnamplifiedZcdp"
DELTA = 1e-5


def test_the_built_in_theorems_are_registered_by_name_in_order():
    assert ACCOUNTANTS.names() == ("rdp", "prv", "pld")
    assert [ACCOUNTANTS.get(name) for name in ACCOUNTANTS.names()] == [RdpTheorem, PrvTheorem, PldTheorem]
    assert ACCOUNTANTS.describe() == "rdp | prv | pld | package.module:ClassName"
    assert not any(ACCOUNTANTS.get(name).at_most_rdp for name in ("rdp", USER))
    assert all(ACCOUNTANTS.get(name).at_most_rdp for name in ("prv", "pld"))


def test_a_users_theorem_is_imported_by_its_reference_and_built_once():
    assert ACCOUNTANTS.get(USER) is UnamplifiedZcdp
    assert isinstance(theorem(USER), UnamplifiedZcdp) and theorem(USER) is theorem(USER)
    assert load(None, [f"dp.accountant={USER}"]).dp.accountant == USER


def test_epsilon_asks_the_users_theorem_what_no_theorem_is_asked():
    runs = [(0.05, 1.0, 10), (0.1, 2.0, 0), (0.02, 0.5, 3)]
    assert epsilon(runs, DELTA, accountant=USER) == zcdp_epsilon([runs[0], runs[2]], DELTA)  # no steps: skipped
    assert epsilon([], DELTA, accountant=USER) == 0.0
    assert epsilon([(0.1, 1.0, 0)], DELTA, accountant=USER) == 0.0
    assert epsilon([(0.1, 0.0, 3)], DELTA, accountant=USER) == math.inf
    with pytest.raises(ValueError, match="conversion and orders are the rdp accountant's"):
        epsilon(runs, DELTA, conversion="classic", accountant=USER)


@pytest.mark.parametrize("target, prior", [(8.0, []), (30.0, [(0.05, 1.2, 20)]), (4.0, [(0.05, 1.2, 20)])])
def test_max_steps_is_the_base_classs_exact_search_over_the_users_epsilon(target, prior):
    q, sigma = 0.05, 1.5
    n = max_steps(q, sigma, DELTA, target, history=prior, accountant=USER)
    if (zcdp_epsilon(prior, DELTA) if prior else 0.0) > target:
        assert n == 0
        return
    assert zcdp_epsilon(prior + [(q, sigma, n)], DELTA) <= target < zcdp_epsilon(prior + [(q, sigma, n + 1)], DELTA)
    # rho + 2 sqrt(rho ln(1/delta)) <= target for rho up to (sqrt(ln(1/delta) + target) - sqrt(ln(1/delta)))^2
    log = math.log(1 / DELTA)
    rho = (math.sqrt(log + target) - math.sqrt(log)) ** 2 - sum(s / (2 * z**2) for _, z, s in prior)
    assert n == pytest.approx(rho * 2 * sigma**2, abs=1)
    assert max_steps(q, sigma, DELTA, math.inf, history=prior, accountant=USER, limit=99) == 99
    assert max_steps(q, sigma, DELTA, target, history=prior, accountant=USER, limit=1) == min(n, 1)


def test_the_users_theorem_decides_who_affords_a_step_and_reads_any_ledger():
    dp = DPConfig(epsilon=12.0, q=0.05, sigma=1.0, accountant=USER)
    acc = RdpAccountant(dp, 2)
    acc.charge([ClientTask.dp_sgd(0, dp, steps=4)])
    assert acc.epsilon(0) == zcdp_epsilon([(0.05, 1.0, 4)], DELTA) < 12.0
    # one more step is over its budget under this theorem, not under rdp's, which is not asked in its place
    assert epsilon(acc.ledgers[0].history() + [(0.05, 1.0, 1)], DELTA) < 12.0
    assert not acc.eligible(0) and acc.eligible(1)
    assert acc.reads(USER) and acc.reads("rdp") and acc.reads("pld") and not acc.reads("talaei_gaussian")
    assert privacy_kind({"privacy_mechanism": USER}) == "sample-level"


@pytest.mark.parametrize(
    "value, said",
    [
        ("gdp", "dp.accountant = 'gdp': expected rdp | prv | pld | package.module:ClassName"),
        (
            "tests.plugins.accountant:NotATheorem",
            "dp.accountant = 'tests.plugins.accountant:NotATheorem': tests.plugins.accountant.NotATheorem is not "
            "one; expected a subclass of emulator.privacy.EpsilonTheorem",
        ),
        (
            "tests.plugins.accountant:Missing",
            "dp.accountant = 'tests.plugins.accountant:Missing': tests.plugins.accountant.Missing does not exist; "
            "expected a subclass of emulator.privacy.EpsilonTheorem",
        ),
        (
            "no_such_module:Theorem",
            "dp.accountant = 'no_such_module:Theorem': cannot import no_such_module (ModuleNotFoundError: ",
        ),
        ("tests.plugins.accountant", "dp.accountant = 'tests.plugins.accountant': expected rdp | prv | pld"),
        (
            "tests.plugins.accountant:NoEpsilon",
            "dp.accountant = 'tests.plugins.accountant:NoEpsilon': cannot build it (TypeError: Can't instantiate "
            "abstract class NoEpsilon",
        ),
    ],
)
def test_a_bad_accountant_is_one_line_naming_the_key(value, said):
    with pytest.raises(ConfigError) as e:
        load(None, [f"dp.accountant={value}"])
    assert str(e.value).startswith(said) and len(str(e.value).splitlines()) == 1, str(e.value)
    with pytest.raises(AccountantError) as e:  # asked outside a scenario: the same line
        epsilon([(0.05, 1.0, 3)], DELTA, accountant=value)
    assert str(e.value).startswith(said) and len(str(e.value).splitlines()) == 1, str(e.value)


def test_the_conversion_is_refused_for_a_users_theorem_that_has_none():
    with pytest.raises(ConfigError, match=rf"^dp.conversion = 'classic': expected improved .* dp.accountant={USER}:"):
        load(None, [f"dp.accountant={USER}", "dp.conversion=classic"])


def test_a_theorem_that_breaks_its_contract_is_one_line_naming_the_key():
    nan, raises = "tests.plugins.accountant:ReturnsNan", "tests.plugins.accountant:Raises"
    for ask, said in [
        (lambda: epsilon([(0.05, 1.0, 3)], DELTA, accountant=nan), f"dp.accountant = {nan!r}: epsilon returned nan"),
        (lambda: epsilon([(0.05, 1.0, 3)], DELTA, accountant=raises), f"dp.accountant = {raises!r}: epsilon raised"),
        (lambda: max_steps(0.05, 1.0, DELTA, 3.0, accountant=raises), f"dp.accountant = {raises!r}: max_steps raised"),
    ]:
        with pytest.raises(AccountantError) as e:
            ask()
        assert str(e.value).startswith(said) and len(str(e.value).splitlines()) == 1, str(e.value)
    assert str(e.value).endswith("raised ZeroDivisionError: no bound")  # its message's first line

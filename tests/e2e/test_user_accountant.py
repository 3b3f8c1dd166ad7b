"""A user's accountant end to end: dp.accountant=tests.plugins.accountant:UnamplifiedZcdp, run from the
command line, decides each client's epsilon, the rounds' max_epsilon and when the budget is spent; a
bad reference is one line at load time, and a theorem that breaks its contract one line as the run fails."""

import json

import pytest

from emulator.config import help_text
from emulator.output.results import read_table
from tests.cli import REPO, emulator
from tests.conftest import privacy_ledgers
from tests.plugins.accountant import zcdp_epsilon

USER = "tests.plugins.accountant:UnamplifiedZcdp"
FAST = ["clients.n=4", "dp.tau=2", "data.samples_per_client=60", "workers=1", "output.progress=false"]


def test_a_users_accountant_decides_every_epsilon_and_the_budget(tmp_path):
    r = emulator(REPO, f"dp.accountant={USER}", "dp.epsilon=12", "budget.rounds=4", *FAST, f"output.dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    (run_dir,) = tmp_path.iterdir()
    m = json.loads((run_dir / "run.json").read_text())
    assert m["privacy_mechanism"] == USER and m["scenario"]["dp"]["accountant"] == USER
    # its epsilon of each client's history so far, row by row: 7.79 after a round of 2 steps, 11.6 after two
    # (rdp's is below 1); a third round would take every client to 14.7, past dp.epsilon = 12
    history: dict[int, list[tuple[float, float, int]]] = {}
    rows = sorted(read_table(run_dir, "client_rounds").to_pylist(), key=lambda row: (row["round"], row["client"]))
    for row in rows:
        history.setdefault(row["client"], []).append((row["q"], row["sigma"], row["local_steps"]))
        assert row["epsilon"] == zcdp_epsilon(history[row["client"]], 1e-5), row
    rounds = read_table(run_dir, "rounds").to_pylist()
    assert [x["max_epsilon"] for x in rounds] == [zcdp_epsilon([(0.05, 1.0, 2 * k)], 1e-5) for k in (1, 2)]
    assert m["stop_reason"] == "privacy budget exhausted for every client"
    assert {c: ledger["entries"] for c, ledger in privacy_ledgers(run_dir).items()} == {
        c: [{"q": 0.05, "sigma": 1.0, "steps": 4}] for c in range(4)
    }
    assert f"sample-level (DP-SGD, {USER}): max ε over clients = 11.6" in r.stdout


@pytest.mark.parametrize(
    "ref, said",
    [
        (
            "tests.plugins.accountant:NotATheorem",
            "tests.plugins.accountant.NotATheorem is not one; expected a subclass",
        ),
        ("no_such_module:Theorem", "cannot import no_such_module (ModuleNotFoundError"),
    ],
)
def test_an_accountant_that_cannot_be_loaded_is_one_line_exit_2(tmp_path, ref, said):
    r = emulator(REPO, f"dp.accountant={ref}", *FAST, f"output.dir={tmp_path}")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: dp.accountant = {ref!r}: {said}") and not any(tmp_path.iterdir())


def test_an_accountant_that_breaks_its_contract_fails_the_run_in_one_line(tmp_path):
    ref = "tests.plugins.accountant:Raises"
    r = emulator(REPO, f"dp.accountant={ref}", "budget.rounds=2", *FAST, f"output.dir={tmp_path}")
    (run_dir,) = tmp_path.iterdir()
    line = f"dp.accountant = {ref!r}: epsilon raised ZeroDivisionError: no bound"
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: {line} (traceback in ") and r.stderr.endswith("error.log)\n")
    m = json.loads((run_dir / "run.json").read_text())
    assert m["status"] == "failed" and m["error"].startswith(line)
    assert "tests/plugins/accountant.py" in (run_dir / "error.log").read_text()  # the user's own frame


def test_help_says_dp_accountant_takes_a_users_class():
    (line,) = [x for x in help_text().splitlines() if x.startswith("  dp.accountant = ")]
    assert "| package.module:ClassName (your own emulator.privacy.EpsilonTheorem subclass" in line

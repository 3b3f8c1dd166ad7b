"""User policies without forking (issue 12 item 6): policy=package.module:ClassName, policy_args."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from emulator.config import ConfigError, load
from emulator.results import read_table

REPO = Path(__file__).resolve().parents[2]

POLICY = """
from dataclasses import dataclass

from emulator.policies import Policy, RoundPlan, dp_sgd_tasks


@dataclass
class ReliableFirstOptions:
    k: int = 2
    prior: float = 1.0


class ReliableFirst(Policy):
    name = "reliable_first"
    Options = ReliableFirstOptions

    def configure_round(self, rnd, eligible):
        def rate(i):
            history = self.ctx.clients[i].history
            return (history.arrivals + self.options.prior) / (len(history) + 1)

        chosen = sorted(eligible, key=lambda i: (-rate(i), i))[:self.options.k]
        return RoundPlan(tasks=dp_sgd_tasks(self.cfg, chosen), state={"k": self.options.k})

    def observe_outcomes(self, rnd, outcomes):
        return {"missed": [c for c, o in outcomes.items() if not o.arrived]}


class NotAPolicy:
    pass
"""


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A directory outside the package holding my_policies.py, as the current directory."""
    (tmp_path / "my_policies.py").write_text(POLICY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_policy may add the current directory
    yield tmp_path
    sys.modules.pop("my_policies", None)


def emulator(cwd, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "emulator", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def test_a_user_policy_runs_end_to_end_from_its_own_directory(user_dir):
    r = emulator(
        user_dir,
        "scenario=dropout.yaml",
        "policy=my_policies:ReliableFirst",
        "policy_args.k=3",
        "budget.rounds=3",
        "workers=2",
        "output.dir=runs",
        "output.name=mine",
        "output.progress=false",
    )
    assert r.returncode == 0, r.stderr
    rounds = read_table(user_dir / "runs" / "mine", "rounds").to_pylist()
    assert [r["selected"] for r in rounds] == [3, 3, 3]
    assert all('"k": 3' in r["policy_state"] and '"missed"' in r["policy_state"] for r in rounds)
    chosen = read_table(user_dir / "runs" / "mine", "client_rounds").to_pylist()
    assert sorted(c["client"] for c in chosen if c["round"] == 0) == [0, 1, 2]  # all tied: lowest ids


@pytest.mark.parametrize(
    "args, message",
    [
        (["policy=no_such_module:X"], "policy = 'no_such_module:X': cannot import no_such_module"),
        (
            ["policy=my_policies:NotAPolicy"],
            "policy = 'my_policies:NotAPolicy': my_policies.NotAPolicy is not one; "
            "expected a subclass of emulator.policies.Policy",
        ),
        (["policy=my_policies:Missing"], "my_policies.Missing does not exist"),
        (["policy=my_policies"], "policy = 'my_policies': expected adap_dpfl | ali_dpfl"),
    ],
)
def test_a_policy_that_cannot_be_loaded_is_one_line_exit_2(user_dir, args, message):
    r = emulator(user_dir, *args)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert message in r.stderr and not (user_dir / "runs").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ("policy_args.kk=3", "policy_args.kk: unknown key (the policy's ReliableFirstOptions has k, prior)"),
        ("policy_args.k=three", "policy_args.k = 'three': expected int"),
        ("policy_args.prior=[1]", "policy_args.prior = [1]: expected float"),
    ],
)
def test_policy_args_are_checked_by_the_policys_options(user_dir, override, message):
    with pytest.raises(ConfigError) as e:
        load(None, ["policy=my_policies:ReliableFirst", override])
    assert str(e.value) == message


def test_policy_args_belong_to_user_policies_only(user_dir):
    with pytest.raises(ConfigError, match=r"^policy_args = \{'k': 3\}: expected no keys"):
        load(None, ["policy=fedavg_dp", "policy_args.k=3"])
    cfg = load(None, ["policy=my_policies:ReliableFirst", "policy_args.prior=0.5"])
    assert cfg.policy_args == {"prior": 0.5}

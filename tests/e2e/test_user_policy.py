"""User policies without forking (issue 12 item 6): policy=package.module:ClassName, policy_args."""

import json
import sys

import pytest

from emulator.config import ConfigError, load
from emulator.output.results import read_table
from tests.cli import emulator
from tests.conftest import rows

POLICY = """
from dataclasses import dataclass

from emulator.policies import ClientTask, Policy, RoundPlan, dp_sgd_tasks


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
        return RoundPlan(tasks=dp_sgd_tasks(self.ctx.settings.dp, chosen), state={"k": self.options.k})

    def observe_outcomes(self, rnd, outcomes):
        return {"missed": [c for c, o in outcomes.items() if not o.arrived]}


class NotAPolicy:
    pass


# --- policies that break the contract (issue 48) ---


class Twice(Policy):
    def configure_round(self, rnd, eligible):
        t = dp_sgd_tasks(self.ctx.settings.dp, eligible[:2])
        return RoundPlan(tasks=t + t)


class RaisesInInit(Policy):
    def __init__(self, options, ctx):
        raise RuntimeError("boom in init")


class Raises(Policy):
    def configure_round(self, rnd, eligible):
        raise RuntimeError("boom")


class ReturnsNone(Policy):
    def configure_round(self, rnd, eligible):
        return None


class ReturnsText(Policy):
    def configure_round(self, rnd, eligible):
        return "clients 0 and 1"


class JunkTasks(Policy):
    def configure_round(self, rnd, eligible):
        return RoundPlan(tasks=(0, 1))


class NegativeSteps(Policy):
    def configure_round(self, rnd, eligible):
        dp = self.ctx.settings.dp
        return RoundPlan(tasks=dp_sgd_tasks(dp, [0]) + (ClientTask.dp_sgd(1, dp, steps=-3),))


class NoSuchClient(Policy):
    def configure_round(self, rnd, eligible):
        return RoundPlan(tasks=dp_sgd_tasks(self.ctx.settings.dp, [0, 10000]))


class StateNotJson(Policy):
    def configure_round(self, rnd, eligible):
        return RoundPlan(tasks=dp_sgd_tasks(self.ctx.settings.dp, eligible[:2]), state={"seen": {1, 2}})


class CheckpointNotJson(Policy):
    state_keys = ("seen",)

    def __init__(self, options, ctx):
        super().__init__(options, ctx)
        self.seen = set()

    def configure_round(self, rnd, eligible):
        self.seen.add(rnd)
        return RoundPlan(tasks=dp_sgd_tasks(self.ctx.settings.dp, eligible[:2]))


class WrongShapes(Policy):
    def configure_round(self, rnd, eligible):
        return RoundPlan(tasks=dp_sgd_tasks(self.ctx.settings.dp, eligible[:2]))

    def aggregate(self, rnd, global_weights, results, factors):
        return {k: v.ravel()[:1] for k, v in global_weights.items()}, {}


class RaisesInObserve(ReliableFirst):
    def observe(self, rnd, test_loss, test_accuracy):
        raise KeyError("accuracy")


class Checked(ReliableFirst):
    @classmethod
    def check(cls, options, settings, check):
        check(options.k <= settings.n_clients, "policy_args.k", options.k, f"at most clients.n = {settings.n_clients}")


# --- written against the old contract, Policy(cfg, ctx) ---


class OldStyle(Policy):
    def __init__(self, cfg, ctx):  # the runtime passes the options: the scenario is the deprecated self.cfg
        super().__init__(cfg, ctx)
        self.tau = self.cfg.dp.tau

    def configure_round(self, rnd, eligible):
        return RoundPlan(tasks=dp_sgd_tasks(self.cfg, eligible[:2]), state={"tau": self.tau})


class OldCheck(ReliableFirst):
    @classmethod
    def check(cls, cfg, check):
        pass


class Unsorted(ReliableFirst):
    def configure_round(self, rnd, eligible):
        plan = super().configure_round(rnd, eligible)
        return RoundPlan(tasks=plan.tasks[::-1], state=plan.state)
"""


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A directory outside the package holding my_policies.py, as the current directory."""
    (tmp_path / "my_policies.py").write_text(POLICY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_policy may add the current directory
    yield tmp_path
    sys.modules.pop("my_policies", None)


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


# --- the contract checked at its boundary (issue 48) -------------------------------------------

FAST = [
    "workers=2",
    "clients.n=6",
    "budget.rounds=3",
    "dp.tau=2",
    "data.samples_per_client=60",
    "output.progress=false",
]
BROKEN = [  # (class, what the one line says after "policy my_policies:CLASS.")
    ("Twice", "configure_round selected client 0 twice: expected distinct clients"),
    ("RaisesInInit", "__init__ raised RuntimeError: boom in init"),
    ("Raises", "configure_round raised RuntimeError: boom"),
    ("ReturnsNone", "configure_round returned None: expected a RoundPlan"),
    ("ReturnsText", "configure_round returned 'clients 0 and 1' (a str): expected a RoundPlan"),
    ("JunkTasks", "configure_round returned tasks[0] = 0 (an int): expected a ClientTask"),
    ("NegativeSteps", "configure_round returned tasks[1] with steps = -3 (an int): expected an int in [0, 1000000]"),
    ("NoSuchClient", "configure_round selected client 10000, which was not offered"),
    ("StateNotJson", "configure_round returned RoundPlan.state that is not JSON: seen = {1, 2} (a set)"),
    ("CheckpointNotJson", "state_dict returned a state that is not JSON: policy.seen = {0} (a set)"),
    ("WrongShapes", "aggregate returned weights that hold "),
    ("RaisesInObserve", "observe raised KeyError: 'accuracy'"),
]


@pytest.mark.parametrize("cls, said", BROKEN, ids=[c for c, _ in BROKEN])
def test_a_policy_that_breaks_its_contract_fails_the_run_in_one_line(user_dir, cls, said):
    """One line naming the policy, the method and what it did, exit 1 (the run had started: its directory
    exists); run.json failed with the same text; the traceback in the run directory's error.log. Within
    60 s: a client listed twice hung the server."""
    name = cls.lower()
    r = emulator(user_dir, *FAST, f"policy=my_policies:{cls}", "output.dir=runs", f"output.name={name}", timeout=60)
    run_dir = user_dir / "runs" / name
    line = f"policy my_policies:{cls}.{said}"
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: {line}") and r.stderr.endswith(f"(traceback in runs/{name}/error.log)\n")
    m = json.loads((run_dir / "run.json").read_text())
    assert m["status"] == "failed" and m["error"] == r.stderr.removeprefix("error: ").rstrip("\n")
    log = (run_dir / "error.log").read_text()
    assert log.startswith("Traceback (most recent call last):") and line in log
    if "raised" in said:  # the user's own frame is in it
        assert f"{user_dir / 'my_policies.py'}" in log


def test_tasks_in_any_order_are_sorted_for_the_policy(user_dir):
    runs = {}
    for cls in ("ReliableFirst", "Unsorted"):
        r = emulator(user_dir, *FAST, f"policy=my_policies:{cls}", "output.dir=runs", f"output.name={cls}")
        assert r.returncode == 0, r.stderr
        runs[cls] = {name: rows(user_dir / "runs" / cls, name) for name in ("client_rounds", "events")}
    assert runs["Unsorted"] == runs["ReliableFirst"] and runs["Unsorted"]["client_rounds"]


def test_a_policys_check_gets_its_options_and_the_runs_settings(user_dir):
    assert load(None, ["policy=my_policies:Checked", "clients.n=4", "policy_args.k=4"]).policy_args == {"k": 4}
    with pytest.raises(ConfigError) as e:
        load(None, ["policy=my_policies:Checked", "clients.n=4", "policy_args.k=5"])
    assert str(e.value) == "policy_args.k = 5: expected at most clients.n = 4"


def test_a_check_with_the_old_signature_is_refused_in_one_line(user_dir):
    r = emulator(user_dir, *FAST, "policy=my_policies:OldCheck")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "check(cls, cfg, check) is the old signature" in r.stderr and not (user_dir / "runs").exists()


def test_a_policy_reading_self_cfg_still_runs_and_is_told_once_it_is_deprecated(user_dir):
    """self.cfg, in __init__ too, is the whole scenario for one more release, with one FutureWarning that says
    what to read instead."""
    r = emulator(user_dir, *FAST, "policy=my_policies:OldStyle", "output.dir=runs", "output.name=old")
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if "FutureWarning" in line]
    assert warned == [
        f"{user_dir / 'my_policies.py'}:120: FutureWarning: policy my_policies:OldStyle: self.cfg is deprecated and "
        "will be removed; read self.options and self.ctx.settings (docs/policies.md)"
    ]
    rounds = read_table(user_dir / "runs" / "old", "rounds").to_pylist()
    assert [r["selected"] for r in rounds] == [2, 2, 2] and all('"tau": 2' in r["policy_state"] for r in rounds)

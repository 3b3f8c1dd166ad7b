"""The Policy contract checked where the runtime calls a policy (emulator.policies.boundary, issue 48)."""

import numpy as np
import pytest

from emulator.config import load, policy_settings
from emulator.policies import POLICIES, ClientResult, ClientTask, Policy, RoundPlan, RunContext, dp_sgd_tasks
from emulator.policies.accounting import Excluding
from emulator.policies.boundary import PolicyError, build

N = 6
MODEL = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}


def context(**kw):
    return RunContext(n_clients=N, data_sizes=[10] * N, num_params=9, rounds_budget=10, **kw)


def held(cls, ref="my_policies:P", *overrides):
    """`cls` built as the scenario's `policy=ref` (the reference the errors name: a user's module:Class, or a
    built-in's name)."""
    cfg = load(None, [f"clients.n={N}", *overrides])
    return build(cls, ref, None, context(settings=policy_settings(cfg)))


class Plain(Policy):
    def configure_round(self, rnd, eligible):
        return RoundPlan(tasks=dp_sgd_tasks(self.ctx.settings.dp, list(eligible)[:2]), state={"k": 2})


def raising(method):
    """A Plain whose `method` raises ValueError('bad')."""

    def boom(self, *args):
        raise ValueError("bad\nsecond line")

    return type(f"Raises{method}", (Plain,), {method: boom})


@pytest.mark.parametrize(
    "method, call",
    [
        ("configure_round", lambda p: p.configure_round(0, range(N))),
        ("observe_outcomes", lambda p: p.observe_outcomes(0, {})),
        ("aggregate", lambda p: p.aggregate(0, MODEL, [], {})),
        ("observe", lambda p: p.observe(0, 1.0, 0.5)),
        ("state_dict", lambda p: p.state_dict()),
        ("load_state_dict", lambda p: p.load_state_dict({})),
        ("should_stop", lambda p: p.should_stop()),
    ],
)
def test_an_exception_in_any_method_of_a_user_policy_is_one_policy_error(method, call):
    p = held(raising(method))
    with pytest.raises(PolicyError) as e:
        call(p)
    assert str(e.value) == f"policy my_policies:P.{method} raised ValueError: bad second line"
    assert isinstance(e.value.__cause__, ValueError)  # the traceback the run keeps in error.log


def test_an_exception_in_init_is_one_policy_error():
    with pytest.raises(PolicyError, match=r"^policy my_policies:P\.__init__ raised ValueError: bad second line$"):
        held(raising("__init__"))


def test_a_built_in_policys_exception_is_its_own():
    """The emulator's own errors keep their type (the CLI knows its one-line refusals) and traceback."""
    p = held(raising("observe"), "fedavg_dp")
    with pytest.raises(ValueError, match="bad"):
        p.observe(0, 1.0, 0.5)


def test_built_in_policies_pass_the_checks_and_keep_their_plan():
    p = held(POLICIES["fedavg_dp"], "fedavg_dp")
    inner = p.inner
    plan = inner.configure_round(0, range(N))
    checked = p.configure_round(0, range(N))
    assert checked.tasks == plan.tasks and checked.state == plan.state
    assert p.accountant is inner.accountant and p.ctx is inner.ctx and p.reads_evaluation() == inner.reads_evaluation()
    assert p.aggregate(0, MODEL, [], {})[0] is MODEL


def test_tasks_out_of_order_are_sorted_and_numpy_numbers_made_plain():
    class Reversed(Plain):
        def configure_round(self, rnd, eligible):
            return RoundPlan(
                tasks=tuple(ClientTask.dp_sgd(np.int64(c), self.ctx.settings.dp, lr=np.float32(0.5)) for c in (4, 1))
            )

    plan = held(Reversed).configure_round(0, range(N))
    assert [t.client for t in plan.tasks] == [1, 4] and all(type(t.client) is int for t in plan.tasks)
    assert all(type(t.lr) is float and t.lr == 0.5 for t in plan.tasks)


@pytest.mark.parametrize(
    "tasks, said",
    [
        ("dup", "selected client 1 twice"),
        ((ClientTask.dp_sgd(7, load(None, []).dp),), "selected client 7, which was not offered"),
        ((ClientTask.dp_sgd(1, load(None, []).dp, sigma=float("nan")),), "tasks[0] with sigma = nan"),
        ((ClientTask.dp_sgd(1, load(None, []).dp, q=2.0),), "q = 2.0 (a float): expected a number in [0, 1]"),
        ((ClientTask.dp_sgd(1, load(None, []).dp, output_noise="loud"),), "expected none | gaussian | laplace"),
        ((ClientTask.dp_sgd(True, load(None, []).dp),), "client = True (a bool): expected a client id"),
        ([{"client": 1}], "tasks[0] = {'client': 1} (a dict): expected a ClientTask"),
        ("text", "returned tasks 'text' (a str): expected a tuple of ClientTask"),
    ],
)
def test_a_plan_that_breaks_the_contract_is_refused(tasks, said):
    dp = load(None, []).dp
    if tasks == "dup":
        tasks = (ClientTask.dp_sgd(1, dp), ClientTask.dp_sgd(3, dp), ClientTask.dp_sgd(1, dp))

    class Broken(Plain):
        def configure_round(self, rnd, eligible):
            return RoundPlan(tasks=tasks)

    with pytest.raises(PolicyError, match=r"^policy my_policies:P\.configure_round ") as e:
        held(Broken).configure_round(0, Excluding(N, [0]))
    assert said in str(e.value)


def test_buffered_mode_selects_at_most_the_free_slots():
    p = held(Plain)
    p.ctx.slots = lambda: 1
    with pytest.raises(PolicyError, match=r"configure_round selected 2 clients for 1 free slots"):
        p.configure_round(0, range(N))


def test_membership_in_a_large_offer_is_bisected_not_scanned():
    class Counting(Excluding):
        reads = 0

        def _at(self, k):
            Counting.reads += 1
            return super()._at(k)

    offered = Counting(10**6, [5])
    assert held(Plain).configure_round(0, offered).tasks[1].client == 1
    assert Counting.reads < 100  # a scan would read 10^6


@pytest.mark.parametrize(
    "returned, said",
    [
        (({"w": MODEL["w"]}, {}), "aggregate returned weights that lack b (expected the model's tensors)"),
        (({**MODEL, "b": np.zeros(4, np.float32)}, {}), "hold b as float32[4]: expected float32[3]"),
        (({**MODEL, "b": np.zeros(3)}, {}), "hold b as float64[3]: expected float32[3]"),
        ((MODEL, None), "aggregate returned a state None: expected a dict"),
        (MODEL, "aggregate returned {"),
        ((MODEL, {"x": np.float32(1)}), "aggregate returned a state that is not JSON: x = np.float32(1.0) (a float32)"),
    ],
)
def test_aggregate_must_return_the_models_tensors_and_a_state(returned, said):
    class Aggregates(Plain):
        def aggregate(self, rnd, global_weights, results, factors):
            return returned

    with pytest.raises(PolicyError) as e:
        held(Aggregates).aggregate(0, MODEL, [ClientResult(1, MODEL, 1, 0.0, 0.0)], {1: 1.0})
    assert said in str(e.value)


def test_state_that_json_cannot_hold_is_named_by_its_path():
    class Odd(Plain):
        def observe_outcomes(self, rnd, outcomes):
            return {"per_client": {"3": [1.0, object]}}

    with pytest.raises(PolicyError, match=r"observe_outcomes returned a state that is not JSON: per_client\.3\[1\] = "):
        held(Odd).observe_outcomes(0, {})

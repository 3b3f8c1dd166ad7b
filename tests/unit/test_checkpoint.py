"""A checkpoint is input too: checkpoint.validate checks it against the run before resume uses it."""

import base64
import json

import numpy as np
import pytest

from emulator.config import load
from emulator.output import checkpoint
from emulator.policies import RunContext
from tests.policies import scenario_policy

SHAPES = {"fc.weight": (2, 3), "fc.bias": (2,)}


def expected(**fields):
    """A run of budget.rounds = 5 and clients.n = 3 with rounds 0-4 on disk, whose policy takes any state."""
    return checkpoint.Expected(
        **{
            "rounds": 5,
            "clients": 3,
            "shapes": SHAPES,
            "rounds_on_disk": set(range(5)),
            "load_policy": lambda state: None,
            **fields,
        }
    )


def valid():
    weights = {k: np.zeros(shape, np.float32) for k, shape in SHAPES.items()}
    state = {"next_round": 3, "now": 7.5, "bytes_spent": 1200, "links_bad": [1], "policy": {}}
    return weights, json.loads(checkpoint.snapshot(state))


def test_a_checkpoint_that_fits_passes_at_the_ends_of_every_range():
    weights, state = valid()
    checkpoint.validate(weights, state, expected())
    for edge in ({"next_round": 1}, {"next_round": 5}, {"now": 0.0}, {"bytes_spent": 0}):
        checkpoint.validate(weights, {**state, **edge}, expected())


NAN, INF = float("nan"), float("inf")
# each: (what changes in the state, what the message says)
BAD_STATES = [
    ({"format_version": None}, "format_version = None, expected 3"),
    ({"format_version": 0}, "format_version = 0, expected 3"),
    ({"format_version": 1}, "format_version = 1, expected 3"),
    ({"format_version": True}, "format_version = True, expected 3"),
    ({"format_version": 2}, "format_version = 2, expected 3"),
    ({"format_version": "3"}, "format_version = '3', expected 3"),
    (
        {"extra": 1},
        "state keys: unexpected ['extra']; expected ['bytes_spent', 'links_bad', 'next_round', 'now', 'policy']",
    ),
    ({"next_round": 0}, "next_round = 0, expected an integer in [1, 5] (budget.rounds)"),
    ({"next_round": 6}, "next_round = 6, expected an integer in [1, 5]"),
    ({"next_round": 3.0}, "next_round = 3.0, expected an integer"),
    ({"next_round": True}, "next_round = True, expected an integer"),
    ({"now": NAN}, "now = nan, expected a finite float >= 0"),
    ({"now": INF}, "now = inf, expected a finite float >= 0"),
    ({"now": -1.0}, "now = -1.0, expected a finite float >= 0"),
    ({"now": "7.5"}, "now = '7.5', expected a finite float >= 0"),
    ({"now": 5}, "now = 5, expected a finite float >= 0"),
    ({"bytes_spent": -1}, "bytes_spent = -1, expected an integer >= 0"),
    ({"bytes_spent": 1.5}, "bytes_spent = 1.5, expected an integer >= 0"),
    ({"links_bad": [3]}, "links_bad = [3], expected a sorted list of distinct client ids below 3 (clients.n)"),
    ({"links_bad": [1, 0]}, "links_bad = [1, 0], expected a sorted list of distinct client ids"),
    ({"links_bad": [1, 1]}, "links_bad = [1, 1], expected a sorted list of distinct client ids"),
    ({"links_bad": [False, True]}, "links_bad = [False, True], expected a sorted list of distinct client ids"),
    ({"links_bad": None}, "links_bad = None, expected a sorted list of distinct client ids"),
    ({"policy": []}, "policy = [], expected a JSON object (the policy's state_dict)"),
]


@pytest.mark.parametrize(("change", "message"), BAD_STATES, ids=[str(c) for c, _ in BAD_STATES])
def test_a_state_out_of_its_schema_is_refused_naming_the_key(change, message):
    weights, state = valid()
    with pytest.raises(checkpoint.InvalidCheckpoint) as e:
        checkpoint.validate(weights, {**state, **change}, expected())
    assert str(e.value).startswith(message), e.value


def test_a_state_without_a_version_or_a_key_is_refused_naming_it():
    weights, state = valid()
    for key, message in [
        ("format_version", "format_version = none, expected 3 (written by another version of dpfl-emulator)"),
        ("links_bad", "state keys: missing ['links_bad']; expected ['bytes_spent', 'links_bad', "),
    ]:
        with pytest.raises(checkpoint.InvalidCheckpoint) as e:
            checkpoint.validate(weights, {k: v for k, v in state.items() if k != key}, expected())
        assert str(e.value).startswith(message), e.value


def test_a_next_round_past_the_rounds_on_disk_is_refused():
    weights, state = valid()
    with pytest.raises(
        checkpoint.InvalidCheckpoint,
        match=r"next_round = 3, but the rounds table lacks 2 of rounds 0-2 \(the first: 1\)",
    ):
        checkpoint.validate(weights, state, expected(rounds_on_disk={0}))
    checkpoint.validate(weights, state, expected(rounds_on_disk={0, 1, 2}))  # rows past it are discarded on resume


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"fc.weight": np.zeros((3, 2), np.float32)}, "tensor fc.weight: float32 (3, 2), expected float32 (2, 3)"),
        ({"fc.bias": np.zeros(2, np.float64)}, "tensor fc.bias: float64 (2,), expected float32 (2,)"),
        ({"fc.bias": np.zeros((), np.float32)}, "tensor fc.bias: float32 (), expected float32 (2,)"),
        ({"fc2.bias": np.zeros(2, np.float32)}, "tensors: unexpected ['fc2.bias']; expected ['fc.bias', 'fc.weight']"),
        ({"fc.bias": None}, "tensors: missing ['fc.bias']; expected ['fc.bias', 'fc.weight']"),
    ],
    ids=["transposed", "float64", "scalar", "extra", "missing"],
)
def test_tensors_other_than_the_models_are_refused_naming_them(change, message):
    weights, state = valid()
    weights = {k: v for k, v in {**weights, **change}.items() if v is not None}
    with pytest.raises(checkpoint.InvalidCheckpoint) as e:
        checkpoint.validate(weights, state, expected())
    assert str(e.value) == message


@pytest.mark.parametrize("bad", [NAN, INF, -INF, 2.0**64, -3e38])
def test_a_model_tensor_that_is_not_finite_or_implausibly_large_is_refused_naming_it(bad):
    """A NaN model used to be resumed: every worker then rejected its tasks and the run hung."""
    weights, state = valid()
    weights["fc.weight"][1, 2] = bad
    with pytest.raises(checkpoint.InvalidCheckpoint) as e:
        checkpoint.validate(weights, state, expected())
    if np.isfinite(bad):
        assert (
            str(e.value)
            == f"tensor fc.weight: a value of magnitude {abs(bad):.3g}, expected below 2^64 (checkpoint.MAX_ABS)"
        )
    else:
        assert str(e.value) == f"tensor fc.weight: non-finite values (1 of 6, the first {bad}), expected finite"


def test_a_model_just_below_the_bound_is_taken():
    weights, state = valid()
    weights["fc.bias"][:] = np.nextafter(np.float32(2.0**64), np.float32(0))
    checkpoint.validate(weights, state, expected())


def b64(a) -> str:
    return base64.b64encode(np.asarray(a, "<f4").tobytes()).decode()


def test_a_non_finite_residual_is_refused_naming_its_client_and_tensor():
    weights, state = valid()
    residuals = {"2": {"fc.weight": b64(np.zeros(6)), "fc.bias": b64([0.0, NAN])}}
    checkpoint.validate(weights, {**state, "residuals": {"2": {**residuals["2"], "fc.bias": b64([0, 1])}}}, expected())
    with pytest.raises(checkpoint.InvalidCheckpoint, match=r"^residuals\.2\.fc\.bias: non-finite values \(1 of 2"):
        checkpoint.validate(weights, {**state, "residuals": residuals}, expected())


def test_a_buffered_flights_non_finite_update_is_refused_naming_it():
    from emulator.policies import ClientTask

    weights, state = valid()
    flight = {
        "batch": 2,
        "version_start": 1,
        "task": ClientTask.dp_sgd(1, load(None, []).dp).to_wire(),
        "job": [10, 2, 10, False],
        "reply": {"nbytes": 10, "failure": "", "metrics": {}},
        "tensors": {"fc.weight": b64(np.zeros(6)), "fc.bias": b64([0.0, 0.0])},
        "start": 1.0,
        "cutoff": 2.0,
        "bad_before": False,
    }
    buffered = {"batch": 3, "plan": {}, "refused": "", "denied": False, "flights": [flight]}
    checkpoint.validate(weights, {**state, "buffered": buffered}, expected())
    flight["tensors"]["fc.weight"] = b64([0, 0, INF, 0, 0, 0])
    with pytest.raises(checkpoint.InvalidCheckpoint, match=r"^buffered\.flights\[0\]\.tensors\.fc\.weight: non-finite"):
        checkpoint.validate(weights, {**state, "buffered": buffered}, expected())


def test_a_policy_state_the_policy_cannot_take_is_refused_naming_the_policy():
    def load_policy(state):
        raise KeyError("accountant")

    weights, state = valid()
    with pytest.raises(checkpoint.InvalidCheckpoint, match=r"^policy: KeyError: 'accountant'$"):
        checkpoint.validate(weights, state, expected(load_policy=load_policy))


@pytest.mark.parametrize("released", [{"4": [1.0]}, {"-1": [1.0]}, {"x": []}, [[1.0]] * 4])
def test_an_output_noise_policy_refuses_releases_of_clients_it_does_not_have(released):
    """The releases of the clients that released, by id below clients.n: another id would charge a client the
    run lacks; the list of every client's (checkpoint format 2) is refused too, naming the key."""
    cfg = load(None, ["policy=padpfl", "clients.n=4"])
    p = scenario_policy(cfg, RunContext(n_clients=4, data_sizes=[100] * 4, num_params=50, rounds_budget=10))
    state = p.state_dict()
    p.load_state_dict(state)
    bad = {**state, "accountant": {**state["accountant"], "released": released}}
    with pytest.raises(ValueError, match=r"accountant.released: expected a map of client id \(below 4, clients.n\)"):
        p.load_state_dict(bad)


@pytest.mark.parametrize("ledgers", [{"4": {"entries": []}}, {"-1": {"entries": []}}, {"x": {}}, [{"entries": []}] * 4])
def test_a_dp_sgd_policy_refuses_ledgers_of_clients_it_does_not_have(ledgers):
    """The ledgers of the clients that trained, by id below clients.n: another id, or the old list of every
    client's, is refused naming the key."""
    cfg = load(None, ["policy=ali_dpfl", "clients.n=4"])
    p = scenario_policy(cfg, RunContext(n_clients=4, data_sizes=[100] * 4, num_params=50, rounds_budget=10))
    state = p.state_dict()
    bad = {**state, "accountant": {**state["accountant"], "ledgers": ledgers}}
    with pytest.raises(ValueError, match=r"accountant.ledgers: expected a map of client id \(below 4, clients.n\)"):
        p.load_state_dict(bad)


def save(run_dir, next_round):
    weights, state = valid()
    checkpoint.save(run_dir, weights, checkpoint.snapshot({**state, "next_round": next_round}))


def test_load_falls_back_to_the_previous_checkpoint_when_the_newest_does_not_fit(tmp_path, caplog):
    save(tmp_path, 2)
    save(tmp_path, 3)
    assert checkpoint.load(tmp_path, expected(rounds_on_disk={0, 1, 2}))[1]["next_round"] == 3
    assert not caplog.text
    assert checkpoint.load(tmp_path, expected(rounds_on_disk={0, 1}))[1]["next_round"] == 2
    assert "checkpoint.npz cannot be used (checkpoint.npz: next_round = 3, but the rounds table lacks" in caplog.text
    assert "continuing from checkpoint.prev.npz (round 2)" in caplog.text


def test_load_falls_back_from_a_nan_model_and_refuses_when_both_are(tmp_path, caplog):
    save(tmp_path, 2)
    weights, state = valid()
    weights["fc.weight"][0, 0] = NAN
    checkpoint.save(tmp_path, weights, checkpoint.snapshot({**state, "next_round": 3}))
    assert checkpoint.load(tmp_path, expected())[1]["next_round"] == 2
    assert "checkpoint.npz: tensor fc.weight: non-finite values (1 of 6, the first nan)" in caplog.text
    checkpoint.save(tmp_path, weights, checkpoint.snapshot({**state, "next_round": 4}))
    with pytest.raises(checkpoint.CheckpointError, match=r"checkpoint\.prev\.npz: tensor fc\.weight: non-finite"):
        checkpoint.load(tmp_path, expected())


def test_load_refuses_in_one_line_when_neither_checkpoint_fits(tmp_path):
    save(tmp_path, 2)
    save(tmp_path, 3)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load(tmp_path, expected(rounds=1))
    assert str(e.value) == (
        f"{tmp_path}: no usable checkpoint (checkpoint.npz: next_round = 3, expected an integer in [1, 1] "
        "(budget.rounds); checkpoint.prev.npz: next_round = 2, expected an integer in [1, 1] (budget.rounds))"
    )

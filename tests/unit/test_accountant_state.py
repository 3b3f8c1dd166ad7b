"""What `RdpAccountant` keeps per client between rounds (each client's epsilon, whether it affords a step,
its ledger's plain data) equals what its ledgers give when asked afresh, bit for bit, after rounds of
random charges under every DP-SGD accountant (issue 36: per-round accounting that does not grow with
the clients charged)."""

from __future__ import annotations

import json
import math
import random

import pytest

from emulator.formats import encoded_json
from emulator.policies.accounting import Accountant, RdpAccountant
from emulator.privacy import epsilon
from emulator.privacy.pld import pld_installed
from nodes.contracts.schema import DPConfig
from nodes.contracts.tasks import ClientTask

N = 30
# A few (q, sigma) pairs and step counts, so that clients share histories and epsilons, and some runs merge.
RUNS = [(0.1, 1.0), (0.1, 2.0), (0.05, 1.0), (0.0, 1.0), (0.1, 0.0)]
STEPS = [0, 1, 2, 5, 40]

ACCOUNTANTS = [
    {"accountant": "rdp"},
    {"accountant": "rdp", "conversion": "classic"},
    {"accountant": "prv"},
    pytest.param(
        {"accountant": "pld"}, marks=pytest.mark.skipif(not pld_installed(), reason="dp_accounting not installed")
    ),
]


def random_round(rng: random.Random, dp: DPConfig, noiseless: bool) -> list[ClientTask]:
    """A round's trained tasks: random clients (a client may appear twice), random runs and steps."""
    runs = RUNS if noiseless else RUNS[:-1]
    tasks = []
    for c in rng.choices(range(N), k=rng.randint(0, 6)):
        q, sigma = rng.choice(runs)
        tasks.append(ClientTask.dp_sgd(c, dp, q=q, sigma=sigma, steps=rng.choice(STEPS)))
    return tasks


def fresh_epsilon(acc: RdpAccountant, client: int) -> float:
    ledger = acc.ledgers.get(client)
    history = ledger.history() if ledger is not None else []
    return epsilon(history, acc.dp.delta, acc.dp.conversion, accountant=acc.dp.accountant)


def fresh_history(acc: RdpAccountant) -> dict:
    """RdpAccountant.history as it was computed before it was kept: every ledger with entries, in id order."""
    return {"ledgers": {str(c): led.to_dict() for c, led in sorted(acc.ledgers.items()) if led.entries}}


def assert_as_asked_afresh(acc: RdpAccountant) -> None:
    eps = [fresh_epsilon(acc, c) for c in range(N)]
    assert [acc.epsilon(c) for c in range(N)] == eps
    assert acc.max_epsilon(N) == max(eps) == Accountant.max_epsilon(acc, N)
    for n in (1, N // 2, N - 1):  # the first n clients
        assert acc.max_epsilon(n) == max(eps[:n])
        assert list(acc.eligible_clients(n)) == [c for c in range(n) if acc.eligible(c)]
    assert list(acc.eligible_clients(N)) == [c for c in range(N) if acc.eligible(c)]
    kept = acc.history()
    assert kept == fresh_history(acc)
    assert json.loads(kept["ledgers"].text) == fresh_history(acc)["ledgers"]  # the text the checkpoint writes


@pytest.mark.parametrize("kind", ACCOUNTANTS)
@pytest.mark.parametrize("seed", range(3))
def test_kept_answers_equal_the_ledgers_asked_afresh_round_after_round(kind, seed):
    rng = random.Random(seed)
    noiseless = kind["accountant"] == "rdp"  # inf epsilon too (PRV's and PLD's grids are sized for finite ones)
    targets = [math.inf, 2.0, 0.5] if kind["accountant"] == "rdp" else [math.inf, 3.0]
    dp = DPConfig(epsilon=targets[0], q=0.1, sigma=1.0, **kind)
    acc = RdpAccountant(dp, N)
    assert_as_asked_afresh(acc)
    for rnd in range(12):
        acc.target = targets[rnd % len(targets)]  # a policy may move the target: kept answers follow it
        acc.charge(random_round(rng, dp, noiseless))
        assert_as_asked_afresh(acc)
    again = RdpAccountant(dp, N)
    again.target = acc.target
    again.load_history(json.loads(encoded_json.dumps(acc.history())))  # as a checkpoint gives it back
    assert_as_asked_afresh(again)
    assert [again.epsilon(c) for c in range(N)] == [acc.epsilon(c) for c in range(N)]
    assert list(again.eligible_clients(N)) == list(acc.eligible_clients(N))
    assert again.history() == acc.history()


def test_a_kept_history_is_a_snapshot_later_charges_do_not_change():
    dp = DPConfig(epsilon=math.inf, q=0.1, sigma=1.0)
    acc = RdpAccountant(dp, N)
    acc.charge([ClientTask.dp_sgd(3, dp, steps=2)])
    taken = acc.history()
    text, kept_text = json.dumps(taken, sort_keys=True), taken["ledgers"].text
    acc.charge([ClientTask.dp_sgd(3, dp, steps=5), ClientTask.dp_sgd(4, dp, sigma=2.0)])
    assert json.dumps(taken, sort_keys=True) == text and taken["ledgers"].text == kept_text
    assert acc.history()["ledgers"]["3"] == {"entries": [{"q": 0.1, "sigma": 1.0, "steps": 7}]}
    assert set(acc.history()["ledgers"]) == {"3", "4"}


def test_clients_that_spent_the_same_epsilon_are_counted_once():
    """max_epsilon's work is the distinct epsilons': 20 clients charged alike are one."""
    dp = DPConfig(epsilon=math.inf, q=0.1, sigma=1.0)
    acc = RdpAccountant(dp, N)
    acc.charge([ClientTask.dp_sgd(c, dp, steps=3) for c in range(20)])
    acc.charge([ClientTask.dp_sgd(0, dp, steps=3)])
    assert len(acc._spent_count) == 2 and sorted(acc._spent_count.values()) == [1, 19]
    assert acc.max_epsilon(N) == acc.epsilon(0) > acc.epsilon(1)
    acc.charge([ClientTask.dp_sgd(c, dp, steps=3) for c in range(1, 20)])
    assert dict(acc._spent_count) == {acc.epsilon(0): 20}


def test_a_moved_target_is_asked_afresh_of_clients_not_charged_since():
    dp = DPConfig(epsilon=math.inf, q=0.1, sigma=1.0)
    acc = RdpAccountant(dp, N)
    acc.charge([ClientTask.dp_sgd(0, dp, steps=5)])
    next_step = epsilon([(0.1, 1.0, 6)], dp.delta)  # client 0's epsilon one step on
    for target, client_0_eligible in [(2 * next_step, True), (next_step / 2, False), (2 * next_step, True)]:
        acc.target = target
        assert (0 in acc.eligible_clients(N)) is client_0_eligible
        assert list(acc.eligible_clients(N)) == [c for c in range(N) if acc.eligible(c)]

"""A million registered clients (issue 36 item 4): the server holds per-client objects only for the
clients it has selected, and answers the per-round questions (who is eligible, the most epsilon spent)
from those; every lazily held answer equals the one the old eager, one-object-per-client state gave.

Memory is measured with tracemalloc on the objects themselves, never with timings or page counts."""

from __future__ import annotations

import math
import random
import tracemalloc

import numpy as np
import pyarrow.parquet as pq
import pytest

from emulator.config import load, round_settings
from emulator.output import results
from emulator.policies.accounting import Accountant, Excluding, RdpAccountant, ReleaseAccountant
from emulator.policies.population import PopulationAccountant
from emulator.rounds.round import play_round
from emulator.run.lifecycle import _new_policy
from emulator.run.round_loop import EmulatedSystem
from emulator.run.state import RunState, checkpoint_state, links_bad
from emulator.timemodel.resources import ClientResources, Resources, build_resources
from nodes.contracts.schema import DPConfig
from nodes.contracts.tasks import ClientTask
from nodes.transport.dispatch import Reply

MILLION = 10**6
# The columns of a million clients (four float64 draws) and their sizes: 40 MB. One Python object per
# client, as before, took hundreds of bytes each: far above this bound.
MILLION_BYTES = 100 * 2**20
WEIGHTS = {"w": np.zeros((10, 60), np.float32), "b": np.zeros(10, np.float32)}


def traced_peak(fn):
    """fn()'s result and the peak of the memory it allocated (tracemalloc's count)."""
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def million_system(*overrides):
    cfg = load(None, [f"clients.n={MILLION}", "clients.per_round=50", "clients.select=uniform", *overrides])
    sizes = [200] * MILLION

    def build():
        system = EmulatedSystem.build(cfg, sizes, RunState())
        policy, budgets = _new_policy(cfg, sizes, system, WEIGHTS)
        return system, policy, budgets

    (system, policy, budgets), peak = traced_peak(build)
    return cfg, system, policy, budgets, peak


def train(rnd, frames):
    update = {"model": WEIGHTS, "metrics": {"steps": 5, "train_loss": 0.5, "update_norm": 1.0}}
    return {c: Reply(client=c, message=dict(update), nbytes=3000) for c, _ in frames}


def play(cfg, system, policy, budgets, rnd, weights):
    """Round `rnd` as the run's loop plays it, its outcomes logged for the next round's plan."""
    record = play_round(
        rnd, weights, settings=round_settings(cfg), policy=policy, clock=system.clock, budgets=budgets,
        train=train, evaluate=None, compression=system.compression, impact=system.impact,
    )  # fmt: skip
    system.outcomes.extend(record.outcomes.values())
    return record


def test_a_million_client_run_holds_objects_only_for_the_clients_it_selected():
    cfg, system, policy, budgets, peak = million_system("links.dropout.model=gilbert_elliott", "dp.epsilon=3")
    assert peak < MILLION_BYTES
    assert system.resources.made == {} and policy.accountant.ledgers == {}
    selected: set[int] = set()

    def rounds(played):
        w = WEIGHTS
        for rnd in played:
            record = play(cfg, system, policy, budgets, rnd, w)
            selected.update(t.client for t in record.tasks)
            record.rows(cfg.data)
            state = checkpoint_state(rnd + 1, system.clock.now, budgets, system.resources, policy, system.compression)
            w = record.weights
        return record, state

    rounds([0])  # its impact factors, computed once for the run, are an array of a million
    (record, state), peak = traced_peak(lambda: rounds([1, 2]))
    assert peak < 4 * 2**20  # a round's work is its 50 clients'
    assert len(selected) == 150
    assert set(system.resources.made) == selected >= set(policy.accountant.ledgers)  # a lost download trains not
    assert set(record.epsilon) == {t.client for t in record.tasks}
    assert record.max_epsilon == max(record.epsilon.values()) > 0  # the charged lead; the rest spent 0
    assert len(state) < 200 * len(selected)  # the checkpoint holds the selected clients', not a million entries


def charged(accountant, n, rng, target_steps):
    """Charge random clients random numbers of steps (some well past what the target affords)."""
    for c in rng.sample(range(n), k=n // 3):
        accountant.charge([ClientTask.dp_sgd(c, accountant.dp, steps=rng.choice(target_steps))])
    return accountant


@pytest.mark.parametrize("epsilon", [math.inf, 2.0, 1e-3])
@pytest.mark.parametrize("seed", range(4))
def test_rdp_accountant_answers_as_asking_every_client_would(epsilon, seed):
    """eligible_clients and max_epsilon, from the charged clients only, equal Accountant's O(n) definitions."""
    rng, n = random.Random(seed), 40
    dp = DPConfig(epsilon=epsilon, q=0.1, sigma=1.0)
    acc = charged(RdpAccountant(dp, n), n, rng, [1, 5, 50, 400])
    assert list(acc.eligible_clients(n)) == list(Accountant.eligible_clients(acc, n))
    assert acc.max_epsilon(n) == Accountant.max_epsilon(acc, n)
    never = next(c for c in range(n) if c not in acc.ledgers)
    assert acc.epsilon(never) == 0.0 and never not in {r["client"] for r in acc.client_rows()}
    again = RdpAccountant(dp, n)
    again.load_history(acc.history())
    assert list(again.client_rows()) == list(acc.client_rows())


def test_the_population_accountant_answers_as_asking_every_client_would():
    dp = DPConfig(epsilon=1.0)
    acc = PopulationAccountant(dp, 30, "poisson", 0.1, 3, 1.0)
    for _ in range(3):
        assert acc.max_epsilon(30) == Accountant.max_epsilon(acc, 30)
        assert list(acc.eligible_clients(30)) == list(Accountant.eligible_clients(acc, 30))
        acc.charge([ClientTask.dp_sgd(0, dp)])
    acc.target = 0.0
    assert list(acc.eligible_clients(30)) == list(Accountant.eligible_clients(acc, 30)) == []


@pytest.mark.parametrize("target", [math.inf, 2.0, 0.5])
@pytest.mark.parametrize("seed", range(4))
def test_the_release_accountant_answers_as_asking_every_client_would_and_keeps_only_the_releases(target, seed):
    """Output noise (fu_tuning, padpfl): the clients that released are asked; the others spent 0 and are eligible.
    Its checkpoint holds the releases by client id, and a client never released is never asked."""
    rng, n = random.Random(seed), 40
    asked: list[int] = []

    def epsilon_of(client, scales):  # a Gaussian-like composition: eps grows as releases add up
        asked.append(client)
        return sum(1 / s for s in scales)

    acc = ReleaseAccountant(target, n, epsilon_of, "test")
    for c in rng.sample(range(n), k=n // 3):
        acc.charge(
            [
                ClientTask(client=c, steps=1, lr=0.1, sigma=0.0, clip=1.0, q=1.0, output_noise_scale=s)
                for s in rng.choices([0.5, 1.0, 4.0], k=rng.randint(1, 3))
            ]
        )
    released = set(acc.released)
    asked.clear()
    eligible, most = list(acc.eligible_clients(n)), acc.max_epsilon(n)
    assert set(asked) <= released  # never-released clients are not asked
    assert eligible == list(Accountant.eligible_clients(acc, n)) and most == Accountant.max_epsilon(acc, n)
    assert set(acc.history()["released"]) == {str(c) for c in released}
    again = ReleaseAccountant(target, n, epsilon_of, "test")
    again.load_history(acc.history())
    assert list(again.client_rows()) == list(acc.client_rows()) and [r["client"] for r in acc.client_rows()] == sorted(
        released
    )


@pytest.mark.parametrize("seed", range(20))
def test_excluding_is_the_list_it_stands_for(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 60)
    excluded = sorted(rng.sample(range(n), rng.randint(0, n)))
    kept = [c for c in range(n) if c not in excluded]
    view = Excluding(n, excluded)
    assert len(view) == len(kept) and list(view) == kept
    assert [view[k] for k in range(len(kept))] == kept and view[::2] == kept[::2]
    assert [view[np.int64(k)] for k in range(len(kept))] == kept  # as a numpy draw indexes it
    assert all((c in view) == (c in kept) for c in range(-1, n + 1))


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        [
            "availability.model=diurnal",
            "links.down_bps.kind=lognormal",
            "links.down_bps.median=1e6",
            "links.schedule=[{t: 5, factor: 0.5}]",
        ],
        ["compute.schedule=[{t: 1, factor: 2}]", "links.dropout.model=gilbert_elliott"],
    ],
)
def test_a_client_made_when_first_asked_for_is_the_one_made_with_all_the_others(overrides):
    """Made in any order, alone or in a pass over all (iteration), a client's resources are the same."""
    cfg = load(None, ["clients.n=30", *overrides])
    lazy = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, 7)
    every = list(build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, 7))
    for c in random.Random(0).sample(range(30), 30):
        assert described(lazy[c]) == described(every[c])
    assert lazy[5] is lazy[5] and lazy[-1] is lazy[29]


def described(r: ClientResources):
    times = [0.0, 3.0, 7.5, 40_000.0]
    return (
        r.client_id,
        r.latency_s,
        r.step_s,
        r.trace,
        [r.download_time(10**5, t) for t in times],
        [r.upload_time(10**5, t) for t in times],
        [r.compute_time(3, t) for t in times],
        [(r.available(t), r.availability.next_unavailable(t), r.availability.next_available(t)) for t in times],
        r.loss.outages,
    )


def test_clients_parquet_is_written_in_row_groups_with_every_row(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "CLIENT_ROWS", 4)
    rows = [
        {"client": i, "data_size": 10 + i, "down_bps": 1e6, "up_bps": 2e6, "latency_s": 0.1, "step_s": 0.2, "trace": ""}
        for i in range(10)
    ]
    chunks = ({k: [r[k] for r in rows[at : at + 4]] for k in rows[0]} for at in range(0, 10, 4))
    results.RunWriter(tmp_path).write_clients(chunks)
    assert pq.ParquetFile(tmp_path / results.CLIENTS_FILE).metadata.num_row_groups == 3
    nulls = dict.fromkeys(results.BATTERY_COLUMNS)  # no battery modelled
    assert results.read_clients(tmp_path).to_pylist() == [{**r, **nulls} for r in rows]


@pytest.mark.parametrize("traced", [False, True])
def test_the_clients_table_from_the_arrays_is_every_views_row(traced):
    """Without link traces the clients table comes from the drawn arrays: the rows each view gives."""
    from emulator.policies.system import OutcomeLog, client_infos

    trace = ["links.trace.down=[traces/ATT-LTE-driving-2016.down]"] if traced else []
    cfg = load(None, ["clients.n=23", "links.down_bps={kind: lognormal, median: 8.0e6, sigma: 0.8}", *trace])
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, 23, seed=3)
    views = client_infos(resources, list(range(100, 123)), OutcomeLog(23))
    chunks = list(views.table_columns(10))
    assert [len(c["client"]) for c in chunks] == [10, 10, 3]
    got = [dict(zip(c, values, strict=True)) for c in chunks for values in zip(*c.values(), strict=True)]
    assert [{k: v.item() if hasattr(v, "item") else v for k, v in row.items()} for row in got] == [
        v.table_row() for v in views
    ]
    assert traced == any(row["trace"] for row in got)


@pytest.mark.parametrize("model", ["none", "bernoulli", "gilbert_elliott"])
def test_the_checkpoints_bad_links_are_every_made_link_in_the_bad_state(model):
    """links_bad looks among the made links only under Gilbert-Elliott's model: under the others none is bad."""
    cfg = load(None, ["clients.n=50", f"links.dropout.model={model}", "links.dropout.p=0.3"])
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, 50, seed=3)
    rng = np.random.default_rng(0)
    for c in rng.choice(50, size=200):
        resources[int(c)].loss.lost("down", 0.0, 1.0, rng)
    every = sorted(c for c, r in resources.made.items() if r.loss.bad)
    assert links_bad(resources) == every
    assert (len(every) > 0) == (model == "gilbert_elliott")


@pytest.mark.parametrize("overrides", [["policy=oort"], ["impact.kind=reliability"]], ids=["oort", "reliability"])
def test_policies_reading_every_clients_history_make_only_the_selected_clients(overrides, monkeypatch):
    """oort (fresh against seen clients) and impact kind=reliability (arrival rates) read every client's history
    each round: from the outcome log, with no view made of a client never selected, nor its resources."""
    made: list[int] = []
    make = Resources._make
    monkeypatch.setattr(Resources, "_make", lambda self, i: made.append(i) or make(self, i))
    cfg = load(None, ["clients.n=20000", "clients.per_round=50", "clients.select=uniform", *overrides])
    sizes = [200] * cfg.clients.n
    system = EmulatedSystem.build(cfg, sizes, RunState())
    policy, budgets = _new_policy(cfg, sizes, system, WEIGHTS)
    made.clear()  # the start-up's pass over every client (the budgets') is once a run
    selected: set[int] = set()
    w = WEIGHTS
    for rnd in range(3):
        record = play(cfg, system, policy, budgets, rnd, w)
        selected.update(t.client for t in record.tasks)
        w = record.weights
    assert len(selected) > 50 and set(system.resources.made) == selected
    assert sorted(made) == sorted(selected)  # each made once, when first selected


def first_round_of_a_thousand(*overrides):
    cfg = load(None, ["clients.n=1000", "clients.per_round=50", "clients.select=uniform", *overrides])
    system = EmulatedSystem.build(cfg, [200] * 1000, RunState())
    play(cfg, system, *_new_policy(cfg, [200] * 1000, system, WEIGHTS), 0, WEIGHTS)


def million_rounds(cfg, system, policy, budgets, played, monkeypatch):
    """Play `played` rounds; (the clients selected, the ids whose resources were made meanwhile, the peak)."""
    made: list[int] = []
    make = Resources._make
    monkeypatch.setattr(Resources, "_make", lambda self, i: made.append(i) or make(self, i))
    selected: set[int] = set()

    def rounds():
        w = WEIGHTS
        for rnd in played:
            record = play(cfg, system, policy, budgets, rnd, w)
            selected.update(t.client for t in record.tasks)
            w = record.weights

    _, peak = traced_peak(rounds)
    return selected, made, peak


@pytest.mark.parametrize(
    "overrides",
    [
        ["policy=oort"],
        ["policy=fedcs", "fedcs.request_clients=200", "fedcs.estimate=nominal", "round.deadline_s=1e6"],
        ["policy=udp_crd", "dp.epsilon=50"],
    ],
    ids=["oort", "fedcs", "udp_crd"],
)
def test_a_million_client_round_of_oort_fedcs_or_udp_crd_is_the_work_of_its_clients(overrides, monkeypatch):
    """oort (fresh against seen clients, without a list of the fresh), fedcs (asking request_clients, not a
    share of a million) and udp_crd (charging every client through one unit-std list): a round's memory and
    the resources it makes are its clients'."""
    cfg, system, policy, budgets, _ = million_system(*overrides)
    million_rounds(cfg, system, policy, budgets, [0], monkeypatch)  # the run's once-only arrays of a million
    selected, made, peak = million_rounds(cfg, system, policy, budgets, [1, 2], monkeypatch)
    assert peak < 4 * 2**20 and len(selected) > 50
    assert len(made) <= (200 if cfg.policy == "fedcs" else 50) * 2  # the clients asked or selected, once each
    if cfg.policy == "udp_crd":
        assert len(policy.accountant.unit_scales) == 3  # every client charged in each of the three rounds


def test_a_million_client_round_under_diurnal_availability_asks_no_client_it_does_not_select(monkeypatch):
    """Who is available comes from every client's windows at once (emulator.timemodel.available_now): the round
    makes the resources of its 50 selected clients only, and offers the policy a sequence, not a list of a million."""
    first_round_of_a_thousand("availability.model=diurnal")  # the modules a round imports, imported
    cfg, system, policy, budgets, peak = million_system("availability.model=diurnal")
    offers: list[object] = []
    configure = type(policy).configure_round
    monkeypatch.setattr(type(policy), "configure_round", lambda self, r, e: offers.append(e) or configure(self, r, e))
    selected, made, rounds_peak = million_rounds(cfg, system, policy, budgets, [0, 1, 2], monkeypatch)
    assert sorted(made) == sorted(selected) and len(selected) == 150
    assert all(not isinstance(e, list) and 0.2 * MILLION < len(e) < 0.8 * MILLION for e in offers)
    assert peak < 2 * MILLION_BYTES  # the drawn columns, and the windows as arrays, indexed at start
    assert rounds_peak < 4 * 2**20  # round 0 too: the index of who is available was built with the clock


@pytest.mark.parametrize("traced", [False, True])
def test_the_slowest_round_from_the_arrays_is_the_slowest_clients(traced):
    """Budgets' round-time estimate on the drawn arrays equals the max over every client's own times."""
    trace = ["links.trace.up=[traces/ATT-LTE-driving-2016.up]"] if traced else []
    links = [
        "links.down_bps={kind: lognormal, median: 8.0e6, sigma: 0.8}",
        "links.latency_s={kind: uniform, low: 0, high: 1}",
    ]
    cfg = load(None, ["clients.n=500", *links, "compute.step_s={kind: lognormal, median: 0.2, sigma: 0.5}", *trace])
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, 500, seed=8)
    each = [r.download_time(70_001, 0.0) + r.compute_time(7, 0.0) + r.upload_time(5_003, 0.0) for r in resources]
    assert resources.slowest_round(70_001, 7, 5_003) == max(each)

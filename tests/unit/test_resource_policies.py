"""Resource-aware policies (issue 12 item 5): fedcs and oort select from the per-client view.

Expected selections are worked out by hand from the papers' rules on made-up clients."""

import math

import pytest

from emulator.config import ConfigError, load
from emulator.policies import ClientOutcome, OutcomeLog, RunContext
from emulator.policies.fedcs import admit_within, request
from emulator.policies.oort import speed_factor
from emulator.policies.system import ClientInfo, client_infos
from emulator.timemodel.resources import build_resources
from nodes.contracts.rng import stream
from tests.policies import scenario_policy

MB = 10**6


def clients(log, step_s, sizes=None, up_bps=8e6):
    """Clients with 0 latency, 8 Mbit/s both ways (1 s per MB) and the given seconds per step."""
    sizes = sizes or [100] * len(step_s)
    return [
        ClientInfo(
            client=i,
            data_size=sizes[i],
            down_bps=8e6,
            up_bps=up_bps,
            latency_s=0.0,
            step_s=s,
            trace="",
            history=log.history(i),
        )
        for i, s in enumerate(step_s)
    ]


def make(name, step_s, *overrides, sizes=None, log=None):
    log = log or OutcomeLog(len(step_s))
    cfg = load(None, [f"policy={name}", f"clients.n={len(step_s)}", "dp.tau=10", *overrides])
    view = clients(log, step_s, sizes)
    return scenario_policy(
        cfg,
        RunContext(
            n_clients=len(step_s),
            data_sizes=[c.data_size for c in view],
            num_params=10,
            rounds_budget=5,
            task_bytes=MB,
            clients=view,
        ),
    ), log


def chosen(plan):
    return [t.client for t in plan.tasks]


# --- fedcs ----------------------------------------------------------------------------------


def test_fedcs_admits_the_fastest_that_fit_the_deadline():
    # round time = 1 s down + 10 steps + 1 s up: 2.5, 4, 7, 3 s
    p, _ = make("fedcs", [0.05, 0.2, 0.5, 0.1], "round.deadline_s=5", "clients.per_round=3")
    assert chosen(p.configure_round(0, [0, 1, 2, 3])) == [0, 1, 3]
    assert chosen(p.configure_round(0, [1, 2])) == [1]  # only who is eligible
    p, _ = make("fedcs", [0.05, 0.2, 0.5, 0.1], "round.deadline_s=5", "clients.per_round=2")
    assert chosen(p.configure_round(0, [0, 1, 2, 3])) == [0, 3]  # up to per_round, fastest first
    p, _ = make("fedcs", [0.05, 0.2, 0.5, 0.1], "round.deadline_s=5", "fedcs.deadline_s=3", "clients.per_round=4")
    assert chosen(p.configure_round(0, [0, 1, 2, 3])) == [0, 3]  # its own target first


def test_fedcs_with_a_shared_uplink_every_admission_slows_the_uploads():
    log = OutcomeLog(3)
    view = clients(log, [0.0, 0.0, 0.0])  # 1 s down, no compute; the upload shares 8 Mbit/s
    # one client: 1 + 1 = 2 s; two: 1 + 2 = 3 s each; three: 1 + 3 = 4 s each
    assert admit_within(view, 3, 3.0, MB, 0, 8e6) == [0, 1]
    assert admit_within(view, 3, 4.0, MB, 0, 8e6) == [0, 1, 2]
    assert admit_within(view, 3, 4.0, MB, 0, 0.0) == [0, 1, 2]  # unlimited: 2 s each
    assert admit_within(view, 3, 1.0, MB, 0, 0.0) == [0]  # none fits: the fastest one still runs


def test_fedcs_estimates_from_what_clients_report_not_from_their_means(tmp_path):
    # client 0 averages 8 Mbit/s but has been at 1 Mbit/s since t = 2; client 1 averages 4 and is at 3
    (tmp_path / "a.csv").write_text("t_s,bps\n0,15e6\n2,1e6\n4,0\n")
    (tmp_path / "b.csv").write_text("t_s,bps\n0,5e6\n2,3e6\n4,0\n")
    traces = f"[{tmp_path / 'a.csv'}, {tmp_path / 'b.csv'}]"
    picks = {}
    for estimate in ("nominal", "reported"):
        cfg = load(
            None,
            [
                "policy=fedcs",
                "clients.n=2",
                "clients.per_round=1",
                f"fedcs.estimate={estimate}",
                f"links.trace.down={traces}",
                f"links.trace.up={traces}",
                "links.trace.assign=round_robin",
                "round.deadline_s=100",
            ],
        )
        view = client_infos(
            build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, 0), [100, 100], OutcomeLog(2)
        )
        ctx = RunContext(
            n_clients=2, data_sizes=[100, 100], num_params=10, rounds_budget=5, task_bytes=MB, clients=view
        )
        ctx.now = lambda: 3.0
        picks[estimate] = chosen(scenario_policy(cfg, ctx).configure_round(0, [0, 1]))
    assert picks == {"nominal": [0], "reported": [1]}


def test_fedcs_asks_a_random_fraction_of_the_eligible_each_round():
    eligible = [1, 2, 4, 5, 7, 9]
    assert request(eligible, 1.0, stream(0, "fedcs", 0)) == eligible
    asked = [request(eligible, 0.5, stream(0, "fedcs", rnd)) for rnd in range(20)]
    assert all(len(a) == 3 and set(a) <= set(eligible) and a == sorted(set(a)) for a in asked)
    assert len({tuple(a) for a in asked}) > 5  # a new draw each round
    assert request(eligible, 1e-6, stream(0, "fedcs", 0)) != []  # at least one
    # the policy admits only among those asked: the fastest eligible client (0) is asked in some rounds only
    p, _ = make(
        "fedcs", [0.01, 0.2, 0.2, 0.2], "round.deadline_s=50", "clients.per_round=1", "fedcs.request_fraction=0.5"
    )
    firsts = {rnd: chosen(p.configure_round(rnd, [0, 1, 2, 3])) for rnd in range(12)}
    seed = p.ctx.settings.seed
    expected = {rnd: [0] if 0 in request([0, 1, 2, 3], 0.5, stream(seed, "fedcs", rnd)) else None for rnd in firsts}
    assert all(firsts[r] == [0] for r in firsts if expected[r]) and any(firsts[r] != [0] for r in firsts)


def test_fedcs_tasks_are_the_scenarios_dp_sgd():
    p, _ = make("fedcs", [0.1, 0.1], "dp.sigma=1.3", "dp.lr=0.2")
    t = p.configure_round(0, [0, 1]).tasks[0]
    assert (t.steps, t.sigma, t.lr, t.clip, t.q) == (10, 1.3, 0.2, p.ctx.settings.dp.clip, p.ctx.settings.dp.q)


# --- oort -----------------------------------------------------------------------------------


def outcome(rnd, client, kind="arrived", loss=1.0, duration=2.0):
    arrived = kind == "arrived"
    return ClientOutcome(
        round=rnd,
        client=client,
        outcome=kind,
        t_down_start=0.0,
        t_down_end=1.0,
        t_compute_end=1.5,
        t_up_end=duration if arrived else math.nan,
        train_loss=loss if arrived else math.nan,
    )


def test_oort_speed_factor_is_eq_2():
    assert speed_factor(4.0, 2.0, 2.0) == 0.25 and speed_factor(1.0, 2.0, 2.0) == 1.0
    assert speed_factor(1e9, math.inf, 2.0) == 1.0  # no preferred duration: no penalty


def test_oort_round_0_explores_uniformly_from_its_stream():
    p, _ = make("oort", [0.1] * 6, "clients.per_round=2", "seed=7")
    plan = p.configure_round(0, list(range(6)))
    expected = sorted(stream(7, "oort", 0).choice(list(range(6)), size=2, replace=False).tolist())
    assert chosen(plan) == expected and plan.state["explored"] == 2
    assert chosen(p.configure_round(0, list(range(6)))) == expected  # a pure function of seed and round


def test_oort_exploits_utility_penalising_slow_and_unreliable_clients():
    log = OutcomeLog(5)
    # utility = |B| x loss x (T/t)^2 if t > T, T = deadline 4 s; x 0.5 per miss in the last 5 rounds
    log.extend(
        [
            outcome(0, 0, loss=1.0),  # 100 x 1.0                 = 100
            outcome(0, 1, loss=2.0, duration=8.0),  # 100 x 2.0 x (4/8)^2      = 50
            outcome(0, 2, loss=1.5),  # 100 x 1.5 x 0.5 (round 1) = 75
            outcome(1, 2, kind="lost_up"),
            outcome(0, 3, kind="late"),
        ]
    )  # no loss yet: the mean, 100 x 1.5 x 0.5  = 75
    p, _ = make(
        "oort", [0.1] * 5, "clients.per_round=3", "round.deadline_s=4", "oort.explore=0", "oort.explore_min=0", log=log
    )
    plan = p.configure_round(2, [0, 1, 2, 3])
    assert plan.state["explored"] == 0
    assert chosen(plan) == [0, 2, 3]  # 100, then 75 (ids 2, 3); 50 is left out
    p, _ = make(
        "oort",
        [0.1] * 5,
        "clients.per_round=3",
        "round.deadline_s=4",
        "oort.explore=0",
        "oort.explore_min=0",
        "oort.penalty=1",
        log=log,
    )
    assert chosen(p.configure_round(2, [0, 1, 2, 3])) == [0, 2, 3]  # no miss penalty: 150, 150, 100 over 50


def test_oort_fills_from_the_unexplored_when_the_explored_are_too_few():
    log = OutcomeLog(4)
    log.extend([outcome(0, 0)])
    p, _ = make("oort", [0.1] * 4, "clients.per_round=3", "oort.explore=0", "oort.explore_min=0", log=log)
    plan = p.configure_round(1, [0, 1, 2, 3])
    assert 0 in chosen(plan) and len(chosen(plan)) == 3 and plan.state["explored"] == 2


@pytest.mark.parametrize(
    "override, key",
    [
        ("oort.explore=1.5", "oort.explore"),
        ("oort.window=0", "oort.window"),
        ("fedcs.deadline_s=-1", "fedcs.deadline_s"),
    ],
)
def test_bad_settings_name_the_key(override, key):
    chosen = f"policy={key.split('.')[0]}"  # only the chosen policy's section is read, and so checked
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load(None, [chosen, override])

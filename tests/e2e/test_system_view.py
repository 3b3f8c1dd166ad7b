"""What a policy sees of the system (issue 12 item 4): the per-client view, every selected client's
outcome, the history the runtime keeps, the reliability impact rule and the static clients table."""

import math

import numpy as np
import pytest

from emulator.aggregate.impact import arrival_rates, impact_factors
from emulator.config import ConfigError, load, round_settings
from emulator.policies import POLICIES, ClientOutcome, OutcomeLog, RunContext
from emulator.policies.system import client_infos
from emulator.rounds.budgets import Budgets
from emulator.rounds.round import play_round
from emulator.timemodel.clock import Clock
from emulator.timemodel.resources import build_resources
from nodes.contracts.schema import ImpactConfig
from nodes.transport.dispatch import Reply
from tests.policies import scenario_policy

SIZES = [100, 200, 300, 400]


def weights(value):
    return {"w": np.full((2, 3), value, dtype=np.float32)}


class Recording(POLICIES["fedavg_dp"]):
    """fedavg_dp that keeps what the runtime tells it."""

    seen: list

    def observe_outcomes(self, rnd, outcomes):
        self.seen = [*getattr(self, "seen", []), dict(outcomes)]
        return {"seen": len(outcomes)}


def setup(*overrides):
    cfg = load(None, [f"clients.n={len(SIZES)}", *overrides])
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, cfg.seed)
    log = OutcomeLog(cfg.clients.n)
    ctx = RunContext(
        n_clients=len(SIZES),
        data_sizes=SIZES,
        num_params=6,
        rounds_budget=5,
        task_bytes=1000,
        clients=client_infos(resources, SIZES, log),
    )
    return cfg, resources, log, scenario_policy(cfg, ctx, Recording)


def play(cfg, resources, log, policy, rounds):
    """Rounds on one clock, clients training in-process; the log is extended after each, as the run does."""
    clock = Clock(resources, cfg.seed)

    def train(rnd, frames):
        update = {
            "model": weights(1.0),
            "metrics": {"steps": 1, "train_loss": 0.5 + rnd, "update_norm": 0.0},
        }
        return {c: Reply(client=c, message=dict(update), nbytes=1000) for c, _ in frames}

    records = []
    for rnd in range(rounds):
        records.append(
            play_round(
                rnd,
                weights(0.0),
                settings=round_settings(cfg),
                policy=policy,
                clock=clock,
                budgets=Budgets(
                    cfg.budget,
                    resources,
                    task_bytes=1000,
                    per_round=cfg.clients.per_round or cfg.clients.n,
                    tau=cfg.dp.tau,
                    deadline_s=cfg.round.deadline_s,
                ),
                train=train,
                evaluate=lambda w: (1.0, 0.5),
            )
        )
        log.extend(records[-1].outcomes.values())
    return records


def test_the_view_is_the_draw_of_build_resources():
    _, resources, _, policy = setup("links.up_bps.kind=uniform", "links.up_bps.low=1e6", "links.up_bps.high=9e6")
    for info, r, size in zip(policy.ctx.clients, resources, SIZES, strict=True):
        assert (info.client, info.data_size, info.up_bps, info.down_bps, info.latency_s, info.step_s, info.trace) == (
            r.client_id,
            size,
            r.up.bps,
            r.down.bps,
            r.latency_s,
            r.step_s,
            "",
        )
        assert info.estimated_round_s(1000, 5, 2000) == pytest.approx(
            2 * r.latency_s + 8000 / r.down.bps + 5 * r.step_s + 16000 / r.up.bps
        )
    with pytest.raises(AttributeError):
        policy.ctx.clients[0].up_bps = 1.0  # frozen


def test_every_selected_client_outcome_reaches_the_policy_and_the_history():
    # client 1's link is down for the whole run: its upload is lost, the others arrive
    cfg, resources, log, policy = setup(
        "links.dropout.direction=up", "links.dropout.outages=[{clients: [1], start: 0, end: 1e9}]"
    )
    records = play(cfg, resources, log, policy, rounds=2)
    assert [sorted(o) for o in policy.seen] == [[0, 1, 2, 3]] * 2
    first = policy.seen[0]
    assert first[1].outcome == "lost_up" and math.isnan(first[1].train_loss) and math.isnan(first[1].duration_s)
    assert all(first[c].arrived and first[c].train_loss == 0.5 for c in (0, 2, 3))
    tl = records[0].timeline.clients[2]
    assert (first[2].t_down_start, first[2].t_up_end) == (tl.t_down_start, tl.t_up_end)
    assert records[0].policy_state["seen"] == 4
    history = policy.ctx.clients[1].history
    assert [o.round for o in history] == [0, 1] and history.arrivals == 0 and history.last_arrived() is None
    assert policy.ctx.clients[0].history.last_arrived().train_loss == 1.5  # round 1's loss
    with pytest.raises(TypeError):
        history[0] = history[1]  # read-only
    assert not hasattr(history, "append")


def test_reliability_impact_weighs_data_size_by_arrival_rate():
    # prior 1.0 over 2 rounds: a client seen 2 times, arrived 0 -> (0 + 2) / 4 = 0.5
    assert arrival_rates([0, 2, 0], [2, 2, 0], 1.0, 2.0).tolist() == [0.5, 1.0, 1.0]
    assert arrival_rates([0], [0], 0.3, 0.0).tolist() == [0.3]  # no evidence at all: the prior
    p = impact_factors(ImpactConfig(kind="reliability"), 0, [100, 100, 200], [0.5, 1.0, 1.0])
    assert p.tolist() == pytest.approx([0.5 / 3.5, 1 / 3.5, 2 / 3.5])
    assert impact_factors(ImpactConfig(kind="reliability"), 0, [1, 3], [0.0, 0.0]).tolist() == [0.25, 0.75]
    with pytest.raises(ValueError, match="reliability"):
        impact_factors(ImpactConfig(kind="reliability"), 0, [1, 3])


def test_reliability_impact_in_the_round_uses_the_history_before_it():
    cfg, resources, log, policy = setup(
        "impact.kind=reliability",
        "links.dropout.direction=up",
        "links.dropout.outages=[{clients: [1], start: 0, end: 1e9}]",
    )
    first, second = play(cfg, resources, log, policy, rounds=2)
    assert first.planned.tolist() == pytest.approx([s / sum(SIZES) for s in SIZES])  # nothing seen yet
    rates = [1.0, 2 / 3, 1.0, 1.0]  # client 1: one round lost, prior 1.0 x 2
    expected = np.array(SIZES) * rates
    assert second.planned.tolist() == pytest.approx((expected / expected.sum()).tolist())


@pytest.mark.parametrize(
    "override, key", [("impact.prior_rate=1.5", "impact.prior_rate"), ("impact.prior_weight=-1", "impact.prior_weight")]
)
def test_reliability_prior_is_range_checked(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load(None, ["impact.kind=reliability", override])


def test_outcome_duration():
    o = ClientOutcome(
        round=0,
        client=0,
        outcome="arrived",
        t_down_start=1.0,
        t_down_end=2.0,
        t_compute_end=3.0,
        t_up_end=4.5,
        train_loss=0.1,
    )
    assert o.duration_s == 3.5


def test_a_run_writes_the_clients_table_and_its_history_reads_back(tmp_path):
    from analysis.load import discover
    from emulator.output.results import read_clients, read_table
    from emulator.run.lifecycle import run
    from emulator.run.state import past_outcomes

    cfg = load("dropout.yaml", ["budget.rounds=2", "workers=2", f"output.dir={tmp_path}", "output.progress=false"])
    d = run(cfg)
    table = read_clients(d).to_pylist()
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, cfg.seed)
    assert [(r["client"], r["up_bps"], r["step_s"]) for r in table] == [
        (r.client_id, r.up.bps, r.step_s) for r in resources
    ]
    sizes = {r["client"]: r["data_size"] for r in table}
    assert len(sizes) == cfg.clients.n and all(s >= cfg.data.min_samples for s in sizes.values())
    rows = read_table(d, "client_rounds").to_pylist()
    past = past_outcomes(d)  # what a resumed run's histories start from
    assert [(o.round, o.client, o.outcome) for o in past] == [(r["round"], r["client"], r["outcome"]) for r in rows]
    assert discover([str(d)]).table("clients").column_names[:4] == ["run", "config", "seed", "client"]

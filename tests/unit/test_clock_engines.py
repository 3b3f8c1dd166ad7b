"""The clock's two engines give one timeline: a round run on the plain queue (nothing races) equals the
same round run by SimPy's processes, field for field and event for event, ties included."""

import math
from collections import defaultdict

import numpy as np
import pytest

from emulator.config import load
from emulator.timemodel.clock import Clock, Job, _Queue
from emulator.timemodel.resources import build_resources


def clock(overrides: list[str]) -> Clock:
    cfg = load(None, overrides)
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, cfg.seed)
    return Clock(resources, cfg.seed, cfg.links.server_down_bps, cfg.links.server_up_bps)


def pick(rng: np.random.Generator, options: list) -> object:
    return options[int(rng.integers(len(options)))]


def scenario(seed: int, tmp_path) -> list[str]:
    """Small integer-like rates and sizes (1 or 2 bytes a second, latencies and steps of 0, 1/4 or 1 s),
    so that different clients' downloads, computes and uploads end at the same instants."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 31))
    values = lambda options: f"[{','.join(str(pick(rng, options)) for _ in range(n))}]"  # noqa: E731
    overrides = [
        f"seed={seed}",
        f"clients.n={n}",
        *(f"{key}.kind=list" for key in ("links.down_bps", "links.up_bps", "links.latency_s", "compute.step_s")),
        f"links.down_bps.values={values([8, 16])}",
        f"links.up_bps.values={values([8, 16])}",
        f"links.latency_s.values={values([0, 0, 1])}",
        f"compute.step_s.values={values([0, 0, 1])}",
        f"links.dropout.model={pick(rng, ['none', 'bernoulli', 'gilbert_elliott'])}",
        "links.dropout.p=0.3",
        f"links.dropout.direction={pick(rng, ['both', 'up', 'down'])}",
    ]
    if rng.random() < 0.3:
        overrides.append("links.dropout.outages=[{start: 2, end: 3}]")
    if rng.random() < 0.3:
        overrides.append("compute.schedule=[{t: 1, factor: 4}]")
    if rng.random() < 0.5:  # some clients available on [a, b) only: gone before, during or after their steps
        rows = [f"{c},{pick(rng, [0, 1])},{pick(rng, [2, 3, 5, 1000])}" for c in range(n) if rng.random() < 0.5]
        (tmp_path / f"avail{seed}.csv").write_text("\n".join(["client,t_start,t_end", *rows]) + "\n")
        overrides += ["availability.model=csv", f"availability.file={tmp_path / f'avail{seed}.csv'}"]
    links = rng.random()
    if links < 0.3:
        overrides.append("links.schedule=[{t: 2, factor: 2}]")
    elif links < 0.6:
        trace = tmp_path / f"up{seed}.csv"
        trace.write_text("t_s,bps\n0,8\n1,0\n2,16\n4,16\n")  # 1 byte/s, nothing, then 2 bytes/s; repeats
        overrides.append(f"links.trace.up=[{trace}]")
    return overrides


def rounds(seed: int, n: int) -> list[list[Job]]:
    """Three rounds of jobs for a random subset of the n clients: sizes of 0 to 4 bytes, 0 to 3 steps,
    some workers failed."""
    rng = np.random.default_rng([seed, 1])
    return [
        [
            Job(
                client=c,
                bytes_down=int(pick(rng, [0, 0, 1, 2, 4])),
                steps=int(rng.integers(4)),
                bytes_up=int(pick(rng, [0, 0, 1, 3])),
                failed=bool(rng.random() < 0.15),
            )
            for c in rng.permutation(n)[: rng.integers(1, n + 1)]
        ]
        for _ in range(3)
    ]


def cross_ties(events: list[tuple[float, int, str, int]]) -> int:
    """Instants at which at least two clients have events of different kinds."""
    at: dict[float, set[tuple[int, str]]] = defaultdict(set)
    for t, c, kind, _ in events:
        if c >= 0:
            at[t].add((c, kind))
    return sum(len({c for c, _ in s}) > 1 and len({k for _, k in s}) > 1 for s in at.values())


def test_the_queue_gives_simpys_timelines_events_and_ties_included(tmp_path, monkeypatch):
    queued, ties = [], 0  # whether the queue ran each round of `fast` (False: a client's leaving raced)
    queue_round = Clock._queue_round

    def counted(self, rnd, jobs, tl, deadline):
        ran = queue_round(self, rnd, jobs, tl, deadline)
        if math.isinf(deadline):
            queued.append(ran)
        return ran

    monkeypatch.setattr(Clock, "_queue_round", counted)
    for seed in range(40):
        overrides = scenario(seed, tmp_path)
        fast, simpy_only = clock(overrides), clock(overrides)
        monkeypatch.setattr(simpy_only, "_queue_round", lambda *args: False)
        for rnd, jobs in enumerate(rounds(seed, len(fast.resources))):
            # odd seeds: round 1 has a deadline (SimPy's in both), which leaves its spent events behind
            deadline = fast.now + 2.5 if rnd == 1 and seed % 2 else math.inf
            expected = simpy_only.simulate_round(rnd, jobs, deadline)
            got = fast.simulate_round(rnd, jobs, deadline)
            assert repr(got) == repr(expected), f"seed {seed}, round {rnd}"  # repr: exact floats, nan == nan
            assert fast.now == simpy_only.now
            ties += cross_ties(got.events)
        assert [r.loss.bad for r in fast.resources.made.values()] == [
            r.loss.bad for r in simpy_only.resources.made.values()
        ]
    assert len(queued) == 40 * 3 - 20 and sum(queued) >= 80 and queued.count(False) >= 10  # both ways, often
    assert ties >= 40  # the scenarios do put different clients' different steps at one instant


@pytest.mark.parametrize(
    "override, deadline",
    [("links.server_up_bps=16", math.inf), ("links.latency_s.value=0", 10.0)],  # shared uplink; deadline
)
def test_simpy_runs_the_rounds_with_a_deadline_or_a_shared_link(override, deadline, monkeypatch):
    clk = clock(["clients.n=4", "links.down_bps.value=8", "links.up_bps.value=8", override])
    monkeypatch.setattr(
        "emulator.timemodel.clock._Queue.run", lambda self: pytest.fail("the queue ran a round that races")
    )
    tl = clk.simulate_round(0, [Job(client=c, bytes_down=2, steps=1, bytes_up=2) for c in range(4)], deadline)
    assert [tl.clients[c].outcome for c in range(4)] == ["arrived"] * 4


def test_a_client_leaving_during_its_steps_gives_the_round_back_to_simpy_as_it_was(tmp_path, monkeypatch):
    """Client 1 leaves at 2 s, the instant its 2 s download would end: the unavailability counts (SimPy
    scheduled it first). Client 0 is always there. Gilbert-Elliott losses with a bad state that sticks:
    the queue's draws changed the links' state before it gave up."""
    path = tmp_path / "avail.csv"
    path.write_text("client,t_start,t_end\n1,0,2\n")
    overrides = [
        "clients.n=2",
        *("links.down_bps.value=8", "links.up_bps.value=8", "links.latency_s.value=0"),
        *("links.dropout.model=gilbert_elliott", "links.dropout.p_good_to_bad=1", "links.dropout.p_bad_to_good=0"),
        *("availability.model=csv", f"availability.file={path}"),
    ]
    fast, simpy_only = clock(overrides), clock(overrides)
    monkeypatch.setattr(simpy_only, "_queue_round", lambda *args: False)
    runs = []
    queue_run = _Queue.run
    monkeypatch.setattr("emulator.timemodel.clock._Queue.run", lambda self: runs.append(1) or queue_run(self))
    jobs = [Job(client=c, bytes_down=2, steps=1, bytes_up=1) for c in (0, 1)]
    tl = fast.simulate_round(0, jobs, math.inf)
    assert runs == [1]  # the queue tried
    assert repr(tl) == repr(simpy_only.simulate_round(0, jobs, math.inf))
    assert [tl.clients[c].outcome for c in (0, 1)] == ["lost_down", "lost_down"]  # 1 left; 0's link went bad
    assert tl.events == [
        (0.0, -1, "round_start", 0),
        (0.0, 0, "download_start", 2),
        (0.0, 1, "download_start", 2),
        (2.0, 1, "unavailable", 0),  # its timeout, scheduled at its start, before 0's download ends
        (2.0, 0, "download_lost", 2),
        (2.0, -1, "round_end", 0),
    ]
    assert [fast.resources[c].loss.bad for c in (0, 1)] == [True, False]  # 1's transfer never ended: no draw
    assert fast.now == simpy_only.now == 2.0

"""Virtual time of a round, checked against durations computed by hand."""
import math

import pytest

from emulator.clock import Clock, Job
from emulator.config import load
from emulator.links import build_resources

# 3 clients: 8 Mbit/s down, up 1 / 1 / 0.1 Mbit/s, latency 0.1 s, 0.5 s per step.
BASE = ["clients.n=3", "links.down_bps.value=8e6", "links.up_bps.kind=list", "links.up_bps.values=[1e6,1e6,1e5]",
        "links.latency_s.value=0.1", "compute.step_s.value=0.5"]


def clock(*overrides):
    cfg = load(None, [*BASE, *overrides])
    return Clock(build_resources(cfg, cfg.seed), cfg.seed, cfg.links.server_down_bps, cfg.links.server_up_bps)


def jobs(nbytes=100_000, steps=2, failed=()):
    return [Job(client=c, bytes_down=nbytes, steps=steps, bytes_up=nbytes, failed=c in failed) for c in range(3)]


def by_hand(c):
    up = [1e6, 1e6, 1e5][c]
    down_end = 0.1 + 800_000 / 8e6          # latency + bits / rate = 0.2
    compute_end = down_end + 2 * 0.5        # 1.2
    return down_end, compute_end, compute_end + 0.1 + 800_000 / up


def test_every_client_arrives_and_the_round_ends_at_the_last_arrival():
    tl = clock().simulate_round(0, jobs(), deadline=math.inf)
    for c in range(3):
        ct = tl.clients[c]
        assert ct.outcome == "arrived"
        assert (ct.t_down_end, ct.t_compute_end, ct.t_up_end) == pytest.approx(by_hand(c), abs=1e-12)
    assert tl.t_end == pytest.approx(by_hand(2)[2])   # 1.2 + 0.1 + 8 = 9.3


def test_a_client_slower_than_the_deadline_is_late_and_the_round_waits_for_the_deadline():
    clk = clock()
    tl = clk.simulate_round(0, jobs(), deadline=5.0)
    assert [tl.clients[c].outcome for c in range(3)] == ["arrived", "arrived", "late"]
    assert math.isnan(tl.clients[2].t_up_end)
    assert tl.t_end == 5.0 and clk.now == 5.0
    assert ("late" in [k for _, c, k, _ in tl.events if c == 2])
    # the next round starts where this one ended
    tl2 = clk.simulate_round(1, jobs(), deadline=clk.now + 5.0)
    assert tl2.t_start == 5.0
    assert tl2.clients[0].t_down_end == pytest.approx(5.0 + by_hand(0)[0])


def test_lost_downloads_skip_the_round_and_a_failed_worker_uploads_nothing():
    clk = clock("links.dropout.model=bernoulli", "links.dropout.p=1", "links.dropout.direction=down")
    tl = clk.simulate_round(0, jobs(), deadline=math.inf)
    assert all(tl.clients[c].outcome == "lost_down" and tl.clients[c].bytes_up == 0 for c in range(3))
    assert not any(ct.trained for ct in tl.clients.values())
    tl = clock().simulate_round(0, jobs(failed={1}), deadline=math.inf)
    assert tl.clients[1].outcome == "failed" and tl.clients[1].bytes_up == 0 and tl.clients[1].trained
    assert tl.clients[0].outcome == "arrived"


def test_lost_upload_is_recorded_with_its_bytes():
    clk = clock("links.dropout.model=bernoulli", "links.dropout.p=1", "links.dropout.direction=up")
    tl = clk.simulate_round(0, jobs(), deadline=20.0)
    for c in range(3):
        assert tl.clients[c].outcome == "lost_up" and tl.clients[c].bytes_up == 100_000
    assert tl.t_end == 20.0   # nothing arrived: the server waits for the deadline
    kinds = [k for _, c, k, _ in tl.events if c == 0]
    assert kinds == ["download_start", "download_end", "upload_start", "upload_lost"]


def test_shared_server_uplink_slows_concurrent_uploads():
    alone = clock().simulate_round(0, jobs(), deadline=math.inf)
    shared = clock("links.server_up_bps=1e6").simulate_round(0, jobs(), deadline=math.inf)
    # All start uploading at 1.3 s. Max-min share of 1 Mbit/s: client 2 keeps its own 0.1 Mbit/s,
    # clients 0 and 1 get 0.45 Mbit/s each instead of 1 Mbit/s.
    for c in (0, 1):
        assert alone.clients[c].t_up_end == pytest.approx(1.3 + 0.8)
        assert shared.clients[c].t_up_end == pytest.approx(1.3 + 800_000 / 450_000)
    assert shared.clients[2].t_up_end == pytest.approx(alone.clients[2].t_up_end)

"""Virtual time of a round, checked against durations computed by hand."""

import math

import pytest

from emulator.config import load
from emulator.timemodel.clock import Clock, Job
from emulator.timemodel.resources import build_resources

# 3 clients: 8 Mbit/s down, up 1 / 1 / 0.1 Mbit/s, latency 0.1 s, 0.5 s per step.
BASE = [
    "clients.n=3",
    "links.down_bps.value=8e6",
    "links.up_bps.kind=list",
    "links.up_bps.values=[1e6,1e6,1e5]",
    "links.latency_s.value=0.1",
    "compute.step_s.value=0.5",
]


def clock(*overrides):
    cfg = load(None, [*BASE, *overrides])
    return Clock(
        build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, cfg.seed),
        cfg.seed,
        cfg.links.server_down_bps,
        cfg.links.server_up_bps,
        on_unavailable=cfg.availability.on_unavailable,
    )


def jobs(nbytes=100_000, steps=2, failed=()):
    return [Job(client=c, bytes_down=nbytes, steps=steps, bytes_up=nbytes, failed=c in failed) for c in range(3)]


def by_hand(c):
    up = [1e6, 1e6, 1e5][c]
    down_end = 0.1 + 800_000 / 8e6  # latency + bits / rate = 0.2
    compute_end = down_end + 2 * 0.5  # 1.2
    return down_end, compute_end, compute_end + 0.1 + 800_000 / up


def test_every_client_arrives_and_the_round_ends_at_the_last_arrival():
    tl = clock().simulate_round(0, jobs(), deadline=math.inf)
    for c in range(3):
        ct = tl.clients[c]
        assert ct.outcome == "arrived"
        assert (ct.t_down_end, ct.t_compute_end, ct.t_up_end) == pytest.approx(by_hand(c), abs=1e-12)
    assert tl.t_end == pytest.approx(by_hand(2)[2])  # 1.2 + 0.1 + 8 = 9.3


def test_a_client_slower_than_the_deadline_is_late_and_the_round_waits_for_the_deadline():
    clk = clock()
    tl = clk.simulate_round(0, jobs(), deadline=5.0)
    assert [tl.clients[c].outcome for c in range(3)] == ["arrived", "arrived", "late"]
    assert math.isnan(tl.clients[2].t_up_end)
    assert tl.t_end == 5.0 and clk.now == 5.0
    assert "late" in [k for _, c, k, _ in tl.events if c == 2]
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
    assert tl.t_end == 20.0  # nothing arrived: the server waits for the deadline
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


# --- traces and availability ----------------------------------------------------------------------


@pytest.fixture
def traces(tmp_path):
    """A Mahimahi downlink with 4 opportunities per 10 ms (0, 0, 5, 10 ms) and an uplink CSV trace of
    1 Mbit/s on [0, 1) s and nothing on [1, 2) s, both repeating."""
    down, up = tmp_path / "tiny.down", tmp_path / "gaps.csv"
    down.write_text("0\n0\n5\n10\n")
    up.write_text("t_s,bps\n0,1e6\n1,0\n2,1e6\n")
    return [f"links.trace.down=[{down}]", f"links.trace.up=[{up}]"]


def test_a_round_over_traces_by_hand(traces):
    tl = clock(*traces).simulate_round(0, jobs(), deadline=math.inf)
    for c in range(3):
        ct = tl.clients[c]
        # 100 kB = 67 packets from 100 ms: 3 opportunities at 100 ms (the 10th repetition's last stamp and
        # the 11th's two zeros), then 4 every 10 ms: the 67th at 260 ms
        assert ct.t_down_end == pytest.approx(0.26, abs=1e-12)
        assert ct.t_compute_end == pytest.approx(1.26, abs=1e-12)
        # the upload's bits start at 1.36, where the uplink is at 0 until 2.0; 8e5 bits at 1 Mbit/s -> 2.8
        assert ct.t_up_end == pytest.approx(2.8, abs=1e-12)


def test_a_trace_on_the_shared_server_uplink_by_hand(traces):
    tl = clock(*traces, "links.server_up_bps=1e6").simulate_round(0, jobs(), deadline=math.inf)
    # three uploads of 8e5 bits share 1 Mbit/s only while the trace gives 1 Mbit/s ([2,3), [4,5), [6,7)):
    # 2.4e6 bits need 2.4 s of those -> 6.4 s
    assert [tl.clients[c].t_up_end for c in range(3)] == pytest.approx([6.4] * 3, abs=1e-9)


def availability(tmp_path, on_unavailable):
    """Client 1 is available on [0, 0.5) s only, client 2 from 5 s on; client 0 always."""
    path = tmp_path / "avail.csv"
    path.write_text("client,t_start,t_end\n1,0,0.5\n2,5,1000\n")
    return ["availability.model=csv", f"availability.file={path}", f"availability.on_unavailable={on_unavailable}"]


def test_a_client_that_becomes_unavailable_during_its_round_drops(tmp_path):
    clk = clock(*availability(tmp_path, "drop"))
    assert clk.selectable([0, 1, 2]) == [0, 1, 2]  # drop: the policy is not told
    tl = clk.simulate_round(0, jobs(), deadline=math.inf)
    assert tl.clients[0].outcome == "arrived"
    assert tl.clients[1].outcome == "lost_up" and tl.clients[1].bytes_up == 0 and tl.clients[1].trained
    assert tl.clients[2].outcome == "lost_down" and tl.clients[2].bytes_down == 0 and not tl.clients[2].trained
    unavailable = [(t, c) for t, c, k, _ in tl.events if k == "unavailable"]
    assert unavailable == [(0.0, 2), (0.5, 1)]  # client 2 at the start, client 1 mid-compute


def test_exclude_offers_only_the_available_and_waits_when_none_is(tmp_path):
    clk = clock(*availability(tmp_path, "exclude"))
    assert clk.selectable([0, 1, 2]) == [0, 1]
    tl = clk.simulate_round(0, jobs()[:2], deadline=math.inf)
    assert [(t, c) for t, c, k, _ in tl.events if k == "unavailable"] == [(0.5, 1)]  # 1 drops mid-compute
    assert tl.unavailable == 1  # client 2, left out at the start: counted, not an event
    assert clk.selectable([1, 2], until=4.0) == [] and clk.now == tl.t_end  # nobody before 4 s: time stays
    assert clk.selectable([1, 2]) == [2] and clk.now == 5.0  # time moves on to client 2

"""Each task's energy (emulator.energy), checked against joules computed by hand from the clock's times and
bytes and the power model's coefficients (Huang et al. 2012, docs/energy.md)."""

import math

import pytest

from emulator.config import load
from emulator.energy.model import Energy
from emulator.energy.radio import RADIOS
from emulator.energy.task import TaskEnergy, task_energy
from emulator.timemodel.clock import ClientTimeline, Outcome
from nodes.contracts.schema import EnergyConfig
from tests.unit.test_clock import clock, jobs

# test_clock's 3 clients: 8 Mbit/s down, up 1 / 1 / 0.1 Mbit/s, latency 0.1 s, 0.5 s per step; 100 kB each
# way, 2 steps.
UP_BPS = [1e6, 1e6, 1e5]
MBIT = 0.8  # 100 kB
# LTE as docs/energy.md gives it: W per Mbit/s up and down, W in flight, the tail's W and s
ALPHA_UP, ALPHA_DOWN, BETA, TAIL_W, TAIL_S = 0.43839, 0.05197, 1.28804, 1.060, 11.576
COMPUTE_W = 2.0


def lte(ct):
    return task_energy(ct, RADIOS["lte"], COMPUTE_W)


def test_an_arrived_tasks_joules_are_its_transfers_its_tails_and_its_training():
    tl = clock().simulate_round(0, jobs(), deadline=math.inf)
    for c in range(3):
        up_s = 0.1 + MBIT / (UP_BPS[c] / 1e6)
        e = lte(tl.clients[c])
        assert tl.clients[c].t_end == tl.clients[c].t_up_end
        assert e.radio_down_j == pytest.approx(BETA * 0.2 + ALPHA_DOWN * MBIT, rel=1e-12)  # 0.1 s latency + 0.1 s
        assert e.compute_j == pytest.approx(COMPUTE_W * 1.0, rel=1e-12)  # 2 steps of 0.5 s
        assert e.radio_up_j == pytest.approx(BETA * up_s + ALPHA_UP * MBIT, rel=1e-12)
        # the tail after the download lasts the 1 s of training; the one after the upload, in full
        assert e.tail_j == pytest.approx(TAIL_W * 1.0 + TAIL_W * TAIL_S, rel=1e-12)


def test_an_upload_cut_at_the_deadline_is_charged_the_bits_that_crossed_before_it():
    tl = clock().simulate_round(0, jobs(), deadline=5.0)
    ct = tl.clients[2]  # 0.1 Mbit/s: its upload from 1.2 s would end at 9.3 s
    assert ct.outcome == Outcome.LATE and ct.t_end == 5.0
    sent = 1e5 * (5.0 - 1.3)  # from the upload's start at 1.2 s and its 0.1 s latency
    assert ct.cut_bits == pytest.approx(sent, rel=1e-12)
    assert lte(ct).radio_up_j == pytest.approx(BETA * 3.8 + ALPHA_UP * sent / 1e6, rel=1e-12)
    assert lte(ct).tail_j == pytest.approx(TAIL_W * 1.0 + TAIL_W * TAIL_S, rel=1e-12)


def test_a_download_cut_at_the_deadline_has_no_training_and_one_tail():
    tl = clock().simulate_round(0, jobs(), deadline=0.15)
    for ct in tl.clients.values():
        sent = 8e6 * (0.15 - 0.1)
        assert ct.outcome == Outcome.LATE and ct.cut_bits == pytest.approx(sent, rel=1e-12)
        assert lte(ct) == pytest.approx(TaskEnergy(BETA * 0.15 + ALPHA_DOWN * sent / 1e6, 0.0, TAIL_W * TAIL_S, 0.0))


def test_on_a_shared_server_link_a_cut_upload_is_charged_its_fair_share():
    """1 Mbit/s of server ingress, max-min fair: 0.1 Mbit/s to client 2, 0.45 to each of the others."""
    tl = clock("links.server_up_bps=1e6").simulate_round(0, jobs(), deadline=2.0)
    for c, share in ((0, 0.45e6), (1, 0.45e6), (2, 1e5)):
        ct = tl.clients[c]
        sent = share * (2.0 - 1.3)
        assert ct.outcome == Outcome.LATE and ct.cut_bits == pytest.approx(sent, rel=1e-9)
        assert lte(ct).radio_up_j == pytest.approx(BETA * 0.8 + ALPHA_UP * sent / 1e6, rel=1e-9)


def test_a_failed_or_lost_download_trains_nothing_and_moved_all_its_bits():
    failed = clock().simulate_round(0, jobs(failed={1}), deadline=math.inf).clients[1]
    lost = clock("links.dropout.model=bernoulli", "links.dropout.p=1.0", "links.dropout.direction=down")
    for ct in (failed, lost.simulate_round(0, jobs(), deadline=math.inf).clients[0]):
        assert ct.outcome in (Outcome.FAILED, Outcome.LOST_DOWN) and ct.t_end == ct.t_down_end
        assert lte(ct) == pytest.approx(TaskEnergy(BETA * 0.2 + ALPHA_DOWN * MBIT, 0.0, TAIL_W * TAIL_S, 0.0))


def test_a_client_gone_as_its_round_starts_draws_nothing():
    ct = ClientTimeline(client=0, outcome=Outcome.LOST_DOWN, t_down_start=4.0, t_end=4.0)
    assert lte(ct) == TaskEnergy(0.0, 0.0, 0.0, 0.0)


def test_wifi_has_no_tail_and_its_own_coefficients():
    ct = clock().simulate_round(0, jobs(), deadline=math.inf).clients[0]
    e = task_energy(ct, RADIOS["wifi"], COMPUTE_W)
    assert e.tail_j == 0.0
    assert e.radio_down_j == pytest.approx(0.13286 * 0.2 + 0.13701 * MBIT, rel=1e-12)
    assert e.radio_up_j == pytest.approx(0.13286 * 0.9 + 0.28317 * MBIT, rel=1e-12)


def test_a_round_that_has_not_ended_has_no_energy():
    with pytest.raises(ValueError, match="client 3: its round has not ended"):
        lte(ClientTimeline(client=3))


def test_each_clients_compute_power_is_drawn_once_from_the_runs_seed():
    cfg = load(
        None, ["energy.radio=lte", "energy.compute_w.kind=uniform", "energy.compute_w.low=1", "energy.compute_w.high=3"]
    )
    a, b = Energy(cfg.energy, 100, seed=1), Energy(cfg.energy, 100, seed=1)
    drawn = [a.compute_w(c) for c in range(100)]
    assert (
        drawn
        == [b.compute_w(c) for c in range(100)]
        != [Energy(cfg.energy, 100, seed=2).compute_w(c) for c in range(100)]
    )
    assert 1 <= min(drawn) < max(drawn) <= 3
    assert Energy.of(EnergyConfig(), 100, seed=1) is None  # energy.radio = none

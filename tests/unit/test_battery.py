"""Batteries (emulator.energy.battery): the moment a task empties one, checked against times computed by hand
from the power model's coefficients; the floor; recharging while unavailable; a charge never below 0."""

import math

import pytest

from emulator.config import load
from emulator.energy.battery import JOULES_PER_WH, unavailable_seconds
from emulator.energy.model import Energy
from emulator.energy.task import task_energy
from emulator.timemodel.availability import Availability
from emulator.timemodel.clock import BATTERY_EMPTY, LOW_BATTERY, Clock, Outcome
from emulator.timemodel.resources import build_resources
from tests.unit.test_clock import BASE as CLOCK_BASE
from tests.unit.test_clock import jobs

# test_clock's 3 clients: 8 Mbit/s down, up 1 / 1 / 0.1 Mbit/s, latency 0.1 s, 0.5 s per step; 100 kB each
# way, 2 steps.
BASE = [
    *CLOCK_BASE,
    "energy.radio=lte",
    "energy.compute_w.value=2.0",
    "energy.battery.enabled=true",
    "energy.battery.floor=0.0",
]
ALPHA_UP, ALPHA_DOWN, BETA, TAIL_W, TAIL_S = 0.43839, 0.05197, 1.28804, 1.060, 11.576  # LTE, docs/energy.md
COMPUTE_W = 2.0


def run_round(joules: float, *overrides: str, deadline: float = math.inf):
    """Round 0 of the three clients, each battery holding `joules`: its timeline and the run's energy model."""
    cfg = load(None, [*BASE, f"energy.battery.capacity_wh.value={joules / JOULES_PER_WH}", *overrides])
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, cfg.seed)
    energy = Energy(cfg.energy, cfg.clients.n, cfg.seed, resources)
    clock = Clock(resources, cfg.seed, drain=energy.batteries)
    return clock.simulate_round(0, jobs(), deadline), energy


def drawn(ct, energy):
    return task_energy(ct, energy.radio, COMPUTE_W).total_j


def left(tl, c):
    return [(t, kind) for t, who, kind, _ in tl.events if who == c and kind in (BATTERY_EMPTY, LOW_BATTERY)]


def test_a_battery_that_empties_during_the_latency_or_the_bits_of_the_download():
    tl, energy = run_round(0.1)  # beta alone draws it within the 0.1 s latency
    at = 0.1 / BETA
    for c in range(3):
        ct = tl.clients[c]
        assert ct.outcome == Outcome.LOST_DOWN and ct.battery_empty and ct.t_end == pytest.approx(at, rel=1e-12)
        assert left(tl, c) == [(ct.t_end, BATTERY_EMPTY)]
        assert drawn(ct, energy) == pytest.approx(0.1, rel=1e-12)
    tl, energy = run_round(0.2)  # beta t + alpha_down * 8 Mbit/s * (t - 0.1) = 0.2
    at = (0.2 + ALPHA_DOWN * 8 * 0.1) / (BETA + ALPHA_DOWN * 8)
    ct = tl.clients[0]
    assert ct.t_end == pytest.approx(at, rel=1e-12) and ct.cut_bits == pytest.approx(8e6 * (at - 0.1), rel=1e-9)
    assert drawn(ct, energy) == pytest.approx(0.2, rel=1e-12)


def test_a_battery_that_empties_during_training_draws_the_processor_and_the_radios_tail():
    tl, energy = run_round(1.0)
    downloaded = BETA * 0.2 + ALPHA_DOWN * 0.8
    at = 0.2 + (1.0 - downloaded) / (COMPUTE_W + TAIL_W)  # training at 2 W beside the download's tail
    for c in range(3):
        ct = tl.clients[c]
        assert ct.outcome == Outcome.LOST_UP and math.isnan(ct.t_compute_end)
        assert ct.t_end == pytest.approx(at, rel=1e-12) and left(tl, c) == [(ct.t_end, BATTERY_EMPTY)]
        e = task_energy(ct, energy.radio, COMPUTE_W)
        assert (e.compute_j, e.tail_j) == pytest.approx((COMPUTE_W * (at - 0.2), TAIL_W * (at - 0.2)), rel=1e-12)
        assert e.total_j == pytest.approx(1.0, rel=1e-12)


def test_a_battery_that_empties_during_the_upload_loses_the_update_then():
    tl, energy = run_round(4.0)
    trained = BETA * 0.2 + ALPHA_DOWN * 0.8 + (COMPUTE_W + TAIL_W) * 1.0
    for c, up_bps in ((0, 1e6), (2, 1e5)):  # from 1.2 s: beta, then alpha_up * Mbit/s after the 0.1 s latency
        at = (4.0 - trained + BETA * 1.2 + ALPHA_UP * up_bps / 1e6 * 1.3) / (BETA + ALPHA_UP * up_bps / 1e6)
        ct = tl.clients[c]
        assert ct.outcome == Outcome.LOST_UP and ct.t_end == pytest.approx(at, rel=1e-12)
        assert drawn(ct, energy) == pytest.approx(4.0, rel=1e-12)


def test_a_task_that_ends_before_its_battery_has_its_last_tail_cut_where_it_empties():
    tl, energy = run_round(6.0)  # client 0 arrives at 2.1 s having drawn about 4.6 J: its tail has 1.4 J left
    ct = tl.clients[0]
    assert ct.outcome == Outcome.ARRIVED and not ct.battery_empty
    whole = task_energy(ct, energy.radio, COMPUTE_W)
    assert whole.total_j > 6.0
    settled, charges = energy.batteries.settle({0: whole}, tl)
    capped = settled[0]
    assert capped.total_j == pytest.approx(6.0, rel=1e-12) and capped.tail_j == whole.tail_j - (whole.total_j - 6.0)
    assert charges == {0: (6.0, pytest.approx(0.0, abs=1e-12))}


def test_below_the_floor_a_client_drops_at_its_start_or_is_not_offered():
    tl, energy = run_round(
        10.0, "energy.battery.initial.value=0.1", "energy.battery.floor=0.2", "energy.battery.on_low=drop"
    )
    for c in range(3):
        ct = tl.clients[c]
        assert ct.outcome == Outcome.LOST_DOWN and ct.t_end == 0.0 and left(tl, c) == [(0.0, LOW_BATTERY)]
        assert drawn(ct, energy) == 0.0
    kinds = [
        "energy.battery.initial.kind=list",
        "energy.battery.initial.values=[1,0.1,1,0.1]",
        "energy.battery.floor=0.2",
    ]
    cfg = load(None, [*BASE, *kinds])
    batteries = Energy(cfg.energy, 4, 0, build_resources(cfg.links, cfg.compute, cfg.availability, 4, 0)).batteries
    assert list(batteries.offered(range(4), 0.0)) == [0, 2]
    assert list(batteries.offered([1, 2, 3], 0.0)) == [2]
    batteries.after[2] = (5.0, 0.1 * batteries.capacity(2))  # its task left it below
    assert list(batteries.offered(range(4), 6.0)) == [0]


def test_a_battery_charges_while_its_client_is_unavailable_up_to_its_capacity():
    windows = Availability([(0, 10), (20, 30)])  # unavailable in [10, 20) and from 30
    assert unavailable_seconds(windows, 5.0, 25.0) == 10.0
    assert unavailable_seconds(windows, 12.0, 35.0) == 8.0 + 5.0
    cfg = load(None, [*BASE, "energy.battery.capacity_wh.value=0.1", "energy.battery.recharge_w=2"])
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, 1, 0)
    resources[0].availability = windows
    batteries = Energy(cfg.energy, 1, 0, resources).batteries
    batteries.after[0] = (5.0, 100.0)
    assert batteries.level(0, 25.0) == 100.0 + 2 * 10.0
    assert batteries.level(0, 1e6) == 0.1 * JOULES_PER_WH  # full

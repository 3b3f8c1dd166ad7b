"""Who is available at t, from every client's windows at once (emulator.timemodel.available_now), equals asking
each client's own Availability: the clients offered and left out, and when one is next available."""

from __future__ import annotations

import math

import numpy as np
import pytest

from emulator.policies.accounting import Excluding
from emulator.timemodel.availability import Availability, ObjectWindows, build_availability
from emulator.timemodel.available_now import AvailableNow
from nodes.contracts.schema import AvailabilityConfig

N = 3000
DAY = 86400.0


def csv_objects(period):
    """A third of the clients with one to three windows (some touching, some wrapping into the next period)."""
    rng = np.random.default_rng(2)
    objects = {}
    for i in rng.choice(N, N // 3, replace=False).tolist():
        starts = np.sort(rng.random(rng.integers(1, 4)) * (period if math.isfinite(period) else 3 * DAY))
        objects[i] = Availability([(s, s + rng.random() * DAY / 3) for s in starts], period)
    return objects


def availabilities(kind):
    """(the windows, each client's own Availability)."""
    if kind == "diurnal":
        cfg = AvailabilityConfig(model="diurnal", period_s=DAY, mean=0.5, amplitude=0.45, phase_spread_s=DAY)
        every = build_availability(cfg, N, seed=11)
        return every.windows, list(every)
    period = DAY if kind == "csv_daily" else math.inf
    objects = {i: Availability([(s, min(e, period)) for s, e in zip(a.starts, a.ends)], period)
               for i, a in csv_objects(period).items()}  # fmt: skip
    windows = ObjectWindows(N, objects)
    return windows, [objects.get(i, Availability([(0.0, math.inf)])) for i in range(N)]


def candidate_sets():
    rng = np.random.default_rng(3)
    few = sorted(rng.choice(N, 40, replace=False).tolist())
    return {
        "all": range(N),
        "all but a few": Excluding(N, few),
        "a list": sorted(rng.choice(N, 700, replace=False).tolist()),
    }


def times():
    """Forward within a period, across periods, and back (a resumed run's index starts afresh)."""
    rng = np.random.default_rng(4)
    forward = np.cumsum(rng.exponential(900.0, 120))
    return [0.0, *forward.tolist(), 3 * DAY - 1e-7, 3 * DAY, 100.0, 100.0, 7 * DAY + 5.0]


@pytest.mark.parametrize("kind", ["diurnal", "csv_daily", "csv_once"])
def test_the_clients_offered_are_those_each_own_availability_gives(kind):
    windows, own = availabilities(kind)
    now = AvailableNow(windows)
    for t in times():
        now.at(t)
        for name, candidates in candidate_sets().items():
            want = [c for c in candidates if own[c].available(t)]
            offered = now.among(candidates)
            left_out = [c for c in candidates if not own[c].available(t)]
            assert list(offered) == want and len(offered) == len(want), (t, name)
            picks = np.random.default_rng(int(t)).integers(0, len(want), 30) if want else []
            assert [offered[int(k)] for k in picks] == [want[k] for k in picks], (t, name)
            assert offered[-1:] == want[-1:]
            assert all(c in offered for c in want[:50]) and not any(c in offered for c in left_out[:50])


@pytest.mark.parametrize("kind", ["diurnal", "csv_daily", "csv_once"])
def test_the_next_time_a_candidate_is_available_is_the_earliest_of_their_own(kind):
    windows, own = availabilities(kind)
    now = AvailableNow(windows)
    rng = np.random.default_rng(6)
    for t in times():
        for size in (1, 3, 20):
            candidates = sorted(rng.choice(N, size, replace=False).tolist())
            want = min(own[c].next_available(t) for c in candidates)
            assert now.next_available(t, candidates) == want, (t, candidates)
        assert now.next_available(t, range(N)) == min(a.next_available(t) for a in own)


def test_an_offer_refuses_to_answer_once_its_clients_availability_changed():
    windows, own = availabilities("diurnal")
    now = AvailableNow(windows)
    now.at(0.0)
    offered = now.among(range(N))
    first = offered[0]
    t = next(t for t in times() if [a.available(t) for a in own] != [a.available(0.0) for a in own])
    now.at(t)
    with pytest.raises(RuntimeError, match="after their availability changed"):
        offered[0]
    assert now.among(range(N))[0] == next(c for c in range(N) if own[c].available(t)) and first >= 0


def test_windows_of_different_periods_are_refused():
    with pytest.raises(ValueError, match="expected windows of one period"):
        ObjectWindows(3, {0: Availability([(0.0, 1.0)], 10.0), 1: Availability([(0.0, 1.0)], 20.0)})


def test_the_positions_of_offered_ids_are_their_indices():
    """Oort's fresh clients leave out the positions of those seen: each sequence's positions, at once, are
    those a list of its ids gives, for every kind the clock and the accountants offer."""
    from emulator.timemodel.by_index import positions

    windows, _ = availabilities("diurnal")
    now = AvailableNow(windows)
    now.at(5000.0)
    for name, candidates in candidate_sets().items():
        offered = now.among(candidates)
        for kind in (candidates, offered):
            ids = list(kind)
            picks = sorted(np.random.default_rng(len(ids)).choice(ids, 50, replace=False).tolist())
            assert positions(kind, picks).tolist() == [ids.index(i) for i in picks], name


def test_the_members_of_each_offered_sequence_are_those_it_holds():
    """dp_fedavg's Poisson sample keeps the sampled ids that are candidates: for every kind of sequence the
    clock and the accountants offer, those a set of its ids holds."""
    from emulator.timemodel.by_index import members

    windows, _ = availabilities("diurnal")
    now = AvailableNow(windows)
    now.at(5000.0)
    asked = sorted(set(np.random.default_rng(3).choice(N, 300, replace=False).tolist()) | {0, N - 1})
    for name, candidates in candidate_sets().items():
        for kind in (candidates, now.among(candidates)):
            held = set(kind)
            assert members(kind, asked) == [i for i in asked if i in held], name

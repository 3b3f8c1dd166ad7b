import numpy as np
import pytest

from emulator.aggregate.impact import impact_factors, renormalise
from nodes.contracts.schema import ImpactConfig, ImpactPhase

SIZES = [100, 300, 600]


def test_uniform():
    assert impact_factors(ImpactConfig(kind="uniform"), 0, SIZES).tolist() == pytest.approx([1 / 3] * 3)
    assert impact_factors(ImpactConfig(kind="uniform"), 0, [5] * 4).tolist() == [0.25] * 4


def test_data_size():
    assert impact_factors(ImpactConfig(kind="data_size"), 0, SIZES).tolist() == [0.1, 0.3, 0.6]


def test_data_size_all_empty_falls_back_to_uniform():
    assert impact_factors(ImpactConfig(kind="data_size"), 0, [0, 0]).tolist() == [0.5, 0.5]


def test_explicit():
    p = impact_factors(ImpactConfig(kind="explicit", values=[0.5, 0.25, 0.25]), 3, SIZES)
    assert p.tolist() == [0.5, 0.25, 0.25]


def test_explicit_wrong_length_names_the_key():
    with pytest.raises(ValueError, match=r"impact\.values"):
        impact_factors(ImpactConfig(kind="explicit", values=[0.5, 0.5]), 0, SIZES)


def test_unknown_kind_names_the_key():
    with pytest.raises(ValueError, match=r"impact\.kind = 'lottery'"):
        impact_factors(ImpactConfig(kind="lottery"), 0, SIZES)


SCHEDULE = ImpactConfig(
    kind="schedule",
    schedule=[
        ImpactPhase(from_round=10, kind="explicit", values=[0.0, 0.0, 1.0]),
        ImpactPhase(from_round=3, kind="data_size"),
    ],
)


@pytest.mark.parametrize(
    "rnd, expected",
    [
        (0, [1 / 3, 1 / 3, 1 / 3]),  # before the first phase: uniform
        (2, [1 / 3, 1 / 3, 1 / 3]),
        (3, [0.1, 0.3, 0.6]),  # switches exactly at from_round
        (9, [0.1, 0.3, 0.6]),
        (10, [0.0, 0.0, 1.0]),  # phases need not be listed in order
        (50, [0.0, 0.0, 1.0]),
    ],
)
def test_schedule_switches_at_from_round(rnd, expected):
    assert impact_factors(SCHEDULE, rnd, SIZES).tolist() == pytest.approx(expected)


def test_schedule_tie_later_listed_phase_wins():
    cfg = ImpactConfig(
        kind="schedule",
        schedule=[ImpactPhase(from_round=0, kind="uniform"), ImpactPhase(from_round=0, kind="data_size")],
    )
    assert impact_factors(cfg, 0, SIZES).tolist() == [0.1, 0.3, 0.6]


def test_factors_non_negative_and_sum_to_one():
    rng = np.random.default_rng(0)
    for _ in range(50):
        sizes = rng.integers(0, 1000, size=rng.integers(1, 20)).tolist()
        for kind in ("uniform", "data_size"):
            p = impact_factors(ImpactConfig(kind=kind), 0, sizes)
            assert np.all(p >= 0) and p.sum() == pytest.approx(1.0, abs=1e-12)


def test_renormalise_redistributes_proportionally():
    # client 1 (0.3) dropped: 0 and 2 share it as 0.1 : 0.6 -> 0.1/0.7 and 0.6/0.7
    w = renormalise(np.array([0.1, 0.3, 0.6]), [2, 0])
    assert list(w) == [0, 2]
    assert w[0] == pytest.approx(1 / 7, rel=1e-15) and w[2] == pytest.approx(6 / 7, rel=1e-15)


def test_renormalise_everyone_aggregated_is_identity():
    p = np.array([0.2, 0.3, 0.5])
    assert renormalise(p, [0, 1, 2]) == pytest.approx({0: 0.2, 1: 0.3, 2: 0.5})


def test_renormalise_zero_weights_split_uniformly():
    assert renormalise(np.array([0.0, 0.0, 1.0]), [0, 1]) == {0: 0.5, 1: 0.5}


def test_renormalise_empty():
    assert renormalise(np.array([0.5, 0.5]), []) == {}


def test_renormalise_rejects_unknown_client():
    with pytest.raises(ValueError, match="aggregated"):
        renormalise(np.array([0.5, 0.5]), [0, 2])


def test_renormalise_sums_to_one_property():
    rng = np.random.default_rng(1)
    for _ in range(500):
        n = int(rng.integers(1, 40))
        p = rng.dirichlet(np.full(n, 0.3))
        p[rng.random(n) < 0.2] = 0.0  # some zero shares
        aggregated = rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False).tolist()
        w = renormalise(p, aggregated)
        assert list(w) == sorted(aggregated)
        assert all(v >= 0 for v in w.values())
        assert sum(w.values()) == pytest.approx(1.0, abs=1e-12)
        if p[aggregated].sum() > 0:  # proportional to p among the aggregated
            i, j = max(aggregated, key=lambda k: p[k]), min(aggregated)
            assert w[i] * p[j] == pytest.approx(w[j] * p[i], abs=1e-12)

"""Buffered and asynchronous aggregation's rules (emulator.aggregate.staleness) against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from emulator.aggregate.staleness import fedasync, fedbuff, fedbuff_factors, staleness_weight
from nodes.contracts.schema import BufferedConfig


def options(**kw: object) -> BufferedConfig:
    return BufferedConfig(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kind, a, b, t, expected",
    [
        ("constant", 0.5, 4.0, 0, 1.0),
        ("constant", 0.5, 4.0, 7, 1.0),
        ("polynomial", 0.5, 4.0, 0, 1.0),
        ("polynomial", 0.5, 4.0, 3, 0.5),  # (3 + 1)^-1/2
        ("polynomial", 2.0, 4.0, 1, 0.25),  # (1 + 1)^-2
        ("hinge", 2.0, 1.0, 0, 1.0),
        ("hinge", 2.0, 1.0, 1, 1.0),  # t <= b
        ("hinge", 2.0, 1.0, 2, 1 / 3),  # 1 / (2 (2 - 1) + 1)
        ("hinge", 2.0, 1.0, 4, 1 / 7),  # 1 / (2 (4 - 1) + 1)
    ],
)
def test_staleness_functions_are_fedasyncs(kind: str, a: float, b: float, t: int, expected: float) -> None:
    assert staleness_weight(options(staleness=kind, staleness_a=a, staleness_b=b), t) == pytest.approx(expected, 1e-15)


def test_fedbuff_applies_the_server_lr_times_the_staleness_weighted_mean_of_the_deltas() -> None:
    opts = options(staleness="polynomial", staleness_a=0.5, server_lr=2.0)
    factors = fedbuff_factors(opts, [0, 3])
    assert factors == [1.0, 0.5]  # 2 * 1 / 2 and 2 * (3 + 1)^-1/2 / 2
    w = {"w": np.array([1.0, 2.0], np.float32), "b": np.array([0.5], np.float32)}
    deltas = [
        {"w": np.array([1.0, 0.0], np.float32), "b": np.array([2.0], np.float32)},
        {"w": np.array([0.0, 2.0], np.float32), "b": np.array([-4.0], np.float32)},
    ]
    new = fedbuff(w, deltas, factors)
    np.testing.assert_array_equal(new["w"], [2.0, 3.0])
    np.testing.assert_array_equal(new["b"], [0.5])  # 0.5 + 1 * 2 + 0.5 * -4
    assert new["w"].dtype == np.float32
    np.testing.assert_array_equal(w["w"], [1.0, 2.0])  # the old model is left as it was


def test_fedasync_mixes_the_client_model_in_by_alpha_times_its_staleness_weight() -> None:
    opts = options(staleness="hinge", staleness_a=1.0, staleness_b=0.0, alpha=0.6)
    alpha_t = opts.alpha * staleness_weight(opts, 1)  # 0.6 * 1 / (1 * (1 - 0) + 1) = 0.3
    assert alpha_t == pytest.approx(0.3, 1e-15)
    w = {"w": np.array([1.0, 1.0], np.float32)}
    new = fedasync(w, {"w": np.array([3.0, 5.0], np.float32)}, alpha_t)
    np.testing.assert_allclose(new["w"], [0.7 * 1 + 0.3 * 3, 0.7 * 1 + 0.3 * 5], rtol=1e-7)  # float32's rounding
    assert new["w"].dtype == np.float32

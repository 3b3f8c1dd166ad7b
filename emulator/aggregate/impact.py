"""Impact factors p_i (Talaei & Izadi): the weight of each client's update in aggregation.

`impact_factors` gives p over all clients for a round; `renormalise` restricts it to the
updates the server actually has, handing the shares of dropped / late / failed clients
to the aggregated ones in proportion to their own p.

The adaptive rule (SPEC 3, "by link reliability"): kind=reliability weighs each client's data
size by its observed arrival rate, so that a client whose updates seldom make it in time moves
the model less when one does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nodes.contracts.schema import FIXED_IMPACT, ImpactConfig, ImpactKind


def _uniform(n: int) -> np.ndarray:
    return np.full(n, 1.0 / n)


def _fixed(kind: str, values: Sequence[float], data_sizes: Sequence[int], key: str) -> np.ndarray:
    n = len(data_sizes)
    if kind == ImpactKind.UNIFORM:
        return _uniform(n)
    if kind == ImpactKind.DATA_SIZE:
        sizes = np.asarray(data_sizes, dtype=float)
        if np.any(sizes < 0):
            raise ValueError(f"data_sizes = {list(data_sizes)}: expected sizes >= 0")
        total = sizes.sum()
        return sizes / total if total > 0 else _uniform(n)
    if kind == ImpactKind.EXPLICIT:
        p = np.asarray(values, dtype=float)
        if p.shape != (n,) or np.any(p < 0) or not p.sum() > 0:
            raise ValueError(f"{key} = {list(values)}: expected {n} non-negative factors, one per client, summing to 1")
        normalised: np.ndarray = p / p.sum()
        return normalised
    raise ValueError(f"{key.rsplit('.', 1)[0]}.kind = {kind!r}: expected {' | '.join(FIXED_IMPACT)}")


def arrival_rates(
    arrivals: Sequence[int] | np.ndarray, selections: Sequence[int] | np.ndarray, prior_rate: float, prior_weight: float
) -> np.ndarray:
    """Per client, the share of its rounds whose update arrived, with `prior_weight` rounds at
    `prior_rate` of prior evidence (a Beta prior's mean); a client never seen has prior_rate."""
    a, s = np.asarray(arrivals, dtype=float), np.asarray(selections, dtype=float)
    if a.shape != s.shape:
        raise ValueError(f"{len(a)} arrival counts for {len(s)} selection counts")
    seen = s + prior_weight
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 / 0 where seen is 0: prior_rate there
        return np.where(seen > 0, (a + prior_weight * prior_rate) / seen, prior_rate)


def impact_factors(
    cfg: ImpactConfig, rnd: int, data_sizes: Sequence[int], arrival_rate: Sequence[float] | None = None
) -> np.ndarray:
    """p over all clients for round `rnd`: non-negative, summing to 1.

    uniform: 1/N. data_size: |D_i| / sum |D| (uniform if every client is empty).
    explicit: cfg.values (rescaled to sum exactly to 1). schedule: the phase with the
    largest from_round <= rnd (the later-listed one on ties); before the first: uniform.
    reliability: p_i proportional to |D_i| * arrival_rate[i] (`arrival_rates` over the rounds
    before this one); data_size if every such product is 0.
    """
    n = len(data_sizes)
    if n == 0:
        raise ValueError("data_sizes = []: expected one size per client")
    if cfg.kind in FIXED_IMPACT:
        return _fixed(cfg.kind, cfg.values, data_sizes, "impact.values")
    if cfg.kind == ImpactKind.RELIABILITY:
        if arrival_rate is None or len(arrival_rate) != n:
            raise ValueError("impact.kind = 'reliability': expected one arrival rate per client")
        by_size = _fixed(ImpactKind.DATA_SIZE, (), data_sizes, "impact.values")
        p = by_size * np.asarray(arrival_rate, dtype=float)
        return p / p.sum() if p.sum() > 0 else by_size
    if cfg.kind == ImpactKind.SCHEDULE:
        current = None
        for k, phase in enumerate(cfg.schedule):
            if phase.from_round <= rnd and (current is None or phase.from_round >= cfg.schedule[current].from_round):
                current = k
        if current is None:
            return _uniform(n)
        phase = cfg.schedule[current]
        return _fixed(phase.kind, phase.values, data_sizes, f"impact.schedule[{current}].values")
    raise ValueError(f"impact.kind = {cfg.kind!r}: expected {ImpactKind.describe()}")


class Impact:
    """`impact_factors` of one run's clients, round by round; a kind whose factors do not change with
    the round (uniform, data_size, explicit) computed once, at the start, not each round over every client."""

    def __init__(self, cfg: ImpactConfig, data_sizes: Sequence[int]):
        self.cfg, self.data_sizes = cfg, data_sizes
        self._once: np.ndarray | None = None
        if cfg.kind in FIXED_IMPACT:
            self._once = impact_factors(cfg, 0, data_sizes)
            self._once.flags.writeable = False  # shared by every round's record

    def __call__(self, rnd: int, arrival_rate: Sequence[float] | None = None) -> np.ndarray:
        if self._once is not None:
            return self._once
        return impact_factors(self.cfg, rnd, self.data_sizes, arrival_rate)


def renormalise(p: np.ndarray, aggregated: Sequence[int]) -> dict[int, float]:
    """Weights over the aggregated clients only, keyed by client id in ascending order.

    Each client not aggregated gives its share to the aggregated ones in proportion to
    their own p, i.e. w_i = p_i / sum_{j aggregated} p_j. If every aggregated client has
    p = 0 they split uniformly. No aggregated client -> {}.
    """
    ids = sorted({int(i) for i in aggregated})
    if not ids:
        return {}
    p = np.asarray(p, dtype=float)
    if ids[0] < 0 or ids[-1] >= len(p):
        raise ValueError(f"aggregated = {ids}: expected client ids in [0, {len(p)})")
    mine = p[ids]
    if np.any(mine < 0):
        raise ValueError(f"p = {p.tolist()}: expected non-negative impact factors")
    total = mine.sum()
    weights = mine / total if total > 0 else np.full(len(ids), 1.0 / len(ids))
    return {i: float(w) for i, w in zip(ids, weights)}

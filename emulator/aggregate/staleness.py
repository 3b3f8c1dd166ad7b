"""The server's update rules of buffered and asynchronous aggregation, as pure functions.

FedBuff (Nguyen et al., AISTATS 2022, Algorithm 1): the server sums the arrived client deltas
Delta_i = w_i - w_start(i), each scaled by s(staleness), and after K of them applies
w <- w + eta_g * (1/K) * sum_i s(t_i) Delta_i (the paper's x <- x - eta_g * Delta-bar, with its deltas
taken as w_start - w_i). FedAsync (Xie et al. 2019, Algorithm 1): each arrived model w_i is mixed in
at once, w <- (1 - alpha_t) w + alpha_t w_i with alpha_t = alpha * s(t_i). The staleness functions s
are FedAsync's: constant, polynomial (t + 1)^-a and hinge (1 if t <= b else 1 / (a (t - b) + 1)).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nodes.contracts.schema import BufferedConfig, Staleness
from nodes.contracts.tasks import Weights


def staleness_weight(options: BufferedConfig, t: int) -> float:
    """s(t) of an update that started `t` >= 0 model versions before the one it is applied to."""
    kind, a, b = options.staleness, options.staleness_a, options.staleness_b
    if kind == Staleness.POLYNOMIAL:
        return float((t + 1.0) ** -a)
    if kind == Staleness.HINGE:
        return 1.0 if t <= b else 1.0 / (a * (t - b) + 1.0)
    return 1.0


def fedbuff(weights: Weights, deltas: Sequence[Weights], factors: Sequence[float]) -> Weights:
    """w + sum_i factors_i * Delta_i, summed in float64 in the order given; FedBuff's factors are
    eta_g * s(t_i) / K (`fedbuff_factors`)."""
    return {
        name: (w.astype(np.float64) + sum(f * d[name].astype(np.float64) for f, d in zip(factors, deltas))).astype(
            w.dtype
        )
        for name, w in weights.items()
    }


def fedbuff_factors(options: BufferedConfig, staleness: Sequence[int]) -> list[float]:
    """eta_g * s(t_i) / K for each buffered update, K = the buffer's size (buffered.k)."""
    k = len(staleness)
    return [options.server_lr * staleness_weight(options, t) / k for t in staleness]


def fedasync(weights: Weights, client_model: Weights, alpha_t: float) -> Weights:
    """(1 - alpha_t) w + alpha_t w_i, in float64."""
    return {
        name: ((1.0 - alpha_t) * w.astype(np.float64) + alpha_t * client_model[name].astype(np.float64)).astype(w.dtype)
        for name, w in weights.items()
    }

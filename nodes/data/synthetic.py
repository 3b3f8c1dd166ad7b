"""Synthetic(alpha, beta) of Li et al., "Federated optimization in heterogeneous networks" (FedProx).

Per client k: u_k ~ N(0, alpha), B_k ~ N(0, beta), W_k ~ N(u_k, 1) (dim x classes),
b_k ~ N(u_k, 1), v_k ~ N(B_k, 1) per feature, x ~ N(v_k, Sigma) with Sigma = diag(j^-1.2),
y = argmax(W_k^T x + b_k) (= argmax softmax). As in the FedProx generator code, alpha and beta
are used as *standard deviations*. Client k draws from its own stream, so its data do not
depend on how many other clients there are. A share `test_fraction` of every client's samples
is pooled into the server's test set.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from nodes.data.federated import FederatedData
from nodes.rng import stream

if TYPE_CHECKING:
    from nodes.schema import DataConfig


def synthetic(cfg: DataConfig, n_clients: int, seed: int) -> FederatedData:
    dim, classes = int(cfg.dim), int(cfg.classes)
    tf, s = float(cfg.test_fraction), float(cfg.size_sigma)
    std_x = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2) ** 0.5  # sqrt(Sigma_jj)
    train, test_x, test_y = [], [], []
    for k in range(n_clients):
        rng = stream(seed, "data", "synthetic", k)
        u = rng.normal(0.0, cfg.alpha)
        B = rng.normal(0.0, cfg.beta)
        W = rng.normal(u, 1.0, (dim, classes))
        b = rng.normal(u, 1.0, classes)
        v = rng.normal(B, 1.0, dim)
        # Lognormal size with mean samples_per_client; at least min_samples stay for training.
        size = round(cfg.samples_per_client * math.exp(s * rng.standard_normal() - s * s / 2))
        n_test = max(1, round(tf * size))
        n_train = max(cfg.min_samples, size - n_test)
        x = v + rng.standard_normal((n_train + n_test, dim)) * std_x
        # einsum without optimize= uses numpy's own loops (no BLAS threading), so labels are
        # bitwise reproducible whatever the thread count of the process.
        logits = np.einsum("nd,dc->nc", x, W)
        logits += b
        y = logits.argmax(axis=1)
        x32 = torch.from_numpy(x.astype(np.float32))
        y64 = torch.from_numpy(y.astype(np.int64))
        train.append((x32[:n_train].clone(), y64[:n_train].clone()))
        test_x.append(x32[n_train:])
        test_y.append(y64[n_train:])
    return FederatedData(train, (torch.cat(test_x), torch.cat(test_y)), classes, (dim,))

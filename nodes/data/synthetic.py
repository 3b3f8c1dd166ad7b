"""Synthetic(alpha, beta) of Li et al., "Federated optimization in heterogeneous networks" (FedProx).

Per client k: u_k ~ N(0, alpha), B_k ~ N(0, beta), W_k ~ N(u_k, 1) (dim x classes),
b_k ~ N(u_k, 1), v_k ~ N(B_k, 1) per feature, x ~ N(v_k, Sigma) with Sigma = diag(j^-1.2),
y = argmax(W_k^T x + b_k) (= argmax softmax). As in the FedProx generator code, alpha and beta
are used as *standard deviations*. Client k draws from its own stream, so any process can build
client k alone, and its data do not depend on how many other clients there are. A share
`test_fraction` of every client's samples is pooled into the server's test set. `Synthetic` is the
dataset's spec: what a run knows of it from the data section alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np

from nodes.contracts.rng import stream, stream_uniforms
from nodes.data.federated import FederatedData, Samples, handed_over
from nodes.data.spec import DatasetSpec

if TYPE_CHECKING:
    from nodes.contracts.schema import Check, DataConfig

FLOAT64 = 8  # bytes of one of a client's draws
# A test set is built client by client, then joined: held twice, and each client's arrays apart.
TEST_ARRAYS_BYTES_PER_CLIENT = 2**10
SIZE_KEY = ("data", "synthetic", "size")  # each client's stream of its size


@dataclass
class _Client:
    rng: np.random.Generator  # drawn up to the samples
    W: np.ndarray
    b: np.ndarray
    v: np.ndarray
    n_train: int
    n_test: int


class SyntheticData(FederatedData):
    def __init__(self, cfg: DataConfig, n_clients: int, seed: int) -> None:
        self.cfg, self.n_clients, self.seed = cfg, n_clients, seed
        self.num_classes, self.input_shape = int(cfg.classes), (int(cfg.dim),)
        self.std_x = np.power(np.arange(1, cfg.dim + 1, dtype=np.float64), -1.2) ** 0.5  # sqrt(Sigma_jj)
        self._sizes: list[int] | None = None

    @property
    def sizes(self) -> list[int]:
        if self._sizes is None:
            drawn = stream_uniforms(self.seed, SIZE_KEY, np.arange(self.n_clients), 2)
            self._sizes = client_sizes(self.cfg, drawn)[0].tolist()
        return self._sizes

    def _draw(self, k: int) -> _Client:
        """Client k's parameters and sample counts: the head of its stream, cheap next to its samples."""
        cfg = self.cfg
        dim, classes = int(cfg.dim), int(cfg.classes)
        rng = stream(self.seed, "data", "synthetic", k)
        u = rng.normal(0.0, cfg.alpha)
        B = rng.normal(0.0, cfg.beta)
        W = rng.normal(u, 1.0, (dim, classes))
        b = rng.normal(u, 1.0, classes)
        v = rng.normal(B, 1.0, dim)
        n_train, n_test = client_sizes(cfg, stream(self.seed, *SIZE_KEY, k).random((1, 2)))
        return _Client(rng, W, b, v, int(n_train[0]), int(n_test[0]))

    def _samples(self, c: _Client, test: bool) -> Samples:
        # The training rows come first in the stream, the test rows after them: a client's training data
        # draws its rows alone (a Generator's first n draws are the same however many it is asked for)
        rows = c.rng.standard_normal((c.n_train + c.n_test if test else c.n_train, len(c.v)))
        x = c.v + (rows[c.n_train :] if test else rows) * self.std_x
        # einsum without optimize= uses numpy's own loops (no BLAS threading), so labels are
        # bitwise reproducible whatever the thread count of the process, and row by row.
        logits = np.einsum("nd,dc->nc", x, c.W)
        logits += c.b
        return x.astype(np.float32, order="C"), logits.argmax(axis=1).astype(np.int64, order="C")

    def drawn_test_nbytes(self) -> int:
        return test_nbytes(self.cfg, self.n_clients)

    def _build(self, k: int) -> Samples:
        return self._samples(self._draw(k), test=False)

    def test(self) -> Samples:
        """Every client's test rows; the sizes are drawn on the way (the server needs both). With
        data.max_test = N, the first N of them: clients in id order until N rows, the rest not drawn."""
        cap = int(self.cfg.max_test) or math.inf
        sizes, parts, rows = [], [], 0
        for k in range(self.n_clients):
            if rows >= cap:
                break
            c = self._draw(k)
            sizes.append(c.n_train)
            parts.append(self._samples(c, test=True))
            rows += len(parts[-1][1])
        if len(sizes) == self.n_clients:
            self._sizes = sizes
        x, y = np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])
        return (x[: self.cfg.max_test], y[: self.cfg.max_test]) if self.cfg.max_test else (x, y)


def client_sizes(cfg: DataConfig, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(training, test) samples of clients from their rows `u` of two uniforms, the first two of each one's own
    stream SIZE_KEY (for many clients at once: stream_uniforms, the same doubles): a lognormal size with mean
    samples_per_client, of which test_fraction (at least one) is test and at least min_samples stay for
    training. Its normal is Box-Muller's, through libm's log, cos and exp one value at a time (SIMD builds of
    numpy's may differ by an ulp between CPUs), so that a client drawn alone has the size all drawn at once give."""
    z = np.sqrt(-2.0 * _libm(math.log, 1.0 - u[:, 0])) * _libm(math.cos, 2.0 * math.pi * u[:, 1])
    s = float(cfg.size_sigma)
    size = np.rint(cfg.samples_per_client * _libm(math.exp, s * z - s * s / 2))
    n_test = np.maximum(1.0, np.rint(float(cfg.test_fraction) * size))
    return np.maximum(cfg.min_samples, size - n_test).astype(np.int64), n_test.astype(np.int64)


def _libm(f: Callable[[float], float], x: np.ndarray) -> np.ndarray:
    """f of each value of x, as float64."""
    return np.asarray(np.frompyfunc(f, 1, 1)(x), dtype=float)


def test_rows(cfg: DataConfig, n_clients: int) -> int:
    """The test set's rows as expected, from above: each client's mean share (sizes are lognormal), rounded,
    and at least one, so one more each; at most max_test."""
    every = math.ceil(n_clients * (cfg.samples_per_client * cfg.test_fraction + 1))
    return min(every, cfg.max_test) if cfg.max_test else every


def test_nbytes(cfg: DataConfig, n_clients: int) -> int:
    """The test set's bytes as expected (test_rows): float32 features and an int64 label a row."""
    return test_rows(cfg, n_clients) * (int(cfg.dim) * 4 + 8)


class Synthetic(DatasetSpec):
    """Synthetic(alpha, beta) (`SyntheticData`): drawn from the seed, no file; its keys are data.alpha,
    beta, dim, classes, samples_per_client, size_sigma and test_fraction."""

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (self.cfg.dim,)

    @property
    def classes(self) -> int:
        return self.cfg.classes

    def validate(self, n_clients: int, check: Check) -> None:
        cfg = self.cfg
        no_groups = "no groups unless data.partition = quantity on an image dataset"
        check(not cfg.groups, "data.groups", cfg.groups, no_groups)
        # Every client keeps at least min_samples for training; more than an average client
        # has would multiply the data (and the run time) instead of partitioning it.
        mean_train = max(1, int(cfg.samples_per_client * (1 - cfg.test_fraction)))
        check(
            cfg.min_samples <= mean_train,
            "data.min_samples",
            cfg.min_samples,
            f"at most {mean_train}, the mean training samples of a client "
            f"(data.samples_per_client={cfg.samples_per_client} x (1 - data.test_fraction={cfg.test_fraction:g}))",
        )

    def largest_client(self, n_clients: int) -> int:
        """The largest of n lognormal sizes: about their (1 - 1/(n+1)) quantile."""
        d = self.cfg
        z = NormalDist().inv_cdf(1 - 1 / (n_clients + 1))
        size = d.samples_per_client * math.exp(d.size_sigma * z - d.size_sigma**2 / 2)
        return max(d.min_samples, math.ceil(size * (1 - d.test_fraction)))

    def client_samples(self, n_clients: int) -> float:
        d = self.cfg
        return n_clients * max(d.samples_per_client * (1 - d.test_fraction), d.min_samples)

    def test_samples(self, n_clients: int) -> int:
        return test_rows(self.cfg, n_clients)

    def source_bytes(self, n_clients: int) -> int:
        """One client's float64 draws: W, its samples and their logits."""
        d = self.cfg
        biggest = self.largest_client(n_clients) / (1 - d.test_fraction)
        return int((d.dim * d.classes + biggest * (d.dim + d.classes)) * FLOAT64)

    def evaluator_bytes(self, n_clients: int) -> int:
        rows = self.test_samples(n_clients)
        drawn = min(n_clients, rows)  # clients whose rows are drawn: each gives at least one
        return 2 * rows * self.sample_bytes() + drawn * TEST_ARRAYS_BYTES_PER_CLIENT + self.source_bytes(n_clients)

    def server_bytes(self, n_clients: int) -> int:
        """One client's draws, or the test set where the server draws it for its evaluator
        (nodes.data.federated.ServerData), drawn as the evaluator draws it."""
        if handed_over(test_nbytes(self.cfg, n_clients)):
            return self.evaluator_bytes(n_clients)
        return self.source_bytes(n_clients)

    def load(self, n_clients: int, seed: int) -> FederatedData:
        return SyntheticData(self.cfg, n_clients, seed)

"""Sample indices per client: iid, Dirichlet label skew (plain and as the PFL-Non-IID generator
caps it), McMahan's shards, quantity skew by client group; and a client's train/test share."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from nodes.contracts.rng import stream
from nodes.contracts.schema import Partition

if TYPE_CHECKING:
    from nodes.contracts.schema import ClientGroup, DataConfig

# A partition's random source: the run's stream, or numpy's legacy RandomState (data.partition_seed).
Rng = np.random.Generator | np.random.RandomState


def partition_rng(cfg: DataConfig, seed: int) -> Rng:
    """The run's own partition stream, or (data.partition_seed >= 0) numpy's legacy global-style
    RandomState, with which the PFL-Non-IID generator (np.random.seed(1)) draws its files."""
    if cfg.partition_seed >= 0:
        return np.random.RandomState(cfg.partition_seed)
    return stream(seed, "partition")


def partition(cfg: DataConfig, labels: np.ndarray, n_clients: int, rng: Rng) -> list[np.ndarray]:
    """Sample indices per client, by data.partition."""
    if cfg.partition == Partition.IID:
        return partition_iid(len(labels), n_clients, rng)
    if cfg.partition == Partition.DIRICHLET:
        return partition_dirichlet(labels, n_clients, cfg.dirichlet_beta, cfg.min_samples, rng)
    if cfg.partition == Partition.DIRICHLET_CAPPED:
        return partition_dirichlet_capped(labels, n_clients, cfg.dirichlet_beta, cfg.min_samples, rng)
    if cfg.partition == Partition.SHARDS:
        return partition_shards(labels, n_clients, cfg.shards_per_client, rng)
    if cfg.partition == Partition.QUANTITY:
        sizes = group_sizes(cfg.groups)
        if len(sizes) != n_clients:
            raise ValueError(f"data.groups cover {len(sizes)} clients: expected clients.n={n_clients}")
        return partition_quantity(len(labels), sizes, rng)
    raise ValueError(f"data.partition = {cfg.partition!r}: expected {Partition.describe()}")


def group_sizes(groups: Iterable[ClientGroup]) -> list[int]:
    """Per-client sample counts of partition=quantity, in client-id order."""
    return [g.samples for g in groups for _ in range(g.clients)]


def partition_iid(n_samples: int, n_clients: int, rng: Rng) -> list[np.ndarray]:
    """A random permutation split into n_clients near-equal parts (sizes differ by at most 1)."""
    return [p.copy() for p in np.array_split(rng.permutation(n_samples), n_clients)]


def partition_shards(labels: np.ndarray, n_clients: int, shards_per_client: int, rng: Rng) -> list[np.ndarray]:
    """Pathological non-IID split of McMahan et al. (2017), "Communication-efficient learning
    of deep networks from decentralized data", Sec. 3: sort by label, cut into
    n_clients * shards_per_client near-equal shards, give every client shards_per_client
    random shards. Every sample goes to exactly one client."""
    labels = np.asarray(labels)
    n_shards = n_clients * shards_per_client
    if n_shards > len(labels):
        raise ValueError(f"cannot cut {len(labels)} samples into {n_clients}x{shards_per_client} shards")
    shuffled = rng.permutation(len(labels))  # random order within a label
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(by_label, n_shards)
    owners = rng.permutation(n_shards).reshape(n_clients, shards_per_client)
    return [rng.permutation(np.concatenate([shards[s] for s in row])) for row in owners]


def partition_quantity(n_samples: int, sizes: list[int], rng: Rng) -> list[np.ndarray]:
    """Quantity skew (Talaei & Izadi, Table I scenario 3): client i gets exactly sizes[i]
    samples, a random subset disjoint from every other client's; the rest go unused."""
    if sum(sizes) > n_samples or any(s < 0 for s in sizes):
        raise ValueError(f"cannot give clients {sum(sizes)} samples in all from {n_samples}")
    chosen = rng.permutation(n_samples)[: sum(sizes)]
    return [p.copy() for p in np.split(chosen, np.cumsum(sizes)[:-1])]


def partition_dirichlet(
    labels: np.ndarray, n_clients: int, beta: float, min_samples: int, rng: Rng, attempts: int = 10
) -> list[np.ndarray]:
    """Label skew after Hsu et al. (2019): for every class, the class's samples are split across
    clients in proportions drawn from Dir(beta, ..., beta).

    The draw is repeated (up to `attempts` times) until every client has at least
    `min_samples`; if that never happens, the poorest clients are topped up with random
    samples taken from the richest ones. Every sample goes to exactly one client.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if n_clients * min_samples > n:
        raise ValueError(f"cannot give {n_clients} clients {min_samples} samples each from {n} samples")
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(max(1, attempts)):
        buckets: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(n_clients, float(beta)))
            if not np.all(np.isfinite(p)) or p.sum() <= 0:  # guard against degenerate draws
                p = np.full(n_clients, 1.0 / n_clients)
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for j, part in enumerate(np.split(idx, cuts)):
                buckets[j].append(part)
        parts = [np.concatenate(b) for b in buckets]
        if min(len(p) for p in parts) >= min_samples:
            break
    else:
        parts = _top_up(parts, min_samples, rng)
    return [rng.permutation(p) for p in parts]


def partition_dirichlet_capped(
    labels: np.ndarray, n_clients: int, beta: float, min_samples: int, rng: Rng, attempts: int = 1000
) -> list[np.ndarray]:
    """Label skew as the PFL-Non-IID generator (used by the ALI-DPFL code) draws it: class by
    class (0, 1, ...), shuffle the class's samples, draw p ~ Dir(beta), zero the share of every
    client that already holds N / n_clients samples or more, renormalise, and cut. The whole
    draw is repeated until every client holds at least `min_samples`. The cap is what keeps
    client sizes within about N / n_clients, unlike `dirichlet`. With a legacy RandomState the
    draws are those of the generator, call for call."""
    labels = np.asarray(labels)
    n = len(labels)
    if n_clients * min_samples > n:
        raise ValueError(f"cannot give {n_clients} clients {min_samples} samples each from {n} samples")
    classes = int(labels.max()) + 1
    for _ in range(attempts):
        buckets: list[list[int]] = [[] for _ in range(n_clients)]
        for k in range(classes):
            idx = np.where(labels == k)[0]
            rng.shuffle(idx)
            p = rng.dirichlet(np.repeat(float(beta), n_clients))
            p = np.array([pj * (len(b) < n / n_clients) for pj, b in zip(p, buckets)])
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for b, part in zip(buckets, np.split(idx, cuts)):
                b.extend(part.tolist())
        if min(len(b) for b in buckets) >= min_samples:
            return [np.asarray(b, dtype=np.int64) for b in buckets]
    raise ValueError(
        f"data.partition = dirichlet_capped: no draw in {attempts} gave every client "
        f"data.min_samples = {min_samples} samples (lower it or raise data.dirichlet_beta)"
    )


def _top_up(parts: list[np.ndarray], min_samples: int, rng: Rng) -> list[np.ndarray]:
    parts = [p.copy() for p in parts]
    for j in range(len(parts)):
        while len(parts[j]) < min_samples:
            donor = int(np.argmax([len(p) for p in parts]))
            take = min(min_samples - len(parts[j]), len(parts[donor]) - min_samples)
            pick = rng.permutation(len(parts[donor]))
            parts[j] = np.concatenate([parts[j], parts[donor][pick[:take]]])
            parts[donor] = np.delete(parts[donor], pick[:take])
    return parts


def split_share(idx: np.ndarray, train_fraction: float, rng: Rng) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) of one client's share, as sklearn's train_test_split(train_size=f, shuffle=True)
    that PFL-Non-IID calls: floor(f n) for training, the rest for test, one permutation drawn."""
    n_train = math.floor(train_fraction * len(idx))
    perm = rng.permutation(len(idx))
    n_test = len(idx) - n_train
    return idx[perm[n_test:]], idx[perm[:n_test]]

import gzip
import hashlib
import io
import math
import os
import pickle
import tarfile
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest
import torch

from emulator.config import ConfigError, check
from nodes.contracts.rng import stream
from nodes.contracts.schema import ClientGroup, DataConfig
from nodes.data import DATASETS, cifar, federated, load_federated, load_server_data, locate, validate_data
from nodes.data.cache import ClientCache
from nodes.data.catalog import CIFAR10, MNIST, FashionMNIST
from nodes.data.cifar import CIFAR_BATCHES, CIFAR_DIR, CIFAR_TARBALL, CIFARFormatError
from nodes.data.federated import FederatedData
from nodes.data.fetch import ChecksumError, md5_of
from nodes.data.idx import (
    IDX_FILES,
    IMAGES_MAGIC,
    LABELS_MAGIC,
    IDXFormatError,
    read_idx,
)
from nodes.data.locate import DatasetNotFound
from nodes.data.partition import (
    partition_dirichlet,
    partition_iid,
    partition_quantity,
    partition_shards,
)
from nodes.data.synthetic import SyntheticData
from tests.conftest import python_stdout
from tests.datasets import needs_fashion_mnist

UNREACHABLE = "file:///nonexistent-dpfl-mirror/"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No test touches the network: every official URL points at a missing local file."""
    for dataset in (FashionMNIST, MNIST, CIFAR10):
        monkeypatch.setattr(dataset, "mirrors", (UNREACHABLE,))


@pytest.fixture
def no_system_dirs(monkeypatch, tmp_path):
    """The standard system locations are empty (the real FashionMNIST may be installed)."""
    monkeypatch.setattr(locate, "SYSTEM_DIR", tmp_path / "system")


def image_cfg(tmp_path, **kw) -> DataConfig:
    """An image-dataset config whose cache lives under tmp_path; no download unless asked. Pixels
    are checked as decoded (normalize=none); normalisation has its own tests (test_reproduction)."""
    kw.setdefault("download", False)
    kw.setdefault("normalize", "none")
    return DataConfig(cache_dir=str(tmp_path / "cache"), **kw)


def clients(fd: FederatedData) -> list[tuple[np.ndarray, np.ndarray]]:
    return [fd.client(k) for k in range(fd.n_clients)]


def digest(fd: FederatedData) -> str:
    h = hashlib.sha256()
    for x, y in clients(fd) + [fd.test()]:
        h.update(x.tobytes())
        h.update(y.tobytes())
    return h.hexdigest()


# --- synthetic --------------------------------------------------------------------------


def test_synthetic_shapes_and_ranges():
    cfg = DataConfig(dim=20, classes=5, samples_per_client=50)
    fd = load_federated(cfg, 7, seed=3)
    assert len(clients(fd)) == 7
    assert fd.num_classes == 5 and fd.input_shape == (20,)
    for x, y in clients(fd):
        assert x.dtype == np.float32 and y.dtype == np.int64
        assert x.ndim == 2 and x.shape[1] == 20 and x.shape[0] == y.shape[0]
        assert len(y) >= cfg.min_samples
        assert 0 <= int(y.min()) and int(y.max()) < 5
    tx, ty = fd.test()
    assert len(ty) > 0 and tx.shape == (len(ty), 20) and tx.dtype == np.float32
    assert int(ty.max()) < 5
    # every client contributes roughly test_fraction of its samples to the pooled test set
    n_train = sum(fd.sizes)
    assert 0.1 < len(ty) / (n_train + len(ty)) < 0.3
    # labels are not degenerate: more than one class overall
    assert len(np.unique(np.concatenate([y for _, y in clients(fd)]))) > 1


def test_synthetic_deterministic():
    cfg = DataConfig()
    a, b = load_federated(cfg, 5, seed=1), load_federated(cfg, 5, seed=1)
    for (xa, ya), (xb, yb) in zip(clients(a) + [a.test()], clients(b) + [b.test()]):
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    c = load_federated(cfg, 5, seed=2)
    assert not np.array_equal(a.client(0)[0][:5], c.client(0)[0][:5])
    assert digest(a) != digest(c)


def test_synthetic_identical_in_another_process():
    cfg = DataConfig(samples_per_client=40)
    here = digest(load_federated(cfg, 4, seed=11))
    code = (
        "import hashlib;from nodes.contracts.schema import DataConfig;from nodes.data import load_federated;"
        "fd=load_federated(DataConfig(samples_per_client=40),4,seed=11);h=hashlib.sha256()\n"
        "for x,y in [fd.client(k) for k in range(4)]+[fd.test()]:\n"
        " h.update(x.tobytes()); h.update(y.tobytes())\n"
        "print(h.hexdigest())"
    )
    assert python_stdout(code, env={"OMP_NUM_THREADS": "1"}) == here


def test_synthetic_numbers_are_those_of_the_eager_build():
    """Built client by client, the data are bit for bit those every process built whole before."""
    fd = load_federated(DataConfig(samples_per_client=40), 4, seed=11)
    # The features' scales j^-0.6 come from np.power, which numpy computes with SVML (a few ulps off) on
    # an AVX-512 CPU and with libm's pow elsewhere: the pinned bytes take libm's, which math.pow gives
    # on any CPU, so that they pin the streams and the arithmetic after them, not one CPU's pow
    libm = np.sqrt([math.pow(j, -1.2) for j in range(1, fd.cfg.dim + 1)])
    np.testing.assert_allclose(fd.std_x, libm, rtol=2e-15, atol=0)  # SVML's pow: within 4 ulps
    fd.std_x = libm
    assert digest(fd) == "30d20a2f1029fc9762dee081974235b4c65e1ecb4431177f9b87536e286f17b8"


def test_synthetic_sizes_drawn_for_all_at_once_are_each_clients_own():
    """The server draws every size on arrays (stream_uniforms); a worker draws one client's from its own
    generator: the same counts, ids near 2^32 included, lognormal with mean samples_per_client."""
    from nodes.contracts.rng import stream_uniforms
    from nodes.data.synthetic import SIZE_KEY, SyntheticData, client_sizes

    cfg = DataConfig(samples_per_client=50, size_sigma=1.0)
    n = 20_000
    fd = SyntheticData(cfg, n, seed=5)
    ids = [*range(300), n - 1]
    assert [fd._draw(k).n_train for k in ids] == [fd.sizes[k] for k in ids]
    train, test = client_sizes(cfg, stream_uniforms(5, SIZE_KEY, np.arange(n), 2))
    assert [fd._draw(k).n_test for k in ids] == test[ids].tolist() and train.tolist() == fd.sizes
    assert (train + test).mean() == pytest.approx(50, rel=0.03)  # the mean's sd: 50 sqrt(e - 1) / sqrt(n), 0.9 %
    far = SyntheticData(cfg, 2**32, seed=5)._draw(2**32 - 1)
    last = client_sizes(cfg, stream_uniforms(5, SIZE_KEY, np.array([2**32 - 1]), 2))
    assert (far.n_train, far.n_test) == (int(last[0][0]), int(last[1][0]))


def test_a_client_built_alone_in_another_process_is_the_same():
    cfg = DataConfig(samples_per_client=40)
    here = load_federated(cfg, 50, seed=11).client(37)
    code = (
        "from nodes.contracts.schema import DataConfig;from nodes.data import load_federated;"
        "x,y=load_federated(DataConfig(samples_per_client=40),50,seed=11).client(37);"
        "print(x.tobytes().hex(), y.tobytes().hex())"
    )
    assert python_stdout(code, env={"OMP_NUM_THREADS": "1"}).split() == [
        here[0].tobytes().hex(),
        here[1].tobytes().hex(),
    ]


def test_synthetic_sizes_and_test_set_draw_no_client_training_samples(monkeypatch):
    """The server's part (sizes, test set) never labels a client's training rows."""
    fd = load_federated(DataConfig(samples_per_client=40), 30, seed=4)
    want = [len(y) for _, y in clients(fd)], fd.test()
    labelled = []
    real_einsum = np.einsum

    def einsum(spec, x, w):
        labelled.append(len(x))
        return real_einsum(spec, x, w)

    monkeypatch.setattr(np, "einsum", einsum)
    fresh = load_federated(DataConfig(samples_per_client=40), 30, seed=4)
    assert fresh.sizes == want[0] and not labelled  # sizes: no sample is drawn
    tx, ty = fresh.test()
    assert np.array_equal(tx, want[1][0]) and np.array_equal(ty, want[1][1])
    assert sum(labelled) == len(ty)  # only the test rows were labelled


@pytest.mark.parametrize("image", [True, False])
def test_the_server_data_are_the_sizes_a_samples_shape_and_a_drawn_test_set(tmp_path, image):
    """An image dataset's test set is its evaluator's to read; a synthetic one the server draws (for
    its evaluator to take, nodes/transport/evaluator.py), bit for bit the one the evaluator would draw."""
    write_dataset(tmp_path, n_train=120)
    cfg = (
        DataConfig(dataset="mnist", root=str(tmp_path), partition="dirichlet", min_samples=5, split="per_client")
        if image
        else DataConfig(samples_per_client=40)
    )
    fd, server = load_federated(cfg, 6, seed=2), load_server_data(cfg, 6, seed=2)
    shape = {"sizes": fd.sizes, "num_classes": fd.num_classes, "input_shape": fd.input_shape}
    assert {k: v for k, v in vars(server).items() if k != "test"} == shape
    assert server.sizes == [len(y) for _, y in clients(fd)]
    if image:
        assert server.test is None
    else:
        assert server.test is not None and all(np.array_equal(a, b) for a, b in zip(server.test, fd.test()))
        assert_fresh_arrays(*server.test, (60,))


def test_a_drawn_test_set_over_the_handover_limit_is_left_to_the_evaluator(monkeypatch):
    cfg = DataConfig(samples_per_client=40, max_test=30)
    nbytes = load_federated(cfg, 6, seed=2).drawn_test_nbytes()
    assert nbytes == 30 * (60 * 4 + 8)  # max_test rows of 60 float32 features and an int64 label
    monkeypatch.setattr(federated, "HANDOVER_BYTES", nbytes)
    assert len(load_server_data(cfg, 6, seed=2).test[1]) == 30
    monkeypatch.setattr(federated, "HANDOVER_BYTES", nbytes - 1)
    assert load_server_data(cfg, 6, seed=2).test is None


# Imports every module of nodes.data and loads every kind of dataset as the server and a worker do,
# in a process of its own, then prints the modules of torch imported: none, so that the server can
# load its data and test set before it imports torch.
LOAD_WITHOUT_TORCH = """
import importlib, json, pkgutil, sys
from pathlib import Path
import nodes.data
from nodes.data import dataset_spec, load_federated, load_server_data
from nodes.contracts.schema import DataConfig
for m in pkgutil.iter_modules(nodes.data.__path__):
    importlib.import_module("nodes.data." + m.name)
from nodes.data import cifar
from nodes.data.catalog import CIFAR10
from nodes.data.fetch import md5_of
mnist, root = sys.argv[1:]
CIFAR10.md5 = {**CIFAR10.md5, **{n: md5_of(Path(root) / cifar.CIFAR_DIR / n) for n in cifar.CIFAR_BATCHES}}
for cfg in (DataConfig(samples_per_client=40),
            DataConfig(dataset="mnist", root=mnist, min_samples=5, normalize="standard", download=False),
            DataConfig(dataset="mnist", root=mnist, min_samples=5, split="per_client", download=False),
            DataConfig(dataset="cifar10", root=root, min_samples=5, download=False)):
    server = load_server_data(cfg, 4, seed=0)
    x, y = load_federated(cfg, 4, seed=0).client(3)
    dataset_spec(cfg).pixel_extremes()
    assert len(server.sizes) == 4 and len(load_federated(cfg, 4, seed=0).test()[1]) > 0 and len(y) > 0
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "torch")))
"""


def test_loading_any_dataset_imports_no_torch(tmp_path):
    write_dataset(tmp_path / "mnist")
    write_cifar(tmp_path / CIFAR_DIR)
    assert python_stdout(LOAD_WITHOUT_TORCH, str(tmp_path / "mnist"), str(tmp_path)).splitlines()[-1] == "[]"


def assert_fresh_arrays(x, y, n_features):
    """Numpy arrays that torch takes as they are: float32 / int64, C-contiguous, writable, shared
    by `torch.from_numpy` without a copy or a warning."""
    assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray)
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert x.shape[1:] == n_features and x.shape[0] == y.shape[0] > 0 and y.ndim == 1
    for a in (x, y):
        assert a.flags.c_contiguous and a.flags.writeable
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            t = torch.from_numpy(a)
        assert t.is_contiguous() and t.data_ptr() == a.ctypes.data


@pytest.mark.parametrize("dataset", ["synthetic", "mnist", "mnist_per_client", "cifar10"])
def test_samples_are_new_contiguous_writable_numpy_arrays(tmp_path, monkeypatch, no_system_dirs, dataset):
    if dataset == "synthetic":
        cfg, shape = DataConfig(dim=20, samples_per_client=40), (20,)
    elif dataset == "cifar10":
        write_cifar(tmp_path / CIFAR_DIR)
        register_cifar(monkeypatch, tmp_path / CIFAR_DIR)
        cfg, shape = image_cfg(tmp_path, dataset="cifar10", root=str(tmp_path), min_samples=5), (3, 32, 32)
    else:
        write_dataset(tmp_path)
        split = "per_client" if dataset == "mnist_per_client" else "official"
        cfg, shape = DataConfig(dataset="mnist", root=str(tmp_path), min_samples=5, split=split), (1, 28, 28)
    fd, other = load_federated(cfg, 3, seed=0), load_federated(cfg, 3, seed=0)
    for x, y in clients(fd) + [fd.test(), other.test()]:
        assert_fresh_arrays(x, y, shape)
    # every call builds arrays of its own: writing into one changes no other, nor the next build
    (x0, y0), (tx, ty) = fd.client(0), fd.test()
    x0[:] = tx[:] = -1
    y0[:] = ty[:] = -1
    assert (fd.client(0)[1] >= 0).all() and (fd.test()[1] >= 0).all() and (other.test()[1] >= 0).all()
    assert (fd.client(0)[0] != -1).any() and (fd.test()[0] != -1).any()


def test_a_client_id_out_of_range_is_refused():
    fd = load_federated(DataConfig(), 3, seed=0)
    for k in (-1, 3):
        with pytest.raises(IndexError, match=r"expected an id in \[0, 3\)"):
            fd.client(k)


def test_the_cache_keeps_the_latest_clients_within_its_bytes():
    built = []

    def get(k):
        def build():
            built.append(k)
            return torch.zeros(k + 1, 10), torch.zeros(k + 1, dtype=torch.int64)  # 48 bytes a row

        return cache.get((k, -1), build)

    cache = ClientCache(max_bytes=5 * 48)
    first = get(0)
    assert get(0) is first and built == [0]  # a hit builds nothing
    get(1)
    get(0)  # now 1 is the least recently used
    get(2)  # 1 + 2 + 3 rows > 5: client 1 goes
    assert list(cache.entries) == [(0, -1), (2, -1)] and cache.nbytes == 4 * 48
    get(1)
    assert built == [0, 1, 2, 1]
    get(9)  # bigger than the bound alone: kept, everything else goes
    assert list(cache.entries) == [(9, -1)] and cache.nbytes == 10 * 48


def test_a_trainer_builds_only_the_clients_it_trains(monkeypatch):
    from emulator.config import load
    from nodes.contracts.tasks import ClientTask
    from nodes.training.trainer import build_trainer, state_to_numpy

    cfg = load(None, ["clients.n=50"])
    data = load_federated(cfg.data, cfg.clients.n, cfg.seed)
    built, build = [], data.client

    def client(k):
        built.append(k)
        return build(k)

    monkeypatch.setattr(data, "client", client)
    trainer = build_trainer(cfg, data, torch.device("cpu"))
    assert built == []
    w0 = state_to_numpy(trainer.model)
    for rnd, k in [(0, 7), (1, 7), (1, 3)]:
        trainer.train(rnd, ClientTask(client=k, steps=1, lr=0.1, sigma=1.0, clip=1.0, q=0.1), w0)
    assert built == [7, 3]


def test_synthetic_client_data_independent_of_client_count():
    cfg = DataConfig(samples_per_client=30)
    small, big = load_federated(cfg, 3, seed=5), load_federated(cfg, 6, seed=5)
    for k in range(3):
        assert np.array_equal(small.client(k)[0], big.client(k)[0])


def test_synthetic_min_samples_and_sizes():
    cfg = DataConfig(samples_per_client=20, min_samples=60, size_sigma=1.5)
    fd = load_federated(cfg, 20, seed=0)
    assert min(fd.sizes) >= 60
    eq = load_federated(replace(cfg, min_samples=1, samples_per_client=100, size_sigma=0.0), 5, seed=0)
    assert eq.sizes == [80] * 5 and len(eq.test()[1]) == 5 * 20
    het = load_federated(replace(cfg, min_samples=1, samples_per_client=100, size_sigma=1.0), 30, seed=0)
    assert len(set(het.sizes)) > 10


def test_synthetic_heterogeneity_alpha_beta():
    # Synthetic(0, 0): all clients share u=B=0 in expectation -> feature means near each other;
    # Synthetic(0, 5): client feature means differ a lot.
    def spread(beta):
        fd = load_federated(DataConfig(alpha=0.0, beta=beta, samples_per_client=300), 10, seed=0)
        means = np.stack([x.mean() for x, _ in clients(fd)])
        return float(means.std(ddof=1))

    assert spread(5.0) > 3 * spread(0.0)


# --- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg, n, key",
    [
        (DataConfig(dataset="cifar"), 5, "data.dataset"),
        (DataConfig(test_fraction=0.0), 5, "data.test_fraction"),
        (DataConfig(classes=1), 5, "data.classes"),
        (DataConfig(min_samples=0), 5, "data.min_samples"),
        (DataConfig(size_sigma=-1.0), 5, "data.size_sigma"),
        (DataConfig(dataset="fashion_mnist", partition="random"), 5, "data.partition"),
        (DataConfig(dataset="cifar10", partition="shards", shards_per_client=0), 5, "data.shards_per_client"),
        (
            DataConfig(dataset="mnist", partition="shards", max_train=100, shards_per_client=2, min_samples=20),
            10,
            "data.shards_per_client",
        ),
        (DataConfig(dataset="mnist", partition="quantity"), 5, "data.groups"),
        (DataConfig(dataset="mnist", partition="quantity", groups=[ClientGroup(3, 50)]), 5, "data.groups"),
        (DataConfig(dataset="mnist", partition="quantity", groups=[ClientGroup(5, 5)]), 5, r"data.groups[0].samples"),
        (
            DataConfig(dataset="mnist", partition="quantity", groups=[ClientGroup(0, 50), ClientGroup(5, 50)]),
            5,
            r"data.groups[0].clients",
        ),
        (
            DataConfig(dataset="mnist", partition="quantity", max_train=100, groups=[ClientGroup(5, 30)]),
            5,
            "data.groups",
        ),
        (DataConfig(dataset="mnist", partition="iid", groups=[ClientGroup(5, 30)]), 5, "data.groups"),
        (DataConfig(groups=[ClientGroup(5, 30)]), 5, "data.groups"),
        (DataConfig(dataset="fashion_mnist", partition="dirichlet", dirichlet_beta=0.0), 5, "data.dirichlet_beta"),
        (DataConfig(dataset="mnist", max_train=100, min_samples=30), 5, "data.min_samples"),
        (DataConfig(dataset="mnist", max_test=-1), 5, "data.max_test"),
    ],
)
def test_validate_data_rejects(cfg, n, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        validate_data(cfg, n, check)


def test_validate_data_accepts_defaults_without_files():
    validate_data(DataConfig(), 100, check)
    validate_data(DataConfig(dataset="mnist", root="/nonexistent", partition="dirichlet"), 100, check)
    validate_data(DataConfig(dataset="mnist", max_train=100, min_samples=20), 5, check)
    validate_data(DataConfig(dataset="cifar10", partition="shards", shards_per_client=3), 100, check)
    talaei_3 = [ClientGroup(20, 50), ClientGroup(20, 120), ClientGroup(20, 271)]
    validate_data(DataConfig(dataset="mnist", partition="quantity", groups=talaei_3), 60, check)


# --- IDX files --------------------------------------------------------------------------


def write_idx(path: Path, arr: np.ndarray, magic: int, gz: bool) -> Path:
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    data = header + arr.tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def fake_images(n, offset=0):
    rng = np.random.default_rng(offset)
    imgs = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    imgs[:, 0, 0] = np.arange(n) + offset  # sample id, to recover assignments
    return imgs


def write_dataset(d: Path, n_train=60, n_test=20, gz=True):
    d.mkdir(parents=True, exist_ok=True)
    tr, te = fake_images(n_train), fake_images(n_test, offset=100)
    write_idx(d / IDX_FILES["train_images"], tr, IMAGES_MAGIC, gz)
    write_idx(d / IDX_FILES["train_labels"], np.arange(n_train) % 10, LABELS_MAGIC, gz)
    write_idx(d / IDX_FILES["test_images"], te, IMAGES_MAGIC, gz)
    write_idx(d / IDX_FILES["test_labels"], (np.arange(n_test) * 3) % 10, LABELS_MAGIC, gz)
    return tr, te


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_round_trip(tmp_path, gz):
    imgs = fake_images(7)
    p = write_idx(tmp_path / "x-idx3-ubyte", imgs, IMAGES_MAGIC, gz)
    got = read_idx(p, IMAGES_MAGIC)
    assert got.dtype == np.uint8 and got.shape == (7, 28, 28) and np.array_equal(got, imgs)
    lab = write_idx(tmp_path / "y-idx1-ubyte", np.array([3, 1, 4, 1, 5]), LABELS_MAGIC, gz)
    assert read_idx(lab, LABELS_MAGIC).tolist() == [3, 1, 4, 1, 5]


@pytest.mark.parametrize("gz", [True, False])
def test_load_image_dataset_from_root(tmp_path, gz):
    tr, te = write_dataset(tmp_path, gz=gz)
    cfg = DataConfig(dataset="mnist", root=str(tmp_path), partition="iid", min_samples=5, normalize="none")
    fd = load_federated(cfg, 4, seed=0)
    assert fd.input_shape == (1, 28, 28) and fd.num_classes == 10 and len(clients(fd)) == 4
    assert fd.sizes == [15, 15, 15, 15]
    ids = []
    for x, y in clients(fd):
        assert x.dtype == np.float32 and x.shape[1:] == (1, 28, 28) and y.dtype == np.int64
        assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
        idx = np.round(x[:, 0, 0, 0] * 255).astype(np.int64)
        assert np.array_equal(y, idx % 10)  # labels travel with their images
        assert torch.equal(torch.from_numpy(x), torch.from_numpy(tr[idx]).float().div(255).unsqueeze(1))
        ids += idx.tolist()
    assert sorted(ids) == list(range(60))  # iid: every sample exactly once
    tx, ty = fd.test()
    assert tx.shape == (20, 1, 28, 28)
    assert torch.equal(torch.from_numpy(tx), torch.from_numpy(te).float().div(255).unsqueeze(1))
    assert ty.tolist() == ((np.arange(20) * 3) % 10).tolist()


def test_max_train_max_test_and_torchvision_layout(tmp_path):
    write_dataset(tmp_path / "MNIST" / "raw", gz=False)
    cfg = DataConfig(dataset="mnist", root=str(tmp_path), max_train=30, max_test=8, min_samples=1, normalize="none")
    fd = load_federated(cfg, 3, seed=0)
    assert sum(fd.sizes) == 30 and len(fd.test()[1]) == 8
    ids = sorted(round(v) for x, _ in clients(fd) for v in (x[:, 0, 0, 0] * 255).tolist())
    assert ids == list(range(30))  # the first 30


def test_wrong_magic_names_file(tmp_path):
    write_dataset(tmp_path)
    bad = write_idx(tmp_path / IDX_FILES["train_labels"], np.zeros(60), IMAGES_MAGIC, gz=True)
    with pytest.raises(IDXFormatError, match=r"train-labels-idx1-ubyte\.gz.*magic number 2051, expected 2049"):
        load_federated(DataConfig(dataset="mnist", root=str(tmp_path), min_samples=1), 2, seed=0)
    with pytest.raises(IDXFormatError, match=str(bad.name)):
        read_idx(bad, LABELS_MAGIC)


def test_truncated_and_mismatched_files(tmp_path):
    p = write_idx(tmp_path / "a-idx3-ubyte", fake_images(5), IMAGES_MAGIC, gz=False)
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(IDXFormatError, match=r"a-idx3-ubyte.*shape"):
        read_idx(p, IMAGES_MAGIC)
    write_dataset(tmp_path / "d")
    write_idx(tmp_path / "d" / IDX_FILES["test_labels"], np.zeros(19), LABELS_MAGIC, gz=True)
    with pytest.raises(IDXFormatError, match="t10k-labels"):
        load_federated(DataConfig(dataset="mnist", root=str(tmp_path / "d"), min_samples=1), 2, seed=0)


def test_dpfl_system_datasets_moves_the_system_locations(tmp_path):
    """In a fresh process (the locations are read at import, as each worker reads them): an empty folder
    hides the installed datasets; one holding a dataset's folder is where it is found."""
    code = "from nodes.data.catalog import MNIST; print([str(d) for d in MNIST.standard_dirs()], MNIST.installed())"
    env = {locate.SYSTEM_DIR_VARIABLE: str(tmp_path)}
    assert python_stdout(code, env=env) == f"[{str(tmp_path / 'mnist')!r}] None"
    (tmp_path / "mnist").mkdir()
    assert python_stdout(code, env=env).endswith(f"] {tmp_path / 'mnist'}")


def test_missing_dataset_names_where_it_looked(tmp_path, no_system_dirs):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetNotFound) as e:
        load_federated(image_cfg(tmp_path, dataset="fashion_mnist", root=str(missing)), 2, seed=0)
    msg = str(e.value)
    assert "\n" not in msg and "fashion_mnist" in msg and str(missing) in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "data.root" in msg
    assert str(tmp_path / "cache" / "fashion_mnist") in msg and "data.download=false" in msg
    # three of the four files is still "not found"
    write_dataset(tmp_path / "partial")
    (tmp_path / "partial" / (IDX_FILES["test_images"] + ".gz")).unlink()
    with pytest.raises(DatasetNotFound, match="partial"):
        load_federated(image_cfg(tmp_path, dataset="mnist", root=str(tmp_path / "partial")), 2, seed=0)


# --- downloads (from file:// URLs the tests write; no network) ----------------------------


def serve_idx(monkeypatch, server: Path, dataset="mnist", gz=True) -> dict[str, str]:
    """Official-looking .gz files in `server`, registered as the official md5s and the mirror
    behind one unreachable mirror; returns name -> md5."""
    write_dataset(server, gz=gz)
    md5 = {f"{stem}.gz": md5_of(server / f"{stem}.gz") for stem in IDX_FILES.values()}
    monkeypatch.setattr(DATASETS.get(dataset), "md5", md5)
    monkeypatch.setattr(DATASETS.get(dataset), "mirrors", (UNREACHABLE, server.as_uri() + "/"))
    return md5


def test_download_idx_verifies_and_caches(tmp_path, monkeypatch, no_system_dirs):
    md5 = serve_idx(monkeypatch, tmp_path / "server")
    cfg = image_cfg(tmp_path, dataset="mnist", download=True, min_samples=5)
    fd = load_federated(cfg, 3, seed=0)
    assert sum(fd.sizes) == 60 and len(fd.test()[1]) == 20
    cache = tmp_path / "cache" / "mnist"
    assert sorted(p.name for p in cache.iterdir()) == sorted(md5)  # no leftover .part files
    assert all(md5_of(cache / name) == m for name, m in md5.items())
    # offline afterwards: the verified cache is enough
    monkeypatch.setattr(MNIST, "mirrors", (UNREACHABLE,))
    assert digest(load_federated(replace(cfg, download=False), 3, seed=0)) == digest(fd)


def test_download_resumes_a_partial_cache(tmp_path, monkeypatch, no_system_dirs):
    md5 = serve_idx(monkeypatch, tmp_path / "server")
    cache = tmp_path / "cache" / "mnist"
    cache.mkdir(parents=True)
    name = IDX_FILES["train_labels"] + ".gz"
    (cache / name).write_bytes((tmp_path / "server" / name).read_bytes())
    load_federated(image_cfg(tmp_path, dataset="mnist", download=True, min_samples=5), 3, seed=0)
    assert sorted(p.name for p in cache.iterdir()) == sorted(md5)


def test_corrupted_download_is_a_checksum_error_naming_the_file(tmp_path, monkeypatch, no_system_dirs):
    serve_idx(monkeypatch, tmp_path / "server")
    bad = tmp_path / "server" / (IDX_FILES["test_images"] + ".gz")
    raw = bad.read_bytes()
    bad.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0xFF]))
    with pytest.raises(ChecksumError, match=r"t10k-images-idx3-ubyte\.gz.*md5"):
        load_federated(image_cfg(tmp_path, dataset="mnist", download=True, min_samples=5), 3, seed=0)
    assert not (tmp_path / "cache" / "mnist" / bad.name).exists()  # nothing unverified is kept


def test_corrupted_cache_file_is_a_checksum_error_naming_the_file(tmp_path, monkeypatch, no_system_dirs):
    serve_idx(monkeypatch, tmp_path / "server")
    cfg = image_cfg(tmp_path, dataset="mnist", download=True, min_samples=5)
    load_federated(cfg, 3, seed=0)
    cached = tmp_path / "cache" / "mnist" / (IDX_FILES["train_images"] + ".gz")
    cached.write_bytes(b"\x1f\x8b" + cached.read_bytes()[2:-4])
    with pytest.raises(ChecksumError, match=str(cached)):
        load_federated(cfg, 3, seed=0)


def test_offline_and_missing_is_one_clear_error(tmp_path, no_system_dirs):
    cfg = image_cfg(tmp_path, dataset="mnist", download=True)
    with pytest.raises(DatasetNotFound) as e:
        load_federated(cfg, 2, seed=0)
    msg = str(e.value)
    assert "\n" not in msg and "download from " + UNREACHABLE in msg and "No such file" in msg
    assert str(tmp_path / "cache" / "mnist") in msg and "data.root" in msg


# --- CIFAR-10 -----------------------------------------------------------------------------


def cifar_batch(n: int, offset: int) -> dict:
    """A batch in the official layout: rows of 3072 bytes (1024 R, 1024 G, 1024 B, row-major)."""
    rng = np.random.default_rng(offset)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    data[:, 0] = np.arange(n) + offset  # sample id in the first red pixel
    return {
        b"batch_label": b"batch",
        b"labels": [int(i) % 10 for i in np.arange(n) + offset],
        b"data": data,
        b"filenames": [b"x.png"] * n,
    }


def write_cifar(d: Path, n: int = 12) -> dict[str, np.ndarray]:
    d.mkdir(parents=True, exist_ok=True)
    batches = {}
    for k, name in enumerate(CIFAR_BATCHES):
        batches[name] = cifar_batch(n, offset=k * n)
        (d / name).write_bytes(pickle.dumps(batches[name], protocol=2))
    return batches


def register_cifar(monkeypatch, d: Path) -> None:
    """Make the md5s of the batches in `d` the 'official' ones."""
    monkeypatch.setattr(CIFAR10, "md5", {**CIFAR10.md5, **{name: md5_of(d / name) for name in CIFAR_BATCHES}})


def cifar_tarball(path: Path, batches_dir: Path, extra: Mapping[str, bytes] = MappingProxyType({})) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name in CIFAR_BATCHES:
            tar.add(batches_dir / name, arcname=f"{CIFAR_DIR}/{name}")
        for arcname, payload in extra.items():
            info = tarfile.TarInfo(arcname)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def test_cifar_loads_from_root(tmp_path, monkeypatch, no_system_dirs):
    batches = write_cifar(tmp_path / "root" / CIFAR_DIR)
    register_cifar(monkeypatch, tmp_path / "root" / CIFAR_DIR)
    fd = load_federated(image_cfg(tmp_path, dataset="cifar10", root=str(tmp_path / "root"), min_samples=5), 4, seed=0)
    assert fd.input_shape == (3, 32, 32) and fd.num_classes == 10 and sum(fd.sizes) == 60
    train = np.concatenate([batches[f"data_batch_{k}"][b"data"] for k in range(1, 6)])
    ids = []
    for x, y in clients(fd):
        assert x.dtype == np.float32 and x.shape[1:] == (3, 32, 32) and y.dtype == np.int64
        assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
        idx = np.round(x[:, 0, 0, 0] * 255).astype(np.int64)
        assert np.array_equal(y, idx % 10)
        assert torch.equal(torch.from_numpy(x), torch.from_numpy(train[idx].reshape(-1, 3, 32, 32)).float().div(255))
        ids += idx.tolist()
    assert sorted(ids) == list(range(60))
    tx, ty = fd.test()
    assert tx.shape == (12, 3, 32, 32) and ty.tolist() == batches["test_batch"][b"labels"]
    # channel-major rows: green starts at byte 1024, blue at 2048
    row = batches["test_batch"][b"data"][3]
    assert tx[3, 1, 0, 0] == np.float32(row[1024]) / 255 and tx[3, 2, 31, 31] == np.float32(row[3071]) / 255


def test_cifar_corrupted_batch_names_the_file(tmp_path, monkeypatch, no_system_dirs):
    d = tmp_path / CIFAR_DIR
    write_cifar(d)
    register_cifar(monkeypatch, d)
    (d / "data_batch_3").write_bytes((d / "data_batch_3").read_bytes()[:-2])
    with pytest.raises(ChecksumError, match="data_batch_3"):
        load_federated(image_cfg(tmp_path, dataset="cifar10", root=str(tmp_path), min_samples=1), 2, seed=0)


def test_cifar_unpickler_refuses_foreign_globals(tmp_path, monkeypatch):
    d = tmp_path / CIFAR_DIR
    write_cifar(d)
    (d / "test_batch").write_bytes(pickle.dumps({b"data": os.system}, protocol=2))
    register_cifar(monkeypatch, d)  # even a file whose md5 is 'official' cannot run code
    with pytest.raises(CIFARFormatError, match=r"test_batch.*\.system is not allowed"):
        cifar.read_cifar_batch(d / "test_batch", CIFAR10.md5["test_batch"])


def test_cifar_download_extracts_only_the_batches(tmp_path, monkeypatch, no_system_dirs):
    src = tmp_path / "src"
    write_cifar(src)
    register_cifar(monkeypatch, src)
    (tmp_path / "server").mkdir()
    tarball = cifar_tarball(
        tmp_path / "server" / CIFAR_TARBALL, src, extra={"../escape": b"x", f"{CIFAR_DIR}/readme.html": b"<html>"}
    )
    monkeypatch.setattr(CIFAR10, "mirrors", (tarball.parent.as_uri() + "/",))
    monkeypatch.setitem(CIFAR10.md5, CIFAR_TARBALL, md5_of(tarball))
    cfg = image_cfg(tmp_path, dataset="cifar10", download=True, min_samples=5)
    fd = load_federated(cfg, 3, seed=0)
    assert sum(fd.sizes) == 60
    cache = tmp_path / "cache" / "cifar10"
    assert sorted(p.name for p in cache.iterdir()) == sorted([CIFAR_TARBALL, CIFAR_DIR])
    assert sorted(p.name for p in (cache / CIFAR_DIR).iterdir()) == sorted(CIFAR_BATCHES)
    assert not (tmp_path / "cache" / "escape").exists()
    monkeypatch.setattr(CIFAR10, "mirrors", (UNREACHABLE,))
    assert digest(load_federated(replace(cfg, download=False), 3, seed=0)) == digest(fd)


def test_cifar_tarball_in_root_is_verified_then_extracted(tmp_path, monkeypatch, no_system_dirs):
    src = tmp_path / "src"
    write_cifar(src)
    register_cifar(monkeypatch, src)
    (tmp_path / "root").mkdir()
    tarball = cifar_tarball(tmp_path / "root" / CIFAR_TARBALL, src)
    cfg = image_cfg(tmp_path, dataset="cifar10", root=str(tmp_path / "root"), min_samples=5)
    with pytest.raises(ChecksumError, match=CIFAR_TARBALL):  # the real official md5 does not match
        load_federated(cfg, 3, seed=0)
    monkeypatch.setitem(CIFAR10.md5, CIFAR_TARBALL, md5_of(tarball))
    assert sum(load_federated(cfg, 3, seed=0).sizes) == 60
    assert (tmp_path / "cache" / "cifar10" / CIFAR_DIR / "test_batch").is_file()


def test_cifar_missing_offline(tmp_path, no_system_dirs):
    for download in (False, True):
        with pytest.raises(DatasetNotFound) as e:
            load_federated(image_cfg(tmp_path, dataset="cifar10", download=download), 2, seed=0)
        msg = str(e.value)
        assert "\n" not in msg and CIFAR_TARBALL in msg and "data.root" in msg and str(tmp_path / "cache") in msg


# --- partitions -------------------------------------------------------------------------


def labels_10(n=3000, seed=0):
    return np.random.default_rng(seed).integers(0, 10, n)


def mean_label_entropy(parts, labels):
    ent = []
    for p in parts:
        c = np.bincount(labels[p], minlength=10).astype(float)
        q = c[c > 0] / c.sum()
        ent.append(-(q * np.log(q)).sum())
    return float(np.mean(ent))


def test_iid_every_sample_exactly_once():
    parts = partition_iid(1003, 7, stream(0, "partition"))
    assert len(parts) == 7
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1003))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_dirichlet_at_most_once_min_samples_and_skew():
    labels = labels_10()
    skewed = partition_dirichlet(labels, 20, 0.05, 10, stream(0, "partition"))
    flat = partition_dirichlet(labels, 20, 100.0, 10, stream(0, "partition"))
    for parts in (skewed, flat):
        allp = np.concatenate(parts)
        assert len(np.unique(allp)) == len(allp)  # at most once
        assert allp.min() >= 0 and allp.max() < len(labels)
        assert min(len(p) for p in parts) >= 10
    assert mean_label_entropy(skewed, labels) < 0.5 * mean_label_entropy(flat, labels)
    assert mean_label_entropy(flat, labels) > 0.9 * np.log(10)


def test_dirichlet_reproducible_under_seed():
    labels = labels_10()
    a = partition_dirichlet(labels, 10, 0.5, 10, stream(4, "partition"))
    b = partition_dirichlet(labels, 10, 0.5, 10, stream(4, "partition"))
    c = partition_dirichlet(labels, 10, 0.5, 10, stream(5, "partition"))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, c))


def test_dirichlet_top_up_when_resampling_fails():
    labels = labels_10(200)
    # 10 clients x 20 = all 200 samples: a Dir(0.01) draw essentially never satisfies this
    parts = partition_dirichlet(labels, 10, 0.01, 20, stream(0, "partition"), attempts=1)
    assert [len(p) for p in parts] == [20] * 10
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(200))
    with pytest.raises(ValueError):
        partition_dirichlet(labels, 10, 0.5, 21, stream(0, "partition"))


def test_load_federated_dirichlet_on_files(tmp_path):
    write_dataset(tmp_path, n_train=200)
    cfg = DataConfig(dataset="mnist", root=str(tmp_path), partition="dirichlet", dirichlet_beta=0.1, min_samples=5)
    a, b = load_federated(cfg, 8, seed=2), load_federated(cfg, 8, seed=2)
    assert digest(a) == digest(b)
    ids = [round(v) for x, _ in clients(a) for v in (x[:, 0, 0, 0] * 255).tolist()]
    assert len(ids) == len(set(ids)) and min(a.sizes) >= 5


def test_dirichlet_entropy_decreases_monotonically_with_beta():
    labels = labels_10(6000)
    entropy = [
        mean_label_entropy(partition_dirichlet(labels, 20, beta, 10, stream(0, "partition")), labels)
        for beta in (100.0, 1.0, 0.05)
    ]
    assert entropy[0] > entropy[1] > entropy[2]
    assert entropy[0] > 0.95 * np.log(10) and entropy[2] < 0.5 * np.log(10)


def test_shards_every_sample_once_and_few_labels_per_client():
    labels = labels_10(3000)
    parts = partition_shards(labels, 50, 2, stream(0, "partition"))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(3000))
    assert all(len(p) == 60 for p in parts)
    # two label-sorted shards of 30 samples each: at most 2 labels, +1 per shard straddling a boundary
    assert max(len(np.unique(labels[p])) for p in parts) <= 4
    assert mean_label_entropy(parts, labels) < 0.5 * np.log(10)
    uneven = partition_shards(labels[:1001], 7, 3, stream(0, "partition"))
    assert np.array_equal(np.sort(np.concatenate(uneven)), np.arange(1001))
    with pytest.raises(ValueError):
        partition_shards(labels[:10], 4, 3, stream(0, "partition"))


def test_quantity_skew_exact_group_sizes():
    # Talaei & Izadi, Table I scenario 3: 20 clients each with 50, 120 and 271 samples
    sizes = [50] * 20 + [120] * 20 + [271] * 20
    parts = partition_quantity(60000, sizes, stream(0, "partition"))
    assert [len(p) for p in parts] == sizes
    allp = np.concatenate(parts)
    assert len(np.unique(allp)) == len(allp) == sum(sizes)  # disjoint
    with pytest.raises(ValueError):
        partition_quantity(100, [60, 50], stream(0, "partition"))


def test_quantity_groups_on_files(tmp_path):
    write_dataset(tmp_path, n_train=200)
    groups = [ClientGroup(clients=2, samples=5), ClientGroup(clients=3, samples=12), ClientGroup(clients=1, samples=50)]
    cfg = DataConfig(dataset="mnist", root=str(tmp_path), partition="quantity", groups=groups, min_samples=5)
    fd = load_federated(cfg, 6, seed=0)
    assert fd.sizes == [5, 5, 12, 12, 12, 50]
    ids = [round(v) for x, _ in clients(fd) for v in (x[:, 0, 0, 0] * 255).tolist()]
    assert len(ids) == len(set(ids))
    with pytest.raises(ValueError, match=r"clients.n=7"):
        load_federated(cfg, 7, seed=0)


@pytest.mark.parametrize(
    "partition, extra",
    [
        ("iid", {}),
        ("dirichlet", {"dirichlet_beta": 0.3}),
        ("shards", {"shards_per_client": 2}),
        ("quantity", {"groups": [ClientGroup(4, 10), ClientGroup(4, 20)]}),
    ],
)
def test_every_partition_reproducible_under_seed(tmp_path, partition, extra):
    write_dataset(tmp_path, n_train=250)
    cfg = DataConfig(dataset="mnist", root=str(tmp_path), partition=partition, min_samples=5, **extra)
    a, b, c = (load_federated(cfg, 8, seed=s) for s in (1, 1, 2))
    assert digest(a) == digest(b) and digest(a) != digest(c)
    assert min(a.sizes) >= 5


# --- the real FashionMNIST --------------------------------------------------------------


@needs_fashion_mnist
def test_real_fashion_mnist():
    fd = load_federated(DataConfig(dataset="fashion_mnist", partition="iid", normalize="none"), 10, seed=0)
    assert sum(fd.sizes) == 60000 and fd.sizes == [6000] * 10
    assert fd.client(0)[0].shape == (6000, 1, 28, 28)
    tx, ty = fd.test()
    assert tx.shape == (10000, 1, 28, 28) and ty.shape == (10000,)
    assert fd.num_classes == 10 and fd.input_shape == (1, 28, 28)
    assert float(tx.min()) == 0.0 and float(tx.max()) == 1.0
    assert np.bincount(ty).tolist() == [1000] * 10  # FashionMNIST's test set is balanced


@needs_fashion_mnist
def test_real_fashion_mnist_numbers_are_those_of_the_eager_build():
    """The ALI-DPFL code's partition and split, built client by client: bit for bit as before."""
    cfg = DataConfig(
        dataset="fashion_mnist",
        partition="dirichlet_capped",
        split="per_client",
        partition_seed=1,
        dirichlet_beta=0.1,
        min_samples=5,
        normalize="half",
    )
    assert digest(load_federated(cfg, 20, seed=2)) == "a8f8c10c2f42b8f50134120fc9592e55733fa0664d8448757ff9fde47e4ec1e8"


@pytest.mark.parametrize("max_test", [1, 37, 10**6])
def test_synthetic_max_test_keeps_the_first_test_rows(max_test):
    cfg = DataConfig(samples_per_client=40)
    x, y = SyntheticData(cfg, 12, 0).test()
    capped = SyntheticData(DataConfig(samples_per_client=40, max_test=max_test), 12, 0)
    cx, cy = capped.test()
    assert np.array_equal(cx, x[:max_test]) and np.array_equal(cy, y[:max_test])
    assert capped.sizes == SyntheticData(cfg, 12, 0).sizes

"""bench.reproduce.authors_run, the parts that are ours: the client files it writes for the ALI-DPFL
authors' code (read back as their utils/data_utils.read_data reads them) and the reading of their
stdout. Neither needs their checkout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.reproduce.authors_run import SCENARIO, TheirLog, their_flags, write_client_files
from emulator.config import load
from nodes.contracts.schema import DataConfig
from nodes.data import load_federated
from nodes.data.catalog import FashionMNIST
from nodes.data.idx import IDX_FILES, IMAGES_MAGIC, LABELS_MAGIC
from nodes.data.images import ImageData

N_TRAIN, N_TEST = 180, 60  # every sample's id fits in one pixel


def write_idx(path: Path, arr: np.ndarray, magic: int) -> None:
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    path.write_bytes(magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in arr.shape) + arr.tobytes())


@pytest.fixture
def data(tmp_path) -> ImageData:
    """A FashionMNIST-shaped dataset whose pixel (0, 0) is the sample's id in the pooled set."""
    images = np.random.default_rng(0).integers(0, 256, (N_TRAIN + N_TEST, 28, 28), dtype=np.uint8)
    images[:, 0, 0] = np.arange(N_TRAIN + N_TEST)
    labels = np.random.default_rng(1).integers(0, 10, N_TRAIN + N_TEST)
    raw = tmp_path / "raw"
    raw.mkdir()
    write_idx(raw / IDX_FILES["train_images"], images[:N_TRAIN], IMAGES_MAGIC)
    write_idx(raw / IDX_FILES["train_labels"], labels[:N_TRAIN], LABELS_MAGIC)
    write_idx(raw / IDX_FILES["test_images"], images[N_TRAIN:], IMAGES_MAGIC)
    write_idx(raw / IDX_FILES["test_labels"], labels[N_TRAIN:], LABELS_MAGIC)
    cfg = DataConfig(
        dataset="fashion_mnist",
        root=str(raw),
        cache_dir=str(tmp_path / "cache"),
        download=False,
        split="per_client",
        client_train_fraction=0.75,
        partition="dirichlet_capped",
        dirichlet_beta=0.5,
        partition_seed=1,
        min_samples=4,
        normalize="half",
    )
    fd = load_federated(cfg, 4, seed=0)
    assert isinstance(fd, ImageData)
    return fd


def read_data(path: Path) -> dict[str, np.ndarray]:
    """As their utils/data_utils.read_data."""
    with open(path, "rb") as f:
        return np.load(f, allow_pickle=True)["data"].tolist()


def ids(x: np.ndarray) -> np.ndarray:
    """The sample ids, undoing (pixel / 255 - 0.5) / 0.5."""
    return np.round((x[:, 0, 0, 0] * 0.5 + 0.5) * 255).astype(np.int64)


def test_client_files_are_their_generators_layout_and_our_partition(tmp_path, data):
    root = tmp_path / "dataset" / "fmnist"
    write_client_files(data, root, 0.5)
    assert sorted(p.name for p in (root / "train").iterdir()) == [f"{k}.npz" for k in range(4)]
    assert sorted(p.name for p in (root / "test").iterdir()) == [*(f"{k}.npz" for k in range(4)), "server_testset.npz"]
    seen, union = [], []
    for k in range(4):
        train, test = read_data(root / "train" / f"{k}.npz"), read_data(root / "test" / f"{k}.npz")
        for got, (x, y) in ((train, data.client(k)), (test, data.client_test(k))):
            assert list(got) == ["x", "y"]
            assert got["x"].dtype == np.float32 and got["x"].shape == (len(y), 1, 28, 28)
            assert got["y"].dtype == np.int64
            assert np.array_equal(got["x"], x) and np.array_equal(got["y"], y)
            assert np.array_equal(got["y"], data.ytr[ids(got["x"])])  # labels travel with their images
        n = len(train["y"]) + len(test["y"])
        assert len(train["y"]) == int(0.75 * n)  # sklearn's train_test_split(train_size=0.75)
        seen += [*ids(train["x"]), *ids(test["x"])]
        union.append(test)
    assert sorted(seen) == list(range(N_TRAIN + N_TEST))  # train and test pooled, each sample once
    server = read_data(root / "test" / "server_testset.npz")
    assert server["x"].dtype == np.float64 and server["y"].dtype == np.int64
    assert np.array_equal(server["x"], np.concatenate([t["x"] for t in union]))
    assert np.array_equal(server["y"], np.concatenate([t["y"] for t in union]))
    x = read_data(root / "train" / "0.npz")["x"]
    assert x.min() >= -1.0 and x.max() <= 1.0 and np.isin(x, (np.arange(256, dtype=np.float32) / 255 - 0.5) / 0.5).all()


def test_config_json_counts_each_clients_labels(tmp_path, data):
    root = tmp_path / "fmnist"
    write_client_files(data, root, 0.5)
    config = json.loads((root / "config.json").read_text())
    assert list(config) == [
        "num_clients",
        "num_classes",
        "non_iid",
        "balance",
        "partition",
        "Size of samples for labels in clients",
        "alpha",
        "batch_size",
    ]
    assert (config["num_clients"], config["non_iid"], config["partition"], config["alpha"]) == (4, True, "dir", 0.5)
    for k, stat in enumerate(config["Size of samples for labels in clients"]):
        y = np.concatenate([data.client(k)[1], data.client_test(k)[1]])
        assert stat == [[int(c), int((y == c).sum())] for c in np.unique(y)]


def test_only_per_client_splits_give_client_test_shares(tmp_path, data):
    official = ImageData(
        FashionMNIST(DataConfig(dataset="fashion_mnist", partition="iid", min_samples=1)),
        2,
        0,
        data.xtr[:20],
        data.ytr[:20],
        data.xtr[20:30],
        data.ytr[20:30],
    )
    with pytest.raises(ValueError, match="per_client"):
        official.client_test(0)
    with pytest.raises(IndexError):
        data.client_test(4)


# lines of their main_dpfl.py's output, as it prints them (a round, then the next one's start)
THEIR_OUTPUT = """\
Finished creating server and clients.

-------------Round number: 0-------------

Evaluate global model by personalized
Averaged Train Loss: 2.3127
Averaged Test Accurancy: 0.0559
Averaged Test AUC: 0.0000
Std Test Accurancy: 0.0766
Std Test AUC: 0.0000
---------------------------------------
Client 0 is training, privacy=True, AUTO-S=False
Clint 0 的第 1 次 iterations, 本次采样个数len(y): 71
client 0 is training, loss_batch_avg = 2.334258626884138
------------------------- time cost ------------------------- 70.88826942443848

Evaluate global model by global
Accuracy at server: 0.1001
Loss at server: 2.3082

-------------Round number: 1-------------

Evaluate global model by personalized
Averaged Train Loss: 2.3046
Averaged Test Accurancy: 0.0947
Std Test Accurancy: 0.1162
------------------------- time cost ------------------------- 1.5e-05
"""


def test_their_stdout_gives_rs_test_acc_by_round_and_the_time_cost():
    log = TheirLog()
    done = [got for line in THEIR_OUTPUT.splitlines(keepends=True) if (got := log.feed(line))]
    assert done == [(0, 0.0559), (1, 0.0947)]  # not the server's accuracy, nor the standard deviation
    assert log.accuracy == done
    assert log.seconds == [70.88826942443848, 1.5e-05]


def test_an_accuracy_line_before_any_round_is_ignored():
    log = TheirLog()
    assert log.feed("Averaged Test Accurancy: 0.5000\n") is None
    assert log.accuracy == []


def test_their_flags_carry_the_scenarios_setting():
    cfg = load(SCENARIO, [])
    flags = their_flags(2, 0.05, 158, cfg, 10)
    assert dict(zip(flags[::2], flags[1::2])) == {
        "-data": "fmnist",
        "-m": "cnn",
        "-nb": "10",
        "-li": "2",
        "-dpn": "0.05",
        "-dps": "1.1",
        "-lr": "0.5",
        "-bsr": "0.015",
        "-lbs": "64",
        "-ls": "1",
        "-nc": "10",
        "-jr": "1.0",
        "-gr": "158",
        "-eg": "1",
        "-t": "1",
        "-dev": "cpu",
    }

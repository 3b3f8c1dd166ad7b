"""Federated datasets: Synthetic(alpha, beta), MNIST / FashionMNIST (IDX files), CIFAR-10, and a user's own.

A dataset is a `DatasetSpec` (`spec`), built from the scenario's data section: it answers what a run
asks before any file is read (a sample's shape, the classes, the samples and bytes the guards count,
the checks of its keys) and loads the data. `catalog` declares the built-in ones and holds `DATASETS`,
the registry that finds data.dataset's class: a built-in by name, a user's by `package.module:ClassName`
(the server, every worker and the evaluator import it, `dataset_spec`). A user's image dataset
subclasses `ImageArrays` (`images`) and returns its arrays; the partitions, normalisation and data
quality below apply to it as to the shipped ones.

`load_federated(cfg, n_clients, seed)` returns one `FederatedData`: every client's sample count
up front, a client's (X, y) built when asked for (`client(k)`, what a worker trains), and the
pooled test set (`test()`, the server's evaluator's); `load_server_data` keeps only what the server
needs of it.
Samples are numpy arrays, X float32 and y int64 (`federated.Samples`), which their users turn into
tensors with `torch.from_numpy`, without a copy: no module here imports torch when imported, and
loading a dataset never does (only `quality.corrupt`, given tensors, imports it when called).
Everything random comes from named `nodes.contracts.rng` streams, so the same (cfg, n_clients, seed) gives
bitwise identical arrays in any process, for any one client built alone.

* ``synthetic`` (default, no files): generated per client (`synthetic`).
* ``fashion_mnist`` / ``mnist``: the four IDX files (gzipped or plain), parsed with numpy;
  one sample is (1, 28, 28) (`idx`).
* ``cifar10``: the python batches of `cifar-10-python.tar.gz` (`data_batch_1..5`,
  `test_batch`), each md5-verified against the official value before it is unpickled by
  an unpickler that admits numpy arrays only; one sample is (3, 32, 32) (`cifar`).

Image files are looked for in data.root, then the standard system locations, then
data.cache_dir (`images.FileImages`, `locate`); a missing dataset is downloaded (md5-verified, `fetch`)
into data.cache_dir unless data.download is false. Pixels are float32, pixel / 255 then normalised
by data.normalize (`normalize`): ``standard`` (per-channel mean and std of the training set),
``half`` ((x - 0.5) / 0.5, as the ALI-DPFL code) or ``none``.

data.split says which samples are partitioned (`images`, `partition`): ``official`` — the
training set goes to the clients (``iid``, ``dirichlet`` label skew, ``dirichlet_capped``,
``shards``, ``quantity`` skew by client group) and the official test set to the server;
``per_client`` — as the PFL-Non-IID generator the ALI-DPFL code uses, training and test sets
are pooled and partitioned, every client's share is split train/test (client_train_fraction),
and the server tests on the union of the clients' test shares. `quality` corrupts a client's
data by round; `validate` checks the data section without reading a file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodes.data.catalog import DATASETS, dataset_spec
from nodes.data.images import ImageArrays
from nodes.data.spec import DatasetLoadError, DatasetSpec
from nodes.data.validate import validate_data

if TYPE_CHECKING:
    from nodes.contracts.schema import DataConfig
    from nodes.data.federated import FederatedData, ServerData

__all__ = [
    "DATASETS",
    "DatasetLoadError",
    "DatasetSpec",
    "ImageArrays",
    "dataset_spec",
    "load_federated",
    "load_server_data",
    "validate_data",
]


def load_federated(cfg: DataConfig, n_clients: int, seed: int) -> FederatedData:
    """cfg.dataset shared out among `n_clients` clients (DatasetSpec.load). No module of this package
    imports torch (samples are numpy arrays), so the server loads its data and test set before it
    imports torch, and the run's workers start without waiting for it (emulator.run.lifecycle)."""
    if n_clients < 1:
        raise ValueError(f"n_clients = {n_clients}: expected an integer >= 1")
    return dataset_spec(cfg).load(n_clients, seed)


def load_server_data(cfg: DataConfig, n_clients: int, seed: int) -> ServerData:
    """The sizes and a sample's shape: the image files' pixels are let go once read."""
    from nodes.data.federated import ServerData

    return ServerData.of(load_federated(cfg, n_clients, seed))

"""The built-in datasets, each declared by what is known of it before a file is read, and `DATASETS`,
the registry of data.dataset's choices: a built-in by name, a user's `DatasetSpec` subclass by
`package.module:ClassName`."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, ClassVar

from nodes.contracts.plugins import Registry
from nodes.data.cifar import CIFAR_TARBALL, CifarFiles
from nodes.data.idx import IdxFiles
from nodes.data.spec import DatasetLoadError, DatasetSpec
from nodes.data.synthetic import Synthetic

if TYPE_CHECKING:
    from nodes.contracts.schema import DataConfig

# DatasetSpec is abstract: the registry holds, and checks for, its concrete subclasses
DATASETS: Registry[DatasetSpec] = Registry(
    "data.dataset",
    DatasetSpec,  # type: ignore[type-abstract]
    "nodes.data.DatasetSpec",
    DatasetLoadError,
)

DATASETS.register("synthetic")(Synthetic)

# Per-channel means and standard deviations (channel_stats) are those torchvision's examples use;
# tests recompute FashionMNIST's from its files.


@DATASETS.register("fashion_mnist")
class FashionMNIST(IdxFiles):
    """Zalando's FashionMNIST: 28x28 grey images of 10 kinds of clothes."""

    train_size = 60000
    test_size = 10000
    sample_shape = (1, 28, 28)
    classes = 10
    channel_stats = ((0.2860,), (0.3530,))
    system_dirs = ("fashion-mnist",)
    subdirs = ("fashion-mnist", "fashion_mnist", "FashionMNIST/raw")
    how_to_get = "install them with `apt-get install dataset-fashion-mnist` or put the 4 IDX files in data.root"
    mirrors = (
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    )
    md5: ClassVar[dict[str, str]] = {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    }


@DATASETS.register("mnist")
class MNIST(IdxFiles):
    """LeCun's MNIST: 28x28 grey images of handwritten digits."""

    train_size = 60000
    test_size = 10000
    sample_shape = (1, 28, 28)
    classes = 10
    channel_stats = ((0.1307,), (0.3081,))
    system_dirs = ("mnist",)
    subdirs = ("mnist", "MNIST/raw")
    how_to_get = "put the 4 IDX files (train-images-idx3-ubyte[.gz], ...) in data.root"
    mirrors = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")
    md5: ClassVar[dict[str, str]] = {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    }


@DATASETS.register("cifar10")
class CIFAR10(CifarFiles):
    """Krizhevsky's CIFAR-10: 32x32 colour images of 10 classes of objects."""

    train_size = 50000
    test_size = 10000
    sample_shape = (3, 32, 32)
    classes = 10
    channel_stats = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
    system_dirs = ("cifar-10", "cifar10")
    subdirs = ("cifar-10-batches-py",)
    how_to_get = "put cifar-10-python.tar.gz or its extracted cifar-10-batches-py/ in data.root"
    mirrors = ("https://www.cs.toronto.edu/~kriz/",)
    md5: ClassVar[dict[str, str]] = {
        CIFAR_TARBALL: "c58f30108f718f92721af3b95e74349a",
        "data_batch_1": "c99cafc152244af753f735de768cd75f",
        "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
        "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
        "data_batch_4": "634d18415352ddfa80567beed471001a",
        "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
        "test_batch": "40351d587109b95175f43aff81a1287e",
    }


def dataset_spec(cfg: DataConfig) -> DatasetSpec:
    """The spec of cfg.dataset: a built-in's, or a user's class imported; any problem is one
    DatasetLoadError naming data.dataset."""
    cls = DATASETS.get(cfg.dataset)
    if inspect.isabstract(cls):
        left = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise DatasetLoadError(
            f"data.dataset = {cfg.dataset!r}: {cls.__name__} leaves {left} undefined; expected each of them "
            f"set or written (docs/data-models.md)"
        )
    return cls(cfg)

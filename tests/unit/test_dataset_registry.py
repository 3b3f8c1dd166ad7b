"""data.dataset's registry: the built-in datasets by name, a user's DatasetSpec subclass by
package.module:ClassName (tests/plugins/dataset.py), each problem one line naming the key."""

import numpy as np
import pytest

from emulator.config import ConfigError, check, load
from nodes.contracts.schema import DataConfig, QualityRule
from nodes.data import DATASETS, DatasetLoadError, dataset_spec, load_federated, validate_data
from nodes.data.catalog import CIFAR10, MNIST, FashionMNIST
from nodes.data.spec import DatasetMismatch
from nodes.data.synthetic import Synthetic
from tests.plugins.dataset import TinyImages

TINY = "tests.plugins.dataset:TinyImages"


def test_the_built_in_datasets_are_found_by_name_in_their_order():
    assert DATASETS.names() == ("synthetic", "fashion_mnist", "mnist", "cifar10")
    for name, cls in zip(DATASETS.names(), (Synthetic, FashionMNIST, MNIST, CIFAR10)):
        spec = dataset_spec(DataConfig(dataset=name))
        assert type(spec) is cls and spec.cfg.dataset == name
    assert dataset_spec(DataConfig(dim=7, classes=4)).sample_shape == (7,)
    assert (MNIST.sample_shape, CIFAR10.sample_shape, CIFAR10.classes) == ((1, 28, 28), (3, 32, 32), 10)


def test_a_users_dataset_is_imported_by_reference_and_answers_without_loading():
    spec = dataset_spec(DataConfig(dataset=TINY))
    assert type(spec).__qualname__ == "TinyImages" and spec.sample_shape == (1, 4, 4) and spec.classes == 3
    assert (spec.client_samples(4), spec.largest_client(4), spec.test_samples(4)) == (90, 23, 30)
    assert spec.source_bytes(4) == (90 + 30) * (16 + 8) and spec.sample_bytes() == 16 * 4 + 8
    validate_data(DataConfig(dataset=TINY, quality=[QualityRule(clients=[0], salt_pepper=0.2)]), 4, check)


def test_a_users_dataset_is_partitioned_normalised_and_capped_as_the_shipped_ones():
    fd = load_federated(DataConfig(dataset=TINY, partition="shards", shards_per_client=1, min_samples=5), 3, seed=0)
    assert fd.sizes == [30, 30, 30] and fd.num_classes == 3 and fd.input_shape == (1, 4, 4)
    assert all(len(np.unique(y)) == 1 for _, y in (fd.client(k) for k in range(3)))  # one label-sorted shard each
    x, _ = fd.test()
    raw = TinyImages(DataConfig()).arrays()[2]
    np.testing.assert_array_equal(x, ((raw / np.float32(255) - np.float32(0.3)) / np.float32(0.35)).astype(np.float32))
    capped = load_federated(DataConfig(dataset=TINY, max_train=60, max_test=9, min_samples=5), 4, seed=0)
    assert sum(capped.sizes) == 60 and len(capped.test()[1]) == 9


@pytest.mark.parametrize(
    "dataset, message",
    [
        ("cifar", "data.dataset = 'cifar': expected synthetic | fashion_mnist | mnist | cifar10 | package.module:Cl"),
        ("no_such_module:X", "data.dataset = 'no_such_module:X': cannot import no_such_module (ModuleNotFoundError"),
        (
            "tests.plugins.dataset:NotADataset",
            "data.dataset = 'tests.plugins.dataset:NotADataset': tests.plugins.dataset.NotADataset is not one; "
            "expected a subclass of nodes.data.DatasetSpec",
        ),
        ("tests.plugins.dataset:Missing", "tests.plugins.dataset.Missing does not exist"),
        (
            "tests.plugins.dataset:Undeclared",
            "data.dataset = 'tests.plugins.dataset:Undeclared': Undeclared leaves classes, sample_shape, test_size, "
            "train_size undefined",
        ),
    ],
)
def test_a_dataset_that_cannot_be_used_is_one_config_error_naming_the_key(dataset, message):
    with pytest.raises(ConfigError) as e:
        load(None, [f"data.dataset={dataset}"])
    assert message in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("data.dataset = ")
    if ":" in dataset:
        with pytest.raises(DatasetLoadError, match=r"^data\.dataset = "):
            dataset_spec(DataConfig(dataset=dataset))


def test_standard_normalisation_needs_the_datasets_channel_stats(monkeypatch):
    monkeypatch.setattr(TinyImages, "channel_stats", None)
    with pytest.raises(ConfigError, match=r"^data\.normalize = 'standard': expected half \| none: data\.dataset=tests"):
        validate_data(DataConfig(dataset=TINY), 4, check)
    validate_data(DataConfig(dataset=TINY, normalize="half"), 4, check)


class ShiftedLabels(TinyImages):
    def arrays(self):
        x, y, x_test, y_test = super().arrays()
        return x, y + 1, x_test, y_test  # labels 1, 2 and 3 of 3 classes


def test_arrays_that_are_not_what_the_class_declares_are_refused_in_one_line():
    with pytest.raises(DatasetMismatch) as e:
        ShiftedLabels(DataConfig(dataset="mine:ShiftedLabels")).load(3, seed=0)
    assert str(e.value) == (
        "data.dataset = 'mine:ShiftedLabels': its training set is uint8 images (90, 1, 4, 4) and int64 labels "
        "(90,); expected at most 90 uint8 images of shape (1, 4, 4) and as many labels in [0, 3)"
    )


def test_help_lists_the_datasets_and_your_own():
    from emulator.config import help_text

    line = next(line for line in help_text().splitlines() if line.startswith("  data.dataset = "))
    assert "synthetic | fashion_mnist | mnist | cifar10 | package.module:ClassName (your own DatasetSpec" in line

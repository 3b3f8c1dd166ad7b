"""The guards' estimates for every shipped dataset, pinned: the numbers a run is checked against (memory,
the model's size) come from the scenario alone, and stay those the data's facts gave before they were one
DatasetSpec each."""

from dataclasses import asdict

import pytest

from emulator.config import load
from emulator.run.guards import memory_estimate, model_size, worker_cache_bytes

# case: (overrides, memory_estimate(cfg, 2) as a dict, worker_cache_bytes, model_size: parameters, activations, widest)
PINNED = {
    "synthetic": (
        ["model.name=logreg"],
        {
            "workers": 2,
            "server_data": 411600,
            "server_state": 742400,
            "evaluator_data": 411600,
            "worker_data": 694000,
            "parameters": 610,
            "batch": 14,
            "server_model": 78080,
            "worker_model": 326640,
            "evaluator_model": 201680,
        },
        496000,
        (610, 70, 60),
    ),
    "synthetic_handed_over": (
        ["model.name=logreg", "clients.n=2000", "data.test_fraction=0.9", "data.samples_per_client=250"],
        {
            "workers": 2,
            "server_data": 226888800,
            "server_state": 148480000,
            "evaluator_data": 226888800,
            "worker_data": 16148799,
            "parameters": 610,
            "batch": 6,
            "server_model": 14644880,
            "worker_model": 558320,
            "evaluator_model": 496400,
        },
        15499999,
        (610, 70, 60),
    ),
    "synthetic_skewed": (
        [
            "model.name=mlp",
            "clients.n=300",
            "data.dim=20",
            "data.classes=5",
            "data.size_sigma=1.5",
            "data.max_test=50",
            "data.min_samples=30",
        ],
        {
            "workers": 2,
            "server_data": 822300,
            "server_state": 22272000,
            "evaluator_data": 822300,
            "worker_data": 6042300,
            "parameters": 1669,
            "batch": 153,
            "server_model": 6021752,
            "worker_model": 3330564,
            "evaluator_model": 38952,
        },
        5280000,
        (1669, 153, 64),
    ),
    "fashion_mnist": (
        ["model.name=cnn_fmnist", "data.dataset=fashion_mnist"],
        {
            "workers": 2,
            "server_data": 55440000,
            "server_state": 742400,
            "evaluator_data": 94740000,
            "worker_data": 291240000,
            "parameters": 26010,
            "batch": 300,
            "server_model": 3329280,
            "worker_model": 120836768,
            "evaluator_model": 1592528,
        },
        235800000,
        (26010, 10410, 2704),
    ),
    "fashion_mnist_per_client": (
        [
            "model.name=cnn_fedavg",
            "data.dataset=fashion_mnist",
            "clients.n=20",
            "data.partition=dirichlet_capped",
            "data.split=per_client",
            "data.max_test=2000",
        ],
        {
            "workers": 2,
            "server_data": 49104000,
            "server_state": 1484800,
            "evaluator_data": 56964000,
            "worker_data": 292764000,
            "parameters": 582026,
            "batch": 155,
            "server_model": 144342448,
            "worker_model": 1176035416,
            "evaluator_model": 14093392,
        },
        243660000,
        (582026, 52746, 18432),
    ),
    "mnist_quantity": (
        [
            "model.name=mlp_wei",
            "data.dataset=mnist",
            "clients.n=6",
            "data.partition=quantity",
            "data.groups=[{clients: 2, samples: 50}, {clients: 4, samples: 271}]",
        ],
        {
            "workers": 2,
            "server_data": 55440000,
            "server_state": 445440,
            "evaluator_data": 94740000,
            "worker_data": 291240000,
            "parameters": 203530,
            "batch": 14,
            "server_model": 16282400,
            "worker_model": 47274800,
            "evaluator_model": 8050768,
        },
        235800000,
        (203530, 1306, 784),
    ),
    "mnist_shards": (
        [
            "model.name=cnn_fmnist",
            "data.dataset=mnist",
            "clients.n=50",
            "data.partition=shards",
            "data.shards_per_client=3",
            "data.max_train=9000",
            "dp.q=0.2",
        ],
        {
            "workers": 2,
            "server_data": 15048000,
            "server_state": 3712000,
            "evaluator_data": 54348000,
            "worker_data": 50418000,
            "parameters": 26010,
            "batch": 36,
            "server_model": 15814080,
            "worker_model": 16451168,
            "evaluator_model": 1592528,
        },
        35370000,
        (26010, 10410, 2704),
    ),
    "cifar10": (
        ["model.name=cnn_cifar", "data.dataset=cifar10", "clients.n=10"],
        {
            "workers": 2,
            "server_data": 184800000,
            "server_state": 742400,
            "evaluator_data": 338500000,
            "worker_data": 530085456,
            "parameters": 550570,
            "batch": 250,
            "server_model": 70472960,
            "worker_model": 2178157456,
            "evaluator_model": 21181776,
        },
        345285456,
        (550570, 246026, 32768),
    ),
    "cifar10_per_client": (
        [
            "model.name=mlp",
            "data.dataset=cifar10",
            "clients.n=7",
            "data.split=per_client",
            "data.max_train=5000",
            "data.max_test=700",
        ],
        {
            "workers": 2,
            "server_data": 17556000,
            "server_state": 519680,
            "evaluator_data": 28315000,
            "worker_data": 105165000,
            "parameters": 197322,
            "batch": 41,
            "server_model": 18153624,
            "worker_model": 121652808,
            "evaluator_model": 18781776,
        },
        87609000,
        (197322, 3210, 3072),
    ),
}


@pytest.mark.parametrize("case", sorted(PINNED))
def test_the_guards_estimates_of_each_shipped_dataset_are_pinned(case):
    overrides, estimate, cache, size = PINNED[case]
    cfg = load(None, [*overrides, "workers=2"])
    m = model_size(cfg)
    assert asdict(memory_estimate(cfg, 2)) == estimate
    assert worker_cache_bytes(cfg) == cache
    assert (m.parameters, m.activations, m.widest_layer) == size

"""train.bundle = auto (emulator.run.bundles): the K a run chooses, the resolved scenario it records, how
the key is checked, and what an earlier run at a K stands for."""

import pytest

from emulator.cli.reuse import config_changes, why_not_reused
from emulator.config import ConfigError, load
from emulator.run.bundles import BUNDLE_PARAMETERS, choose_bundle, with_bundle
from emulator.run.devices import Placement
from emulator.run.guards import memory_estimate, model_size
from nodes.contracts.schema import to_dict
from tests.unit.test_reuse import write_run

DENSE = ["clients.n=1000", "clients.per_round=100", "clients.select=uniform", "model.name=logreg"]


@pytest.mark.parametrize(
    ("per_round", "workers", "k"),
    [(100, 2, 50), (101, 2, 51), (100, 1, 100), (9, 4, 3), (3, 8, 1), (100, 0, 100)],
)
def test_a_dense_model_gets_an_even_split_of_a_rounds_clients_over_the_workers(per_round, workers, k):
    cfg = load(None, [*DENSE, f"clients.per_round={per_round}"])
    choice = choose_bundle(cfg, "cpu", workers)
    assert choice.k == k
    # at most one bundle a worker, and none larger than an even split's share
    assert -(-per_round // k) <= max(1, workers) and k * max(1, workers) < per_round + max(1, workers)
    assert choice.why == f"dense model on cpu: {per_round} clients a round over {max(1, workers)} worker" + (
        "s" if max(1, workers) != 1 else ""
    )


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_conv_net_trains_one_client_at_a_time(device):
    cfg = load(None, [*DENSE, "model.name=cnn_fmnist", "data.dataset=fashion_mnist"])
    choice = choose_bundle(cfg, device, 2)
    assert choice.k == 1 and choice.why == f"cnn_fmnist is a conv net: one client at a time on {device}"


def test_a_large_model_is_stacked_only_as_far_as_the_parameter_bound_allows():
    cfg = load(None, [*DENSE, "model.name=mlp", "model.hidden=100000"])
    parameters = model_size(cfg).parameters
    choice = choose_bundle(cfg, "cpu", 2)
    assert choice.k == BUNDLE_PARAMETERS // parameters < 50
    assert choice.k * parameters <= BUNDLE_PARAMETERS < (choice.k + 1) * parameters
    assert choice.why.endswith(f"at most {choice.k} stacked models of mlp")


def test_buffered_and_async_rounds_bundle_what_they_hand_out_at_once():
    buffered = load(None, [*DENSE, "round.mode=buffered", "buffered.concurrency=40", "buffered.k=20"])
    assert choose_bundle(buffered, "cpu", 2).k == 10  # a version's 20 freed slots over 2 workers
    asynchronous = load(None, [*DENSE, "round.mode=async", "buffered.concurrency=40"])
    assert choose_bundle(asynchronous, "cpu", 2).k == 1


def test_auto_is_resolved_in_the_scenario_and_an_explicit_k_is_kept():
    placed = Placement("cpu", ["cpu", "cpu"], "cpu", 2)
    cfg = load(None, DENSE)
    assert cfg.train.bundle == "auto"  # the default
    resolved, choice = with_bundle(cfg, placed)
    assert resolved.train.bundle == "50" and cfg.train.bundle == "auto"
    assert choice is not None and choice.record() == {"setting": "auto", "chosen": 50, "why": choice.why}
    explicit = load(None, [*DENSE, "train.bundle=8"])
    assert with_bundle(explicit, placed) == (explicit, None)
    # the workers a run waits for count as its own
    joining = load(None, [*DENSE, "transport.min_workers=4"])
    assert with_bundle(joining, placed)[0].train.bundle == "25"


@pytest.mark.parametrize("value", ["0", "-3", "abc", "2.5", "true", "1000001", "'²'"])
def test_a_bundle_that_is_neither_auto_nor_a_count_is_refused_in_one_line(value):
    with pytest.raises(ConfigError) as e:
        load(None, [f"train.bundle={value}"])
    assert str(e.value).startswith("train.bundle = ") and "expected auto | an integer in [1, 1000000]" in str(e.value)


def test_a_bundle_from_yaml_or_the_command_line_is_a_count_as_text(tmp_path):
    assert load(None, ["train.bundle=8"]).train.bundle == "8"
    path = tmp_path / "s.yaml"
    path.write_text("train:\n  bundle: 12\n")
    assert load(str(path)).train.bundle == "12"


def test_the_memory_estimate_counts_a_bundles_stacked_models():
    one, fifty = (memory_estimate(load(None, [*DENSE, f"train.bundle={k}"]), 2) for k in (1, 50))
    assert fifty.worker_model > one.worker_model
    assert memory_estimate(load(None, DENSE), 2).worker_model == one.worker_model  # auto, not yet resolved


def test_an_earlier_run_stands_for_auto_only_at_the_k_auto_chooses_here(tmp_path, monkeypatch):
    monkeypatch.setattr("emulator.cli.reuse.placement", lambda cfg: Placement("cpu", ["cpu"] * 2, "cpu", 2))
    auto = load(None, DENSE)
    at_50 = write_run(tmp_path / "a", to_dict(load(None, [*DENSE, "train.bundle=50"])))
    assert why_not_reused(at_50, auto) == ""
    at_25 = write_run(tmp_path / "b", to_dict(load(None, [*DENSE, "train.bundle=25"])))
    assert config_changes(at_25, auto) == ['train.bundle "25" -> "50"']
    # a run.json of the integer key, and one from before the key (one client at a time)
    old = to_dict(load(None, DENSE))
    old["train"]["bundle"] = 50
    assert why_not_reused(write_run(tmp_path / "c", old), auto) == ""
    del old["train"]["bundle"]
    assert config_changes(write_run(tmp_path / "d", old), auto) == ['train.bundle "1" -> "50"']
    assert why_not_reused(write_run(tmp_path / "e", old), load(None, [*DENSE, "train.bundle=1"])) == ""

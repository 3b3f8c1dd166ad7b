"""emulator.cli.reuse: an earlier run stands for a new one only if it computed what the new one asks for."""

import json

from emulator.cli.reuse import config_changes, why_not_reused
from emulator.config import load
from emulator.run.bundles import with_bundle
from emulator.run.devices import placement
from nodes.contracts.schema import BUNDLE_AUTO, from_dict, to_dict


def write_run(run_dir, scenario, status="complete"):
    """A run.json of `scenario` as a run records it: train.bundle = auto resolved on this machine."""
    if scenario.get("train", {}).get("bundle") == BUNDLE_AUTO:
        cfg = from_dict(scenario)
        scenario = {**scenario, "train": {"bundle": with_bundle(cfg, placement(cfg))[0].train.bundle}}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({"status": status, "scenario": scenario}))
    return run_dir


def test_the_same_config_is_reused_and_where_or_how_it_ran_does_not_matter(tmp_path):
    cfg = load(None, ["dp.sigma=0.7"])
    run = write_run(tmp_path / "r", to_dict(cfg))
    assert why_not_reused(run, cfg) == ""
    assert why_not_reused(run, load(None, ["dp.sigma=0.7", "output.dir=/elsewhere"])) == ""
    pinned = load(None, ["dp.sigma=0.7", "train.bundle=1"])  # at a given K, the worker count is neutral too
    assert (
        why_not_reused(
            write_run(tmp_path / "k", to_dict(pinned)), load(None, ["dp.sigma=0.7", "train.bundle=1", "workers=4"])
        )
        == ""
    )
    assert why_not_reused(run, load(None, ["dp.sigma=0.7", "transport.heartbeat_s=9"])) == ""
    assert why_not_reused(run, load(None, ["dp.sigma=0.7", "eval.overlap=false"])) == ""  # the same tables


def test_evaluating_less_often_is_a_change(tmp_path):
    run = write_run(tmp_path / "r", to_dict(load(None, ["eval.overlap=false"])))
    assert config_changes(run, load(None, ["eval.every=5"])) == ["eval.every 1 -> 5"]


def test_a_changed_value_is_named_with_its_old_and_new_values(tmp_path):
    run = write_run(tmp_path / "r", to_dict(load(None, ["dp.sigma=0.7", "budget.rounds=8"])))
    cfg = load(None, ["dp.sigma=0.5", "budget.rounds=30"])
    assert config_changes(run, cfg) == ["budget.rounds 8 -> 30", "dp.sigma 0.7 -> 0.5"]
    assert why_not_reused(run, cfg) == "config changed: budget.rounds 8 -> 30, dp.sigma 0.7 -> 0.5"
    other_policy = load(None, ["policy=ali_dpfl", "dp.sigma=0.7", "budget.rounds=8"])
    assert why_not_reused(run, other_policy) == 'config changed: policy "fedavg_dp" -> "ali_dpfl"'


def test_a_key_an_older_run_json_lacks_matches_only_at_its_default(tmp_path):
    old = to_dict(load(None, ["dp.sigma=0.7"]))
    del old["dp"]["empty_batch"]  # as if written before the key existed
    old["fedcs"] = {"deadline_s": 1.0}  # and with another policy's section, as run.json once held them all
    run = write_run(tmp_path / "r", old)
    assert why_not_reused(run, load(None, ["dp.sigma=0.7"])) == ""
    assert config_changes(run, load(None, ["dp.sigma=0.7", "dp.empty_batch=skip"])) == [
        'dp.empty_batch (absent) -> "skip"'
    ]


def test_a_section_an_older_run_json_lacks_matches_only_at_its_defaults(tmp_path):
    # Table II's runs predate the eval section: treating the absent section as changed started them over
    old = to_dict(load(None, ["dp.sigma=0.7", "eval.overlap=false"]))
    del old["eval"]
    run = write_run(tmp_path / "r", old)
    assert why_not_reused(run, load(None, ["dp.sigma=0.7"])) == ""
    assert why_not_reused(run, load(None, ["dp.sigma=0.7", "eval.overlap=false"])) == ""  # result-neutral
    assert config_changes(run, load(None, ["dp.sigma=0.7", "eval.every=3"])) == ["eval.every (absent) -> 3"]


def test_an_incomplete_or_missing_run_is_not_reused(tmp_path):
    cfg = load(None, [])
    assert why_not_reused(tmp_path / "nothing", cfg) == "no run yet"
    assert why_not_reused(write_run(tmp_path / "r", to_dict(cfg), status="interrupted"), cfg) == (
        "run.json status 'interrupted'"
    )
    assert config_changes(write_run(tmp_path / "i", to_dict(cfg), status="interrupted"), cfg) == []

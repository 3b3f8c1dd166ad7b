"""After-round hooks (emulator.hooks): the TensorBoard logger read back by TensorBoard's own reader, a
user's hook named in output.hooks, and the refusals of what cannot run."""

import json
import math

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from emulator.config import ConfigError, load
from emulator.output.results import read_table
from emulator.output.tensorboard import SCALARS
from tests.cli import emulator

HOOK = """
import json
from emulator.hooks import RoundHook


class Recorder(RoundHook):
    def __init__(self, info):
        self.path = info.run_dir / "seen.jsonl"
        self.first, self.rounds = info.first_round, info.rounds

    def after_round(self, record):
        row = record.round_row()
        with open(self.path, "a") as f:
            f.write(json.dumps({"round": record.rnd, "accuracy": row["test_accuracy"], "rounds": self.rounds}) + "\\n")

    def close(self):
        with open(self.path, "a") as f:
            f.write(json.dumps({"closed": True}) + "\\n")


class NotAHook:
    pass
"""


RUN = ["scenario=dropout.yaml", "budget.rounds=4", "workers=2", "output.dir=runs", "output.progress=false"]


def test_tensorboard_holds_one_scalar_per_round_per_metric_as_the_rounds_table_has_it(tmp_path):
    r = emulator(tmp_path, *RUN, "output.name=tb-run", "output.tensorboard=tb")
    assert r.returncode == 0, r.stderr
    events = EventAccumulator(str(tmp_path / "tb" / "tb-run"))  # the run's path below output.dir
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == sorted(SCALARS)
    rounds = read_table(tmp_path / "runs" / "tb-run", "rounds").to_pylist()
    for tag, column in SCALARS.items():
        logged = events.Scalars(tag)
        assert [e.step for e in logged] == [0, 1, 2, 3], tag
        for event, row in zip(logged, rounds):  # float32 in the event file
            assert math.isclose(event.value, row[column], rel_tol=1e-6, abs_tol=1e-6), (tag, event.step)


def test_a_users_hook_sees_every_round_in_order_with_its_evaluation_then_the_end(tmp_path):
    (tmp_path / "my_hooks.py").write_text(HOOK)
    r = emulator(tmp_path, *RUN, "output.name=hooked", "output.hooks=[my_hooks:Recorder]", "eval.every=2")
    assert r.returncode == 0, r.stderr
    seen = [json.loads(line) for line in (tmp_path / "runs" / "hooked" / "seen.jsonl").read_text().splitlines()]
    assert [s.get("round") for s in seen[:-1]] == [0, 1, 2, 3] and seen[-1] == {"closed": True}
    evaluated = [not math.isnan(s["accuracy"]) for s in seen[:-1]]
    assert evaluated == [False, True, False, True] and seen[0]["rounds"] == 4  # eval.every=2 and the last


@pytest.mark.parametrize(
    "spec, said",
    [
        ("no_such_module:X", "output.hooks = 'no_such_module:X': cannot import no_such_module"),
        ("my_hooks:NotAHook", "my_hooks.NotAHook is not one; expected a subclass of emulator.hooks.RoundHook"),
        ("my_hooks:Missing", "my_hooks.Missing does not exist"),
    ],
)
def test_a_hook_that_cannot_be_loaded_is_refused_in_one_line_before_anything_runs(tmp_path, spec, said):
    (tmp_path / "my_hooks.py").write_text(HOOK)
    r = emulator(tmp_path, *RUN, f"output.hooks=[{spec}]")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and said in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


def test_tensorboard_without_its_package_is_refused_naming_the_extra(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else find_spec(name, *a)
    )
    with pytest.raises(ConfigError, match=r"output\.tensorboard = 'tb': .*pip install 'dpfl-emulator\[tensorboard\]'"):
        load(None, ["output.tensorboard=tb"])


def test_a_sweeps_points_are_separate_tensorboard_runs_named_by_their_keys(tmp_path):
    r = emulator(tmp_path, "--multirun", *RUN, "budget.rounds=2", "dp.sigma=1.0,2.0", "output.tensorboard=tb")
    assert r.returncode == 0, r.stderr
    runs = sorted(str(p.parent.relative_to(tmp_path / "tb")) for p in (tmp_path / "tb").rglob("events.out.*"))
    assert runs == ["dp.sigma=1.0/seed=0", "dp.sigma=2.0/seed=0"]
    for run in runs:
        events = EventAccumulator(str(tmp_path / "tb" / run))
        events.Reload()
        assert [e.step for e in events.Scalars("accuracy/test")] == [0, 1]

"""What runs after each round (after pfl-research's `TrainingProcessCallback`): small named hooks,
called in round order once the round's evaluation is in (emulator.evaluation), then closed when the
run stops, however it stops.

The run's own are the rows writer, the checkpointer, the progress bar and the initial-model check.
A user's hook is a `RoundHook` subclass named in `output.hooks` as `package.module:ClassName`
(importable from the current directory or PYTHONPATH, as a user policy is), built with one argument,
the `RunInfo`; `output.tensorboard` adds the TensorBoard logger (emulator.tensorboard), which is one.
A hook reads the round; it must not change it: the next round does not wait for the hooks of the
one before when the evaluation overlaps training.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from tqdm import tqdm

from emulator import checkpoint, results
from emulator.round import RoundRecord, Weights
from emulator.user_code import load_user_class
from nodes.schema import DataConfig


@dataclass(frozen=True)
class RunInfo:
    """What a hook is built with: where the run writes, its scenario as run.json holds it, and the
    round it starts from (a resumed run's first round is its checkpoint's)."""

    run_dir: Path
    scenario: dict[str, Any]
    first_round: int
    rounds: int  # R_s: the rounds the budgets allow


class RoundHook:
    """One piece of after-round work. Every method is optional."""

    def after_round(self, record: RoundRecord) -> None:
        """Round `record.rnd` was played; its test loss and accuracy are in, or NaN for a round that is
        not evaluated. `record.round_row()` is its row of the rounds table."""

    def after_final_evaluation(self, rnd: int, test_loss: float, test_accuracy: float) -> None:
        """A stop found as the next round was planned: the evaluation of round `rnd`, the last played,
        which its after_round saw unevaluated."""

    def close(self) -> None:
        """The run has stopped (complete, interrupted or failed): release what the hook holds."""


class HookLoadError(ValueError):
    """An `output.hooks` entry cannot be used; the message is one line naming it."""


def load_hook(spec: str) -> Callable[[RunInfo], RoundHook]:
    """The RoundHook subclass `package.module:ClassName` names: built with the run's RunInfo."""
    cls = load_user_class("output.hooks", spec, RoundHook, "emulator.hooks.RoundHook", HookLoadError)
    return cast(Callable[[RunInfo], RoundHook], cls)


class RowsWriter(RoundHook):
    """The round's rows of the rounds, client_rounds and events tables (emulator.results)."""

    def __init__(self, writer: results.RunWriter, data: DataConfig) -> None:
        self.writer, self.data = writer, data

    def after_round(self, record: RoundRecord) -> None:
        self.writer.write_round(record.rnd, record.rows(self.data))

    def after_final_evaluation(self, rnd: int, test_loss: float, test_accuracy: float) -> None:
        self.writer.write_evaluation(rnd, test_loss, test_accuracy)


class Checkpointer(RoundHook):
    """The model and the state the round ended with (emulator.checkpoint), after its rows."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def after_round(self, record: RoundRecord) -> None:
        checkpoint.save(self.run_dir, record.weights, record.checkpoint)


class ProgressBar(RoundHook):
    def __init__(self, info: RunInfo, enabled: bool) -> None:
        self.bar = tqdm(
            total=info.rounds, initial=info.first_round, unit="round", disable=not enabled, dynamic_ncols=True
        )

    def after_round(self, record: RoundRecord) -> None:
        self.bar.update(1)
        eps = max(record.epsilon)
        self.bar.set_postfix(t=f"{record.timeline.t_end:.1f}s", acc=f"{record.test_accuracy:.3f}", eps=f"{eps:.2f}")

    def close(self) -> None:
        self.bar.close()


class InitialModelMismatch(RuntimeError):
    """A local worker's initial model is not the evaluator's: the run would not be the seed's."""


class InitialModelCheck(RoundHook):
    """Round 0 started from a local worker's build of the initial model while the evaluator's was on
    its way: before round 0's rows, the two must be equal. Not as round 0 ends, which would hold
    round 1 back until the evaluator is set up."""

    def __init__(self, adopted: Weights | None, built: Future[Weights]) -> None:
        self.adopted, self.built = adopted, built

    def after_round(self, record: RoundRecord) -> None:
        adopted, self.adopted = self.adopted, None
        if adopted is None:
            return
        built = self.built.result()
        differ = [k for k in built if not np.array_equal(built[k], adopted[k])]
        if differ:
            raise InitialModelMismatch(
                f"the evaluator's initial model differs from the local workers' in {', '.join(differ)}: "
                "the same code, seed and torch should build it bit for bit"
            )

"""What runs after each round (after pfl-research's `TrainingProcessCallback`): small named hooks,
called in round order once the round's evaluation is in (emulator.run.evaluation), then closed when the
run stops, however it stops.

The run's own are the rows writer, the checkpointer, the progress bar and the initial-model check
(emulator.run.run_hooks).
A user's hook is a `RoundHook` subclass named in `output.hooks` as `package.module:ClassName`
(importable from the current directory or PYTHONPATH, as a user policy is), built with one argument,
the `RunInfo`; `output.tensorboard` adds the TensorBoard logger (emulator.output.tensorboard), which is one.
A hook reads the round; it must not change it: the next round does not wait for the hooks of the
one before when the evaluation overlaps training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from emulator.rounds.round import RoundRecord
from nodes.contracts.plugins import load_user_class


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

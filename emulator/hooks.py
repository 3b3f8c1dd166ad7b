"""What runs after each round (after pfl-research's `TrainingProcessCallback`): small named hooks.

They are called in round order once the round's evaluation is in (emulator.run.evaluation), then closed
when the run stops, however it stops.

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
    """What a hook is built with: where the run writes, its scenario, the rounds it plays.

    Attributes:
        run_dir: The run directory, where the run writes.
        scenario: The run's scenario as run.json holds it.
        first_round: The round the run starts from (a resumed run's first round is its checkpoint's).
        rounds: R_s: the rounds the budgets allow.
    """

    run_dir: Path
    scenario: dict[str, Any]
    first_round: int
    rounds: int


class RoundHook:
    """One piece of after-round work. Every method is optional.

    A user's hook is built with one argument, the run's `RunInfo`; it reads each round and must not
    change it.
    """

    def after_round(self, record: RoundRecord) -> None:
        """Read round `record.rnd`, which was played and whose evaluation is in.

        Args:
            record: The round: its test loss and accuracy are in, or NaN for a round that is not evaluated.
                `record.round_row()` is its row of the rounds table.
        """

    def after_final_evaluation(self, rnd: int, test_loss: float, test_accuracy: float) -> None:
        """Read the evaluation of round `rnd`, the last played, that a stop found as the next round was planned.

        Its after_round saw it unevaluated.

        Args:
            rnd: The last round played.
            test_loss: Its model's mean test loss.
            test_accuracy: Its model's test accuracy.
        """

    def close(self) -> None:
        """Release what the hook holds: the run has stopped (complete, interrupted or failed)."""


class HookLoadError(ValueError):
    """An `output.hooks` entry cannot be used; the message is one line naming it."""


def load_hook(spec: str) -> Callable[[RunInfo], RoundHook]:
    """Return the RoundHook subclass that an `output.hooks` entry names.

    Args:
        spec: `package.module:ClassName`, importable from the current directory or PYTHONPATH.

    Returns:
        The class, built with the run's RunInfo.

    Raises:
        HookLoadError: `spec` is not of that form, its module does not import, or its class does not exist
            or is not a RoundHook subclass (one line naming `output.hooks`).
    """
    cls = load_user_class("output.hooks", spec, RoundHook, "emulator.hooks.RoundHook", HookLoadError)
    return cast(Callable[[RunInfo], RoundHook], cls)

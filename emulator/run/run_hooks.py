"""The run's own after-round hooks (emulator.hooks): its rows, its checkpoint, the progress bar, and
the check that round 0 started from the model the evaluator builds."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import numpy as np
from tqdm import tqdm

from emulator.hooks import RoundHook, RunInfo
from emulator.output import checkpoint, results
from emulator.rounds.round import RoundRecord
from nodes.contracts.schema import DataConfig
from nodes.contracts.tasks import Weights


class RowsWriter(RoundHook):
    """The round's rows of the rounds, client_rounds and events tables (emulator.output.results)."""

    def __init__(self, writer: results.RunWriter, data: DataConfig) -> None:
        self.writer, self.data = writer, data

    def after_round(self, record: RoundRecord) -> None:
        self.writer.write_round(record.rnd, record.rows(self.data))

    def after_final_evaluation(self, rnd: int, test_loss: float, test_accuracy: float) -> None:
        self.writer.write_evaluation(rnd, test_loss, test_accuracy)


class Checkpointer(RoundHook):
    """The model and the state the round ended with (emulator.output.checkpoint), after its rows."""

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
        eps = record.max_epsilon
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

"""`output.tensorboard=DIR`: each round's accuracy, losses, largest epsilon, bytes, outcome counts and
virtual time as TensorBoard scalars (step = round), so `tensorboard --logdir DIR` shows a run, or a
sweep's runs side by side, as they go. A `RoundHook` like any user's; written with TensorBoard's own
event writer (the server imports no torch). Optional: pip install 'dpfl-emulator[tensorboard]'."""

from __future__ import annotations

import math
import time
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from emulator.hooks import RoundHook, RunInfo
from emulator.rounds.round import RoundRecord

# tag -> the rounds-table column it shows
SCALARS = {
    "accuracy/test": "test_accuracy",
    "loss/test": "test_loss",
    "loss/train": "train_loss",
    "privacy/max_epsilon": "max_epsilon",
    "bytes/total": "bytes_total",
    "bytes/up": "bytes_up",
    "bytes/down": "bytes_down",
    "updates/arrived": "arrived",
    "updates/late": "late",
    "updates/lost": "lost",
    "updates/failed": "failed",
    "time/virtual_s": "t_end",
}


class TensorBoardLogger(RoundHook):
    """One run's event files in DIR/<its name>: a sweep's point (a run directory below `key=value`
    directories, as sweeps and bench.reproduce lay them out) by its `key=value/.../seed=S` path, so
    that the points of one sweep stay apart; any other run by its directory's name."""

    def __init__(self, directory: str, info: RunInfo) -> None:
        self.writer = EventFileWriter(str(Path(directory) / run_name(info.run_dir)))
        # a resumed run replays the rounds after its checkpoint: TensorBoard drops the earlier events
        # from that step on (its reader's purge of orphaned data)
        self._add(Event(step=info.first_round, session_log=SessionLog(status=SessionLog.START)))

    def after_round(self, record: RoundRecord) -> None:
        row = record.round_row()
        self._scalars(record.rnd, {tag: row[column] for tag, column in SCALARS.items()})

    def after_final_evaluation(self, rnd: int, test_loss: float, test_accuracy: float) -> None:
        self._scalars(rnd, {"accuracy/test": test_accuracy, "loss/test": test_loss})

    def close(self) -> None:
        self.writer.close()

    def _scalars(self, step: int, values: dict[str, float | int | None]) -> None:
        """The values that are numbers: an unevaluated round has no test accuracy yet (NaN)."""
        shown = [
            Summary.Value(tag=tag, simple_value=float(v))
            for tag, v in values.items()
            if v is not None and not math.isnan(float(v))
        ]
        if shown:
            self._add(Event(step=step, summary=Summary(value=shown)))
        self.writer.flush()  # a sweep is watched live

    def _add(self, event: Event) -> None:
        event.wall_time = time.time()
        self.writer.add_event(event)


def run_name(run_dir: Path) -> Path:
    """The trailing `key=value` directories of a sweep's point, or the run directory's own name."""
    hive = list(run_dir.parts)
    while hive and "=" in hive[-1]:
        hive.pop()
    return Path(*run_dir.parts[len(hive) :]) if len(hive) < len(run_dir.parts) else Path(run_dir.name)

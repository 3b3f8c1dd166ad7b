"""A hook for `python -m bench`'s steady state: the wall-clock moment each round's hooks ran, in this
process. With eval.overlap a round's hooks run while the next round trains, so consecutive moments lie one
round apart: the round's whole period (plan, training, aggregation and the server's after-round work),
where the rounds table's wall_s covers plan to aggregation only."""

from __future__ import annotations

import time

from emulator.hooks import RoundHook, RunInfo
from emulator.round import RoundRecord

STAMPS: dict[str, list[float]] = {}  # run directory -> perf_counter() at each round's after_round


class Stamps(RoundHook):
    def __init__(self, info: RunInfo) -> None:
        self.times = STAMPS.setdefault(str(info.run_dir), [])

    def after_round(self, record: RoundRecord) -> None:
        self.times.append(time.perf_counter())

"""For `python -m bench`'s steady state: the moment each round of a run in this process starts (its plan),
so that consecutive moments lie one round's whole period apart: plan, training, aggregation, and whatever
of the server's after-round work holds the next plan back. A hook's moments would not: with eval.overlap a
round's hooks run once its evaluation is in, during a later round, and several rounds' at once."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from emulator.run import round_loop


@contextmanager
def round_starts() -> Iterator[list[float]]:
    """perf_counter() as each synchronous round starts (RoundLoop's play_round), for runs in this process
    while inside, in the order played."""
    starts: list[float] = []
    names = vars(round_loop)  # the loop's own name for play_round, which it calls each round
    play_round = names["play_round"]

    def timed(*args: Any, **kwargs: Any) -> Any:
        starts.append(time.perf_counter())
        return play_round(*args, **kwargs)

    names["play_round"] = timed
    try:
        yield starts
    finally:
        names["play_round"] = play_round


def steady_period(starts: list[float]) -> float:
    """The median of a run's round periods from round 1's start on (start-up and round 0 excluded)."""
    return statistics.median(b - a for a, b in itertools.pairwise(starts[1:]))

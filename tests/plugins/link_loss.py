"""A user's loss model (links.dropout.model=tests.plugins.link_loss:EveryKthClient): every transfer of
each k-th client is lost, and no other; no randomness, so each outcome is known beforehand."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from emulator.timemodel.loss import LossModel
from nodes.contracts.schema import Range


@dataclass
class EveryKthClientOptions:
    k: int = 2  # the clients 0, k, 2k, ... lose every transfer
    RANGES: ClassVar[dict[str, Range]] = dict(k=Range(1, 10**6))


class EveryKthClient(LossModel):
    """Loses every transfer of the clients whose id is a multiple of `links.dropout.args.k`."""

    Options = EveryKthClientOptions
    options: EveryKthClientOptions  # links.dropout.args, as Options
    draws = False
    stateful = False

    def lost(self, direction: str, t_start: float, t_end: float, rng: np.random.Generator | None) -> bool:
        return self.client_id % self.options.k == 0

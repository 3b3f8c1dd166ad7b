"""A client's losses: whether a transfer is lost, by the scenario's loss model or an outage window."""

from __future__ import annotations

import numpy as np

from emulator.timemodel.bandwidth import DIRECTIONS, check_direction
from nodes.contracts.schema import DropoutConfig, DropoutDirection, DropoutModel


class LinkLoss:
    """One client's dropout process; the Gilbert-Elliott state persists across rounds.

    Each call to `lost` is one transfer. The loss model runs on every transfer whatever
    its direction (the Gilbert-Elliott chain is the state of the client's link and
    steps once per transfer, transition first, then a loss draw with the new state's
    probability); `cfg.direction` then decides whether this transfer can be lost at all,
    by the model or by an outage window. Draws per call are fixed: none 0,
    bernoulli 1, gilbert_elliott 2 — never dependent on direction or outcome.
    """

    def __init__(self, cfg: DropoutConfig, client_id: int):
        self.cfg = cfg  # its model and direction are admitted choices (emulator.config validates them)
        self.client_id = client_id
        self.directions = set(DIRECTIONS) if cfg.direction == DropoutDirection.BOTH else {cfg.direction}
        self.outages = [(float(o.start), float(o.end)) for o in cfg.outages if not o.clients or client_id in o.clients]
        self.bad = False  # Gilbert-Elliott state; starts good
        # whether a transfer consumes randomness: without, `lost` takes None for its generator
        self.draws = cfg.model in (DropoutModel.BERNOULLI, DropoutModel.GILBERT_ELLIOTT)

    def lost(self, direction: str, t_start: float, t_end: float, rng: np.random.Generator | None) -> bool:
        """Whether the transfer occupying [t_start, t_end] in `direction` is lost."""
        check_direction(direction)
        by_model = self._step(rng)
        if direction not in self.directions:
            return False
        return by_model or self.in_outage(t_start, t_end)

    def in_outage(self, t_start: float, t_end: float) -> bool:
        """The link is down on [start, end) of each window. A transfer on [t_start, t_end]
        hits a window if it overlaps it for a positive time; a zero-length transfer
        if start <= t_start < end."""
        return any(t_start < end and (t_end > start or start <= t_start) for start, end in self.outages)

    def _step(self, rng: np.random.Generator | None) -> bool:
        cfg = self.cfg
        if not self.draws:
            return False
        assert rng is not None, "a loss model that draws needs the transfer's generator"
        if cfg.model == DropoutModel.BERNOULLI:
            return bool(rng.random() < cfg.p)
        u_transition, u_loss = rng.random(2)  # gilbert_elliott
        if self.bad:
            self.bad = not u_transition < cfg.p_bad_to_good
        else:
            self.bad = bool(u_transition < cfg.p_good_to_bad)
        return bool(u_loss < (cfg.loss_bad if self.bad else cfg.loss_good))

"""A client's losses: whether a transfer is lost, by the scenario's loss model or an outage window.

A loss model is a `LossModel` subclass in `LOSS_MODELS`: the built-ins by name, a user's as
`links.dropout.model=package.module:ClassName`, its options from the free-form `links.dropout.args`,
checked by the class's `Options` dataclass. Only the server imports it: the clock is the server's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from emulator.timemodel.bandwidth import DIRECTIONS, check_direction
from nodes.contracts.plugins import Registry, parse_options
from nodes.contracts.schema import DropoutConfig, DropoutDirection


class LossModelLoadError(ValueError):
    """links.dropout.model or links.dropout.args cannot be used; the message is one line naming the key."""


class LossModel:
    """Whether each transfer over one client's link is lost: one instance per client, for the whole run.

    `lost` is asked once per transfer the clock completes, in virtual-time order, whatever its direction
    (`links.dropout.direction` and the outage windows apply after it). Its only randomness is the
    generator it is given, the client's (seed, "loss", round, client) stream, shared by the round's
    transfers in their order: draw the same number of values on every call, whatever the outcome or the
    direction, so that each draw stays where it was when something else changes.

    Its only memory across transfers is `self.bad`, the link's state (False, good, at first): the
    emulator keeps it in checkpoints and restores it where it replays a round, so a resumed run is the
    uninterrupted one. Anything else `lost` needs comes from its options, the client id and the
    transfer.

    Write `lost` in a subclass (and `Options`, a dataclass, for options of its own) and name it as
    `links.dropout.model=package.module:ClassName`, its options as `links.dropout.args.NAME=VALUE`;
    the server imports it.

    Args:
        cfg: the scenario's `links.dropout` section.
        options: `links.dropout.args` as an instance of `Options` (None for a class without).
        client_id: the client whose link this is.
    """

    Options: ClassVar[type | None] = None  # the dataclass that checks links.dropout.args; None: it takes none
    draws: ClassVar[bool] = True  # whether `lost` draws from its generator; False: it is given None
    stateful: ClassVar[bool] = True  # whether `lost` may set `self.bad`; False: checkpoints skip its links

    def __init__(self, cfg: DropoutConfig, options: Any, client_id: int) -> None:
        """Keep the section, the options and the client id; the link starts good."""
        self.cfg, self.options, self.client_id = cfg, options, client_id
        self.bad = False

    def lost(self, direction: str, t_start: float, t_end: float, rng: np.random.Generator | None) -> bool:
        """Decide whether one transfer is lost.

        Args:
            direction: "down" (the task) or "up" (the update).
            t_start: when the transfer started, virtual seconds.
            t_end: when its last bit arrived.
            rng: the client's loss stream this round; None where `draws` is False.

        Returns:
            Whether the model loses it.
        """
        raise NotImplementedError


LOSS_MODELS: Registry[LossModel] = Registry(
    "links.dropout.model", LossModel, "emulator.timemodel.loss.LossModel", LossModelLoadError
)


@LOSS_MODELS.register("none")
class NoLoss(LossModel):
    """Nothing is lost but by an outage window."""

    draws = stateful = False

    def lost(self, direction: str, t_start: float, t_end: float, rng: np.random.Generator | None) -> bool:
        """Lose nothing: only an outage window loses a transfer."""
        return False


@LOSS_MODELS.register("bernoulli")
class Bernoulli(LossModel):
    """Each transfer lost with probability `p`, one draw each."""

    stateful = False

    def lost(self, direction: str, t_start: float, t_end: float, rng: np.random.Generator | None) -> bool:
        """Lose the transfer with probability `p`, one draw."""
        assert rng is not None
        return bool(rng.random() < self.cfg.p)


@LOSS_MODELS.register("gilbert_elliott")
class GilbertElliott(LossModel):
    """A two-state chain that steps once per transfer: two draws each.

    The transition comes first, then a loss draw with the new state's probability.
    """

    def lost(self, direction: str, t_start: float, t_end: float, rng: np.random.Generator | None) -> bool:
        """Step the chain, then lose the transfer with the new state's probability."""
        assert rng is not None
        cfg = self.cfg
        u_transition, u_loss = rng.random(2)
        if self.bad:
            self.bad = not u_transition < cfg.p_bad_to_good
        else:
            self.bad = bool(u_transition < cfg.p_good_to_bad)
        return bool(u_loss < (cfg.loss_bad if self.bad else cfg.loss_good))


def loss_options(cfg: DropoutConfig) -> Any:
    """Parse `links.dropout.args` as the chosen model's Options, the model imported where it is a user's.

    Args:
        cfg: the scenario's `links.dropout` section.

    Returns:
        An instance of the model's `Options`; None for a model without.

    Raises:
        LossModelLoadError: the model or its options do not fit; one line naming the key.
    """
    model = LOSS_MODELS.get(cfg.model)
    return parse_options(model.Options, cfg.args, "links.dropout.args", "the loss model", LossModelLoadError)


class LinkLoss:
    """One client's dropout process: its loss model on every transfer, then the direction and the outages.

    `cfg.direction` decides whether this transfer can be lost at all, by the model or by an outage window.

    Args:
        cfg: the scenario's `links.dropout` section, its model an admitted one (emulator.config).
        client_id: the client whose link this is.
        options: `loss_options(cfg)`, parsed once a run (None: the model takes none).
    """

    def __init__(self, cfg: DropoutConfig, client_id: int, options: Any = None):
        """Build the client's loss model and find the outage windows of its link."""
        self.cfg = cfg
        self.client_id = client_id
        self.model = LOSS_MODELS.get(cfg.model)(cfg, options, client_id)
        self.directions = set(DIRECTIONS) if cfg.direction == DropoutDirection.BOTH else {cfg.direction}
        self.outages = [(float(o.start), float(o.end)) for o in cfg.outages if not o.clients or client_id in o.clients]
        # whether a transfer consumes randomness: without, `lost` takes None for its generator
        self.draws = self.model.draws

    @property
    def bad(self) -> bool:
        """The link's state, which the model keeps (Gilbert-Elliott's bad state)."""
        return self.model.bad

    @bad.setter
    def bad(self, bad: bool) -> None:
        self.model.bad = bad

    def lost(self, direction: str, t_start: float, t_end: float, rng: np.random.Generator | None) -> bool:
        """Decide whether the transfer occupying [t_start, t_end] in `direction` is lost."""
        check_direction(direction)
        assert rng is not None or not self.draws, "a loss model that draws needs the transfer's generator"
        by_model = self.model.lost(direction, t_start, t_end, rng)
        if direction not in self.directions:
            return False
        return by_model or self.in_outage(t_start, t_end)

    def in_outage(self, t_start: float, t_end: float) -> bool:
        """Decide whether the transfer on [t_start, t_end] falls in an outage window.

        The link is down on [start, end) of each window. A transfer on [t_start, t_end] hits a window if it
        overlaps it for a positive time; a zero-length transfer if start <= t_start < end.
        """
        return any(t_start < end and (t_end > start or start <= t_start) for start, end in self.outages)

"""The loss-model registry (emulator.timemodel.loss.LOSS_MODELS): built-ins by name, a user's class by
reference with its links.dropout.args, each bad name or option one line naming its key, and a user
model's state kept as a built-in's is."""

import numpy as np
import pytest

from emulator.config import ConfigError, load
from emulator.config.help import help_text
from emulator.run.state import links_bad
from emulator.timemodel.loss import LOSS_MODELS, LinkLoss, LossModel, loss_options
from emulator.timemodel.resources import build_resources
from nodes.contracts.schema import DropoutConfig
from tests.plugins.link_loss import EveryKthClient, EveryKthClientOptions

EVERY_KTH = "tests.plugins.link_loss:EveryKthClient"


class Flips(LossModel):
    """Loses every other transfer, the first one first: its memory is the link's state alone."""

    draws = False

    def lost(self, direction: str, t_start: float, t_end: float, rng: np.random.Generator | None) -> bool:
        self.bad = not self.bad
        return self.bad


def test_the_built_ins_are_registered_by_name_and_a_users_class_by_reference():
    assert LOSS_MODELS.names() == ("none", "bernoulli", "gilbert_elliott")
    assert LOSS_MODELS.get(EVERY_KTH) is EveryKthClient


def test_a_users_model_gets_its_options_and_the_direction_and_outages_still_apply():
    cfg = DropoutConfig(model=EVERY_KTH, args={"k": 3}, direction="up")
    options = loss_options(cfg)
    assert options == EveryKthClientOptions(k=3)
    losses = [LinkLoss(cfg, c, options) for c in range(6)]
    assert [loss.lost("up", 0.0, 1.0, None) for loss in losses] == [True, False, False, True, False, False]
    assert not any(loss.lost("down", 0.0, 1.0, None) for loss in losses)  # direction=up


def test_a_users_model_keeps_its_state_in_the_link_as_the_checkpoint_does():
    cfg = load(None, ["clients.n=4", f"links.dropout.model={__name__}:Flips"])
    resources = build_resources(cfg.links, cfg.compute, cfg.availability, cfg.clients.n, cfg.seed)
    assert [resources[c].loss.lost("down", 0.0, 1.0, None) for c in (0, 1, 1)] == [True, True, False]
    assert links_bad(resources) == [0]  # what the checkpoint keeps, and resume sets back


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["links.dropout.model=weibull"],
            "links.dropout.model = 'weibull': expected none | bernoulli | gilbert_elliott | package.module:ClassName",
        ),
        (["links.dropout.model=no_such_module:Loss"], "links.dropout.model = 'no_such_module:Loss': cannot import"),
        (
            ["links.dropout.model=nodes.contracts.schema:DropoutConfig"],
            "links.dropout.model = 'nodes.contracts.schema:DropoutConfig': nodes.contracts.schema.DropoutConfig is not "
            "one; expected a subclass of emulator.timemodel.loss.LossModel",
        ),
        (
            [f"links.dropout.model={EVERY_KTH}", "links.dropout.args.kk=3"],
            "links.dropout.args.kk: unknown key (the loss model's EveryKthClientOptions has k)",
        ),
        (
            [f"links.dropout.model={EVERY_KTH}", "links.dropout.args.k=three"],
            "links.dropout.args.k = 'three': expected int",
        ),
        (
            [f"links.dropout.model={EVERY_KTH}", "links.dropout.args.k=0"],
            "links.dropout.args.k = 0: expected an integer in [1, 1000000]",
        ),
        (
            ["links.dropout.model=bernoulli", "links.dropout.args.k=3"],
            "links.dropout.args.k: unknown key (the loss model takes no options)",
        ),
    ],
)
def test_a_loss_model_or_option_that_cannot_be_used_is_one_config_error_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_help_lists_the_loss_models_and_a_users_own():
    (line,) = [line for line in help_text().splitlines() if line.startswith("  links.dropout.model =")]
    assert line.endswith(": none | bernoulli | gilbert_elliott | package.module:ClassName (your own)")

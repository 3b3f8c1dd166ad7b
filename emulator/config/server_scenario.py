"""ServerScenario, the scenario the server reads: the schema every process reads (nodes.contracts.schema)
plus the sections of the server's policies, which the policy registry decides; and what of it a policy
is given (`policy_options`, `policy_settings`) and a round (`round_settings`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, make_dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any, cast

from omegaconf import OmegaConf

from emulator.policies import POLICIES, Policy, is_user_policy
from emulator.policies.base import RunSettings
from emulator.policies.options import parse_options
from emulator.policies.population import participation_caveat
from emulator.rounds.round import RoundSettings
from nodes.contracts import schema

if TYPE_CHECKING:

    class ServerScenario(schema.Scenario):
        """The class below as the type checker sees it. It is built at import time from the policy
        registry, so the sections named after the policies are not declared here (each policy reads
        its own); `policy_args`, which every build has, is."""

        policy_args: dict[str, Any]

else:
    # Every run's sections, then one per policy that has options, named after it (ali_dpfl.gamma=...),
    # and the free-form options of a user's policy.
    ServerScenario = make_dataclass(
        "ServerScenario",
        [
            (name, policy.Options, schema.setting(None, policy.options_help, policy.Options))
            for name, policy in POLICIES.items()
            if policy.Options
        ]
        + [
            (
                "policy_args",
                dict[str, Any],
                schema.setting(
                    None,
                    "options of a user policy (policy=package.module:ClassName), checked by its Options dataclass",
                    dict,
                ),
            )
        ],
        bases=(schema.Scenario,),
        namespace={"__module__": __name__, "__doc__": "A scenario as its file is written."},
    )


def value_at(c: schema.Scenario, names: list[str]) -> Any:
    """The value at a dotted key's names (["links", "trace", "down"]): of its schema field's type."""
    return reduce(getattr, names, c)


def chosen_sections(scenario: Mapping[str, Any]) -> dict[str, Any]:
    """A scenario as a dict without the sections of the built-in policies it did not choose: a
    ServerScenario (and so to_dict and older run.json files) holds every one, only one is read."""
    return {k: v for k, v in scenario.items() if not (k in POLICIES and k != scenario.get("policy"))}


def from_dict(d: dict[str, Any]) -> ServerScenario:
    """The scenario of run.json (schema.to_dict's), checked by OmegaConf: its types, and no key the
    schema lacks."""
    own = {k: v for k, v in d.items() if k in {f.name for f in fields(ServerScenario)}}
    merged = OmegaConf.merge(OmegaConf.structured(ServerScenario), OmegaConf.create(own))
    return cast(ServerScenario, OmegaConf.to_object(merged))


def policy_options(cls: type[Policy], c: schema.Scenario) -> Any:
    """The options the scenario's policy `cls` is given: a built-in's section of the scenario (c.<name>), a user
    policy's (policy=module:Class) `policy_args` as its Options (PolicyLoadError naming
    `policy_args.<key>` where they do not fit); None for a policy without options."""
    if is_user_policy(c.policy):
        return parse_options(cls.Options, getattr(c, "policy_args", {}))  # a ServerScenario's
    return getattr(c, cls.name, None)


def policy_settings(c: schema.Scenario) -> RunSettings:
    """The run's settings a policy may read besides its own options (`RunContext.settings`)."""
    return RunSettings(
        seed=c.seed,
        dp=c.dp,
        n_clients=c.clients.n,
        select=c.clients.select,
        per_round=c.clients.per_round,
        deadline_s=c.round.deadline_s,
        rounds=c.budget.rounds,
        server_up_bps=c.links.server_up_bps,
        sampling_caveat=participation_caveat(c.availability, c.links, c.compute, c.round, c.budget),
    )


def round_settings(c: schema.Scenario) -> RoundSettings:
    """What a round reads of the scenario (emulator.rounds.round.play_round's `settings`)."""
    r = c.round
    return RoundSettings(c.budget.time_s, r.partial_work, r.partial_work_normalize, c.impact, c.compression, c.policy)

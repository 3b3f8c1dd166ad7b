"""A policy built as the run builds it (emulator.run.lifecycle): its options and the run's settings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from emulator.config import policy_options, policy_settings
from emulator.policies import Policy, RunContext, policy_class


def scenario_policy(cfg: Any, ctx: RunContext, cls: type[Policy] | None = None) -> Any:
    """The scenario's policy (or `cls`) on `ctx`, given its options and, in ctx.settings, the scenario's; the
    scenario is kept as `policy.scenario`, for the tests that play its rounds."""
    cls = cls or policy_class(cfg.policy)
    policy = cls(policy_options(cls, cfg), replace(ctx, settings=policy_settings(cfg)))
    policy.scenario = cfg
    return policy

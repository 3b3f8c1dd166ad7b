"""A policy's own options from free-form scenario keys (`policy_args`), checked by its `Options`
dataclass: OmegaConf converts and type-checks, the class's `RANGES` bound the numbers
(nodes.contracts.plugins.parse_options, which every plug-in's options share)."""

from __future__ import annotations

from typing import Any

from nodes.contracts import plugins


class PolicyLoadError(ValueError):
    """The policy or its arguments cannot be used; the message is one line naming the key."""


def is_user_policy(name: str) -> bool:
    """policy=package.module:ClassName rather than a built-in's name."""
    return ":" in name


def parse_options(options: type | None, args: dict[str, Any]) -> Any:
    """`args` (policy_args) as an instance of the `options` dataclass; PolicyLoadError naming
    `policy_args.<key>` if they do not fit it. (Any: an instance of whichever dataclass `options` is.)"""
    return plugins.parse_options(options, args, "policy_args", "the policy", PolicyLoadError)

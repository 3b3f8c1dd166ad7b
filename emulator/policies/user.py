"""User policies without forking: `policy=package.module:ClassName` names a `Policy` subclass
importable from the current directory or PYTHONPATH; its options come from the free-form
`policy_args` section, checked by the class's own `Options` dataclass and its `RANGES`.
"""

from __future__ import annotations

from emulator.policies.base import Policy
from emulator.policies.options import PolicyLoadError
from nodes.contracts.plugins import load_user_class


def load_policy(spec: str) -> type[Policy]:
    """The Policy subclass `package.module:ClassName` names."""
    return load_user_class("policy", spec, Policy, "emulator.policies.Policy", PolicyLoadError)

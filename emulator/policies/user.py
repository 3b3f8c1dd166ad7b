"""User policies without forking: `policy=package.module:ClassName` names a `Policy` subclass
importable from the current directory or PYTHONPATH; its options come from the free-form
`policy_args` section, checked by the class's own `Options` dataclass and its `RANGES`.
"""

from __future__ import annotations

import importlib
import os
import sys

from emulator.policies.base import Policy
from emulator.policies.options import PolicyLoadError


def load_policy(spec: str) -> type[Policy]:
    """The class `package.module:ClassName` names; the current directory is searched first, as
    `python -m emulator` does."""
    module_name, _, class_name = spec.partition(":")
    expected = "package.module:ClassName, a Policy subclass importable from the current directory or PYTHONPATH"
    if not module_name or not class_name.isidentifier():
        raise PolicyLoadError(f"policy = {spec!r}: expected {expected}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # a user module may fail in any way while it is imported
        raise PolicyLoadError(
            f"policy = {spec!r}: cannot import {module_name} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); expected {expected}"
        ) from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        found = (
            "does not exist"
            if cls is None
            else f"is a {type(cls).__name__}"
            if not isinstance(cls, type)
            else "is not one"
        )
        raise PolicyLoadError(
            f"policy = {spec!r}: {module_name}.{class_name} {found}; expected a subclass of emulator.policies.Policy"
        )
    return cls

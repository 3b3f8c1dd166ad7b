"""A user's class named on the command line as `package.module:ClassName` (a policy, a round hook),
imported from the current directory or PYTHONPATH, as `python -m emulator` itself is run."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TypeVar

T = TypeVar("T")


def load_user_class(key: str, spec: str, base: type[T], public_name: str, error: type[ValueError]) -> type[T]:
    """The subclass of `base` (imported by users as `public_name`) that `spec` names; any problem is one
    `error` naming `key`."""
    module_name, _, class_name = spec.partition(":")
    expected = (
        f"package.module:ClassName, a {base.__name__} subclass importable from the current directory or PYTHONPATH"
    )
    if not module_name or not class_name.isidentifier():
        raise error(f"{key} = {spec!r}: expected {expected}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # a user module may fail in any way while it is imported
        first = str(e).splitlines()[0] if str(e) else ""
        raise error(
            f"{key} = {spec!r}: cannot import {module_name} ({type(e).__name__}: {first}); expected {expected}"
        ) from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        found = (
            "does not exist"
            if cls is None
            else f"is a {type(cls).__name__}"
            if not isinstance(cls, type)
            else "is not one"
        )
        raise error(f"{key} = {spec!r}: {module_name}.{class_name} {found}; expected a subclass of {public_name}")
    return cls

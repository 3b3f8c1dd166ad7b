"""Plug-ins: a user's class named on the command line as `package.module:ClassName`, and their registries.

A plug-in is a policy, a round hook, an accountant, a codec, a dataset or a link-loss model; a user's is
imported from the current directory or PYTHONPATH, as `python -m emulator` itself is run. One `Registry`
per kind of plug-in holds the built-in ones by name (after Opacus's `accountants/registry.py`), and a
plug-in's own options come from free-form scenario keys (`parse_options`).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, get_type_hints

from nodes.contracts.schema import check_ranges

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")


def load_user_class(key: str, spec: str, base: type[T], public_name: str, error: type[ValueError]) -> type[T]:
    """Import the subclass of `base` that `spec` names.

    The current directory is put first on sys.path where neither it nor "" is there.

    Args:
        key: the scenario key whose value `spec` is, named by every error.
        spec: `package.module:ClassName`.
        base: the class it must be a subclass of.
        public_name: where users import `base` from, as an error tells them.
        error: the exception any problem raises.

    Returns:
        The class.

    Raises:
        ValueError: an `error`, one line naming `key`, for any problem: a malformed `spec`, a module that
            cannot be imported, a name that does not exist or is not a subclass of `base`.
    """
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


def is_user_class(name: str) -> bool:
    """Return whether a key's value names a user's class (`package.module:ClassName`) rather than a built-in."""
    return ":" in name


class Registry(Generic[T]):
    """The plug-ins of one kind: the built-in ones by name, and any user's class by reference.

    A built-in registers with one line, `@REGISTRY.register("name")` on its class; a user's is named
    as `package.module:ClassName` in the scenario key, and is imported when asked for.

    Args:
        key: the scenario key that chooses the plug-in (`dp.accountant`), named by every error.
        base: the class every plug-in of this kind subclasses.
        public_name: where users import `base` from, as an error tells them.
        error: the exception a bad name raises (a ValueError, one line).
    """

    def __init__(self, key: str, base: type[T], public_name: str, error: type[ValueError] = ValueError) -> None:
        """Keep the key, the base class, its public name and the error; no built-in is registered yet."""
        self.key, self.base, self.public_name, self.error = key, base, public_name, error
        self._built_in: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Register the decorated class as the built-in `name`.

        Args:
            name: the plain name (no ":") the scenario key takes for it.

        Returns:
            The decorator, which returns the class unchanged.

        Raises:
            ValueError: from the decorator, where `name` is registered twice or is not a plain name.
        """

        def add(cls: type[T]) -> type[T]:
            if name in self._built_in or is_user_class(name):
                raise ValueError(f"{self.key}: {name!r} is registered twice or is not a plain name")
            self._built_in[name] = cls
            return cls

        return add

    def names(self) -> tuple[str, ...]:
        """Return the built-in names, in the order they registered."""
        return tuple(self._built_in)

    def admits(self, name: str) -> bool:
        """Return whether `name` is a built-in or has the form of a user's class (imported only by `get`).

        Args:
            name: the scenario key's value.

        Returns:
            True for a built-in, or for a name of the form `package.module:ClassName`.
        """
        return name in self._built_in or is_user_class(name)

    def describe(self) -> str:
        """Return the choices, as `--help` and errors list them."""
        return " | ".join(self.names()) + " | package.module:ClassName"

    def get(self, name: str) -> type[T]:
        """Return the class `name` stands for, importing it where it is a user's.

        Args:
            name: a built-in name, or `package.module:ClassName`.

        Returns:
            The class.

        Raises:
            ValueError: an `error`, for any problem, one line naming the key and what was expected: an
                unknown built-in name, or a user's class that `load_user_class` cannot load.
        """
        if is_user_class(name):
            return load_user_class(self.key, name, self.base, self.public_name, self.error)
        if name not in self._built_in:
            raise self.error(f"{self.key} = {name!r}: expected {self.describe()}")
        return self._built_in[name]


def parse_options(options: type | None, args: dict[str, Any], prefix: str, owner: str, error: type[ValueError]) -> Any:
    """Parse `args` as an instance of the `options` dataclass.

    OmegaConf converts and type-checks (imported here: a worker never parses options).

    Args:
        options: the plug-in's options dataclass; None for a plug-in that takes none.
        args: the free-form scenario keys, by name.
        prefix: where they are in the scenario (`policy_args`), named by every error.
        owner: what takes them ("the policy"), as an error names it.
        error: the exception any problem raises.

    Returns:
        An instance of whichever dataclass `options` is (hence Any); None without one.

    Raises:
        ValueError: an `error`, one line naming `<prefix>.<key>`: an unknown key, a wrong type or a number
            outside the class's RANGES.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if options is None:
        if args:
            raise error(f"{prefix}.{next(iter(args))}: unknown key ({owner} takes no options)")
        return None
    names = [f.name for f in fields(options)]
    for key in args:
        if key not in names:
            raise error(
                f"{prefix}.{key}: unknown key ({owner}'s {options.__name__} has {', '.join(names) or 'no fields'})"
            )
    try:
        # a structured config's object is an instance of its dataclass, `options`
        parsed = cast("DataclassInstance", OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(options), args)))
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "")
        hint = get_type_hints(options).get(key.split(".")[0])
        raise error(f"{prefix}.{key} = {args.get(key)!r}: expected {getattr(hint, '__name__', None) or hint}") from None

    def check(ok: bool, key: str, value: object, expected: str) -> None:
        if not ok:
            raise error(f"{key} = {value!r}: expected {expected}")

    check_ranges(parsed, prefix + ".", check)
    return parsed

"""A policy's own options from free-form scenario keys (`policy_args`), checked by its `Options`
dataclass: OmegaConf converts and type-checks, the class's `RANGES` bound the numbers."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any, cast, get_type_hints

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nodes.contracts.schema import check_ranges

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class PolicyLoadError(ValueError):
    """The policy or its arguments cannot be used; the message is one line naming the key."""


def is_user_policy(name: str) -> bool:
    """policy=package.module:ClassName rather than a built-in's name."""
    return ":" in name


def parse_options(options: type | None, args: dict[str, Any], prefix: str = "policy_args") -> Any:
    """`args` as an instance of the `options` dataclass: an unknown key, a wrong type or a number
    outside the class's RANGES is one PolicyLoadError naming `policy_args.<key>`. (Any: an instance of
    whichever dataclass `options` is, None without one.)"""
    if options is None:
        if args:
            raise PolicyLoadError(f"{prefix}.{next(iter(args))}: unknown key (the policy takes no options)")
        return None
    names = [f.name for f in fields(options)]
    for key in args:
        if key not in names:
            raise PolicyLoadError(
                f"{prefix}.{key}: unknown key (the policy's {options.__name__} has {', '.join(names) or 'no fields'})"
            )
    try:
        # a structured config's object is an instance of its dataclass, `options`
        parsed = cast("DataclassInstance", OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(options), args)))
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "")
        hint = get_type_hints(options).get(key.split(".")[0])
        raise PolicyLoadError(
            f"{prefix}.{key} = {args.get(key)!r}: expected {getattr(hint, '__name__', None) or hint}"
        ) from None

    def check(ok: bool, key: str, value: object, expected: str) -> None:
        if not ok:
            raise PolicyLoadError(f"{key} = {value!r}: expected {expected}")

    check_ranges(parsed, prefix + ".", check)
    return parsed

"""Which theorem dp.accountant names: `ACCOUNTANTS`, the built-in ones by name, one line each, and a
user's `EpsilonTheorem` subclass by `package.module:ClassName`; `theorem`, the instance that
`emulator.privacy.epsilon` and `max_steps` ask."""

from __future__ import annotations

from functools import lru_cache

from emulator.privacy.base import EpsilonTheorem
from emulator.privacy.pld import PldTheorem
from emulator.privacy.prv import PrvTheorem
from emulator.privacy.rdp import RdpTheorem
from nodes.contracts.plugins import Registry, is_user_class
from nodes.contracts.schema import Conversion


class AccountantError(ValueError):
    """dp.accountant names no theorem this server can use, or its theorem broke its contract: one line
    naming the key."""


ACCOUNTANTS: Registry[EpsilonTheorem] = Registry(
    "dp.accountant",
    EpsilonTheorem,  # type: ignore[type-abstract]  # abstract: only its subclasses are built
    "emulator.privacy.EpsilonTheorem",
    AccountantError,
)
ACCOUNTANTS.register("rdp")(RdpTheorem)
ACCOUNTANTS.register("prv")(PrvTheorem)
ACCOUNTANTS.register("pld")(PldTheorem)


@lru_cache(maxsize=64)
def theorem(accountant: str, conversion: str = "improved", orders: tuple[float, ...] | None = None) -> EpsilonTheorem:
    """The theorem `accountant` (dp.accountant) names, built once: an RdpTheorem (or a subclass) with
    `conversion` (dp.conversion) and `orders`, which are its own; any other theorem with no arguments.
    An unknown name, or a user's class that cannot be built, is an AccountantError; a conversion or
    orders for a theorem that has neither, a ValueError."""
    cls = ACCOUNTANTS.get(accountant)
    if not issubclass(cls, RdpTheorem) and (conversion != Conversion.IMPROVED or orders is not None):
        raise ValueError(f"conversion and orders are the rdp accountant's; accountant={accountant!r} has neither")
    try:
        return cls(conversion, orders) if issubclass(cls, RdpTheorem) else cls()
    except Exception as e:  # a user's class may fail in any way as it is built (no `epsilon`: a TypeError)
        if not is_user_class(accountant):
            raise
        said = str(e).splitlines()[0] if str(e) else ""
        raise AccountantError(f"dp.accountant = {accountant!r}: cannot build it ({type(e).__name__}: {said})") from e

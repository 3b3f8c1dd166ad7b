"""What every section of the schema is made of: `setting` (a field with its help), `Choice` (the
allowed values of a text key) and `Range` (the admitted values of a number), with the bounds they share."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar, overload

T = TypeVar("T")


class Choice(StrEnum):
    """The allowed values of a text key; a member is its value (compared, stored and written as text)."""

    @classmethod
    def admits(cls, value: str) -> bool:
        return value in cls._value2member_map_

    @classmethod
    def describe(cls) -> str:
        return " | ".join(cls)


@overload
def setting(default: T, help: str) -> T: ...
@overload
def setting(default: None, help: str, factory: Callable[[], T]) -> T: ...


def setting(default: object, help: str, factory: Callable[[], object] | None = None) -> Any:
    """A schema field with its help text (python -m emulator --help). Typed as the field's value,
    as dataclasses.field is: `x: int = setting(0, "...")`."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


# --- admitted ranges ----------------------------------------------------------------------
# Every number in a scenario is checked against its key's Range before anything starts, so
# NaN, infinities and absurd sizes never reach the run. The bounds are far beyond any useful
# setting (a round of 10^6 local steps already takes hours) but keep every derived quantity
# finite and every allocation sane; +inf is admitted only where the key documents it.


@dataclass(frozen=True)
class Range:
    """[low, high] (an open end excludes its bound); `inf` says what +inf means where it is admitted."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    inf: str = ""

    def admits(self, v: float) -> bool:
        if v == math.inf:
            return bool(self.inf)
        above = v > self.low if self.low_open else v >= self.low  # NaN fails every comparison
        below = v < self.high if self.high_open else v <= self.high
        return above and below

    def describe(self, integer: bool) -> str:
        what = "an integer" if integer else "a number"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        text = f"{what} in {left}{_bound(self.low)}, {_bound(self.high)}{right}"
        return f"{text} or inf ({self.inf})" if self.inf else text


def _bound(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


MAX_CLIENTS = 10**8
MAX_ROUNDS = 10**6
MAX_STEPS = 10**6  # local steps per round (dp.tau, fu_tuning.local_iters)
MAX_SAMPLES = 10**8  # per client
MAX_WORKERS = 1024
MAX_GPUS = 1024
MAX_SECONDS = 1e12  # virtual time (about 31,700 years)
MAX_QUANTITY = 1e15  # a per-client bandwidth (bits/s) or duration (s)
MAX_PARAMETER = 1e6  # learning rate, noise multiplier, clipping norm and other scalars

PROBABILITY = Range(0, 1)
OPEN_UNIT = Range(0, 1, low_open=True, high_open=True)
QUANTITY = Range(0, MAX_QUANTITY)
TIME = Range(0, MAX_SECONDS)
ROUND = Range(0, MAX_ROUNDS)
CLIENT_ID = Range(0, MAX_CLIENTS - 1)
NON_NEGATIVE = Range(0, MAX_PARAMETER)
POSITIVE = Range(0, MAX_PARAMETER, low_open=True)
FINITE = Range(-math.inf, math.inf, low_open=True, high_open=True)  # also for a key with no declared range

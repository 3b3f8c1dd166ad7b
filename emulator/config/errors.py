"""ConfigError, and the one line it says: the key, the bad value (cut to a readable length), what
was expected."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad scenario input; the message is one line naming the key."""


SHOWN_CHARS = 80  # of a key or value echoed in an error
PROBLEM_CHARS = 200  # of a parser's own account of what is wrong


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` cut to `limit` characters, so an error stays one readable line whatever the input."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check(ok: bool, key: str, value: object, expected: str) -> None:
    """A schema `Check`: unless `ok`, the ConfigError `key = value: expected ...`."""
    if not ok:
        raise ConfigError(f"{clip(key)} = {clip(repr(value))}: expected {expected}")

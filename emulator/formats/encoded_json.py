"""JSON documents with parts encoded ahead: state that grows with the clients, changes for a few of them a
round and is taken every round (the privacy ledgers, for the checkpoint) keeps each part's text and is
joined, not encoded again.

Documents are encoded as the checkpoint encodes them: keys sorted, NaN and infinities allowed.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from typing import Any


class EncodedMap(dict[str, Any]):
    """A map kept beside its JSON text (`text`, as `encode` writes a map, its members in any order), which
    `dumps` writes as it is instead of encoding the map again; anywhere else a plain dict."""

    def __init__(self, items: dict[str, Any], text: str) -> None:
        super().__init__(items)
        self.text = text


def encode(value: Any) -> str:
    """`value`'s JSON text."""
    return json.dumps(value, sort_keys=True, allow_nan=True)


def member(key: str, value: Any) -> str:
    """One member of a map's JSON text ("key": value), for an EncodedMap's text."""
    return f"{encode(key)}: {encode(value)}"


def joined(members: Iterable[str]) -> str:
    """A map's JSON text from its members' (`member`)."""
    return "{" + ", ".join(members) + "}"


def dumps(document: dict[str, Any]) -> str:
    """`document`'s JSON text, each EncodedMap in it (within maps) as its kept text: encoded into a
    placeholder string that no document holds (a random token), which is then replaced."""
    texts: dict[str, str] = {}
    token = secrets.token_hex(16)

    def placed(d: dict[str, Any]) -> dict[str, Any]:
        swapped: dict[str, Any] = {}
        for k, v in d.items():
            if isinstance(v, EncodedMap):
                swapped[k] = placeholder = f"{token}:{len(texts)}"
                texts[encode(placeholder)] = v.text
            elif type(v) is dict and (inner := placed(v)) is not v:
                swapped[k] = inner
        return {**d, **swapped} if swapped else d

    text = encode(placed(document))
    for quoted, kept in texts.items():
        text = text.replace(quoted, kept, 1)
    return text

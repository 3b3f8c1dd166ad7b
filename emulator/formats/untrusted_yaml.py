"""YAML from users, read as untrusted input: bounded before it is expanded, strict where YAML is lax.

`shape_problem` reads the event stream (no document is built) and refuses nesting deeper than
MAX_DEPTH and documents that alias expansion would blow up (billion laughs); `StrictLoader`
refuses duplicate keys and keeps dates as text; `plain_problem` refuses values that are not
plain data (binary, sets, ...). Each returns or raises a reason, never a half-read document.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import yaml

MAX_NODES = 20_000  # after alias expansion; OmegaConf's time then grows with every node
MAX_DEPTH = 32  # scenarios nest 4 deep; libyaml's composer overflows the C stack thousands of levels deeper
MAX_KEY = 1024  # characters of a plain (implicit) key: YAML's own limit, which its scanner enforces
SHOWN_CHARS = 80  # of a key or an anchor echoed (emulator.config.errors', which imports this module)
if TYPE_CHECKING:  # the checker needs a static base class; libyaml's loader has the same constructor API
    _Loader = yaml.SafeLoader
else:
    _Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"


class StrictLoader(_Loader):
    """yaml's safe loader, but a duplicate key is an error instead of silently overriding the first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[Hashable, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key]})", key_node.start_mark
                )
            if isinstance(key, Hashable):
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


# Dates stay text: `seed: 2024-01-01` is a wrong type for seed, reported as such, not a datetime.
StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def shape_problem(text: str) -> str:
    """'' if `text` nests at most MAX_DEPTH deep and expands to at most MAX_NODES values, else why
    not, naming the anchor whose alias blew it up (or the key over YAML's length for one, which stops the
    scanner). Counted from the event stream, so a billion-laughs document is never expanded."""
    try:
        return _shape_problem(text)
    except yaml.MarkedYAMLError as e:
        long_key = _long_key(text, e)
        if long_key:
            return long_key
        if e.problem != "exceeded maximum nesting depth":  # PyYAML >= 6.0.4's scanner's own limit, far past ours
            raise
        return f"nests deeper than {MAX_DEPTH} levels (line {e.problem_mark.line + 1 if e.problem_mark else 1})"


def _long_key(text: str, e: yaml.MarkedYAMLError) -> str:
    """Why the scanner stopped, where it stopped at a key longer than YAML allows (it says only that a
    mapping value is not allowed there, or that no ':' follows): the key, cut, and its length; else ''."""
    mark = e.problem_mark
    if mark is None:
        return ""
    lines = text.splitlines()
    if mark.line >= len(lines):
        return ""
    line = lines[mark.line]
    context = e.context_mark
    start = context.column if context is not None and context.line == mark.line else 0
    # the key is what the mark ends, after the line's indentation and any indicator before it
    key = re.split(r"[{\[,]|^\s*(?:[-?]\s+)*", line[start : mark.column])[-1].strip().strip("\"'")
    if len(key) <= MAX_KEY:
        return ""
    return (
        f"has a key {_clip(repr(key))} of {len(key)} characters, longer than YAML's {MAX_KEY} for a key "
        f"(line {mark.line + 1})"
    )


def _clip(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def _shape_problem(text: str) -> str:
    sizes: dict[str | None, int] = {}  # anchor -> values its node expands to
    open_: list[list[Any]] = []  # [anchor, values so far] per collection being read
    aliased: str | None = None  # the anchor of the last alias read: what a blow-up is named by
    for event in yaml.parse(text, Loader=_Loader):
        assert event.start_mark is not None  # the parser marks every event
        line = event.start_mark.line + 1
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            open_.append([event.anchor, 1])
            if len(open_) > MAX_DEPTH:
                return f"nests deeper than {MAX_DEPTH} levels (line {line})"
            continue
        if isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in open_):
                return f"has a recursive alias *{event.anchor} (line {line})"
            n, aliased = sizes.get(event.anchor, 1), event.anchor
        elif isinstance(event, yaml.ScalarEvent):
            n = 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, n = open_.pop()
            if anchor:
                sizes[anchor] = n
        else:
            continue
        if open_:
            open_[-1][1] += n
            n = open_[-1][1]
        if n > MAX_NODES:
            if aliased is None:
                return f"holds more than {MAX_NODES} values (line {line})"
            return f"expands to more than {MAX_NODES} values through aliases of &{_clip(aliased)} (line {line})"
    return ""


def plain_problem(data: object, path: str = "") -> str:
    """'' if `data` holds only mappings with text keys, lists, text, numbers, booleans and nulls."""
    if isinstance(data, dict):
        for k, v in data.items():
            if not isinstance(k, str):
                return f"{path or 'top level'}: key {k!r} is not a name"
            problem = plain_problem(v, f"{path}.{k}" if path else k)
            if problem:
                return problem
    elif isinstance(data, list):
        for i, v in enumerate(data):
            problem = plain_problem(v, f"{path}[{i}]")
            if problem:
                return problem
    elif not isinstance(data, (str, int, float, bool, type(None))):
        return f"{path}: a YAML {type(data).__name__} is not a scenario value"
    return ""

"""`python -m emulator --help`'s list of keys: every key of ServerScenario with its default, meaning
and admitted range."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, get_type_hints

from emulator.config.server_scenario import ServerScenario
from emulator.policies import POLICIES
from emulator.timemodel.loss import LOSS_MODELS
from nodes.contracts import codecs
from nodes.contracts.schema import ORDERED_BY, declared_range, list_entry_type, numeric_type

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# Keys whose choices a registry holds, which the schema below it cannot list.
REGISTERED = {"compression.kind": codecs.choices, "links.dropout.model": LOSS_MODELS.describe}


def help_text() -> str:
    """One line per key: dotted name, default (of the default instance, so Dist defaults are real),
    meaning and, for numbers, the admitted range; list entries as key[i].field."""
    from nodes.data import DATASETS

    lines: list[str] = []

    def walk(obj: DataclassInstance | type[DataclassInstance], prefix: str) -> None:
        hints = get_type_hints(type(obj))
        for f in fields(obj):
            key, value, hint = prefix + f.name, getattr(obj, f.name), hints[f.name]
            meaning = f.metadata.get("help", "")
            if is_dataclass(value):
                lines.append(f"  {key}:  {meaning}")
                walk(value, key + ".")
                continue
            if numeric_type(hint):
                each = "each " if isinstance(value, list) else ""
                meaning += f"; {each}{declared_range(type(obj), f.name).describe(numeric_type(hint) is int)}"
            if key == "policy":  # the registry is emulator's; the schema below it cannot list it
                meaning += f": {' | '.join(POLICIES)} | package.module:ClassName (your own)"
            if key == "data.dataset":  # as the policies', the datasets' registry is above the schema
                meaning += f": {DATASETS.describe()} (your own DatasetSpec subclass)"
            if key in REGISTERED:
                meaning += f": {REGISTERED[key]()} (your own)"
            order = ORDERED_BY.get(type(obj), {}).get(f.name)
            if order:
                meaning += f"; listed in order of {order}"
            lines.append(f"  {key} = {value!r}  # {meaning}")
            if entry := list_entry_type(hint):
                walk(entry(), f"{key}[i].")

    walk(ServerScenario(), "")
    return "\n".join(lines)

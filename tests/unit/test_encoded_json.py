"""emulator.formats.encoded_json: a document's EncodedMap is written as its kept text, everything else as the
checkpoint has always encoded it (keys sorted, NaN allowed), and the document is left as it was."""

from __future__ import annotations

import json
import math

from emulator.formats.encoded_json import EncodedMap, dumps, encode, joined, member


def test_a_document_without_an_encoded_map_is_encoded_as_before():
    doc = {"b": [1, math.nan, {"z": 1, "a": math.inf}], "a": {"y": "text", "x": None}}
    assert dumps(doc) == json.dumps(doc, sort_keys=True, allow_nan=True) == encode(doc)


def test_an_encoded_map_is_written_as_its_text_wherever_it_lies_within_maps():
    first = {"7": {"steps": 3}, "10": {"steps": 1}}
    # members in insertion order, not sorted: the text written is the kept one, not the map encoded again
    first_text = joined(member(k, v) for k, v in first.items())
    second = EncodedMap({}, joined([]))
    doc = {
        "next_round": 4,
        "policy": {"accountant": {"ledgers": EncodedMap(first, first_text), "mechanism": "rdp"}, "x": [math.nan]},
        "other": second,
        "label": "ledgers",
    }
    text = dumps(doc)
    assert first_text in text and first_text != encode(first)
    assert json.loads(text) == json.loads(json.dumps(doc, allow_nan=True))
    assert type(doc["policy"]) is dict and isinstance(doc["policy"]["accountant"]["ledgers"], EncodedMap)  # unchanged


def test_a_kept_text_is_written_as_it_is_even_when_it_disagrees_with_its_map():
    """What makes the text agree with the map is its keeper's (RdpAccountant: tests/unit/test_accountant_state.py)."""
    assert dumps({"m": EncodedMap({"a": 1}, '{"a": 2}')}) == '{"m": {"a": 2}}'

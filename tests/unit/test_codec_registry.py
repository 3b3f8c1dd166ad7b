"""The codec registry (nodes.contracts.codecs.CODECS): built-ins by name, a user's class by reference,
each bad name one line naming compression.kind, and a codec the wire names never imported."""

import sys

import numpy as np
import pytest

from emulator.config import ConfigError, load
from emulator.config.help import help_text
from nodes.contracts import protocol
from nodes.contracts.codecs import (
    CODECS,
    Codec,
    CompressionError,
    Parts,
    PartSpec,
    codec,
    decompress,
    known,
    load_codec,
    round_trip,
)
from nodes.contracts.protocol import ProtocolError
from nodes.contracts.schema import CompressionConfig
from tests.plugins.codec import Float16

FLOAT16 = CompressionConfig(kind="tests.plugins.codec:Float16")
UPDATE = {"w": np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4), "b": np.array([1e6, -0.5], np.float32)}


class Short(Codec):
    """Decodes one coordinate too few: a codec's bug, which decompress refuses."""

    def parts(self, n: int) -> PartSpec:
        return {"all": (np.float32, n)}

    def encode(self, x: np.ndarray, rng: np.random.Generator) -> Parts:
        return {"all": x.copy()}

    def decode(self, n: int, parts: Parts) -> np.ndarray:
        return parts["all"][1:].copy()


def test_the_built_ins_are_registered_by_name_and_a_users_class_by_reference():
    assert CODECS.names() == ("qsgd", "topk", "sign")
    assert CODECS.get(FLOAT16.kind) is Float16
    load_codec(FLOAT16.kind)
    assert known(FLOAT16.kind) and isinstance(codec(FLOAT16), Float16)


def test_a_user_codec_round_trips_as_its_parts_say():
    load_codec(FLOAT16.kind)
    parts, decoded = round_trip(FLOAT16, UPDATE, np.random.default_rng(0))
    assert {k: (a.dtype, a.size) for k, a in parts.items()} == {
        "w:half": (np.float16, 12),
        "b:half": (np.float16, 2),
    }
    np.testing.assert_array_equal(decoded["w"], UPDATE["w"].astype(np.float16).astype(np.float32))
    assert decoded["b"][0] == np.finfo(np.float16).max  # clipped to float16's range: never inf


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("zip", "compression.kind = 'zip': expected none | qsgd | topk | sign | package.module:ClassName"),
        ("no_such_module:Codec", "compression.kind = 'no_such_module:Codec': cannot import no_such_module"),
        (
            "nodes.contracts.schema:CompressionConfig",
            "compression.kind = 'nodes.contracts.schema:CompressionConfig': nodes.contracts.schema.CompressionConfig "
            "is not one; expected a subclass of nodes.contracts.codecs.Codec",
        ),
        ("tests.plugins.codec:Missing", "tests.plugins.codec.Missing does not exist"),
    ],
)
def test_a_codec_that_cannot_be_used_is_one_config_error_line(kind, message):
    with pytest.raises(ConfigError) as e:
        load(None, [f"compression.kind={kind}"])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_help_lists_the_codecs_and_a_users_own():
    (line,) = [line for line in help_text().splitlines() if line.startswith("  compression.kind =")]
    assert line.endswith(": none | qsgd | topk | sign | package.module:ClassName (your own)")


def compressed(kind: str, parts: Parts) -> list:
    return list(
        protocol.encode(
            "compressed",
            round=0,
            client=1,
            codec={"kind": kind, "bits": 8, "fraction": 0.01},
            shapes=[["w", [2, 3]]],
            parts=parts,
            residual={},
            metrics={"steps": 1, "train_loss": 0.5, "update_norm": 1.0},
        ).frames
    )


def test_a_codec_the_wire_names_is_used_only_if_this_process_has_loaded_it():
    """`this` prints on import: a message naming it must not make the receiver import a module."""
    with pytest.raises(ProtocolError) as e:
        protocol.decode(compressed("this:Codec", {"w:half": np.zeros(6, np.float16)}), 2**20)
    assert e.value.reason == "field_type" and "this" not in sys.modules


def test_a_user_codecs_parts_are_checked_before_it_decodes_them():
    load_codec(FLOAT16.kind)
    good = protocol.decode(compressed(FLOAT16.kind, {"w:half": np.ones(6, np.float16)}), 2**20)
    np.testing.assert_array_equal(good["update"]["w"], np.ones((2, 3), np.float32))
    for parts in ({"w:half": np.ones(6, np.float32)}, {"w:half": np.ones(5, np.float16)}, {"w:all": np.ones(6)}):
        with pytest.raises(ProtocolError) as e:
            protocol.decode(compressed(FLOAT16.kind, parts), 2**20)
        assert e.value.reason == "bad_compressed"


def test_what_a_codec_decodes_is_checked_too():
    short = CompressionConfig(kind=f"{__name__}:Short")
    load_codec(short.kind)
    parts = {"w:all": np.ones(6, np.float32)}
    with pytest.raises(CompressionError, match="decoded other than 6 float32 coordinates"):
        decompress(short, {"w": (2, 3)}, parts)

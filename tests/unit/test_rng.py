"""Many clients' own streams at once (nodes.contracts.rng.stream_uniforms) give the doubles that numpy's
generator per client gives, bit for bit: seeds of one word and several, keys of names and numbers, ids at
the ends of their range, and more ids than one pass takes."""

from __future__ import annotations

import numpy as np
import pytest

from nodes.contracts.rng import stream, stream_uniforms


@pytest.mark.parametrize(
    ("seed", "key"),
    [(0, ("availability",)), (7, ("trace", 5)), (2**40 + 3, ("availability",)), (2**130 + 17, ()), (3, (2**35, "x"))],
)
def test_the_streams_of_many_ids_at_once_are_each_ids_own_stream(seed, key):
    ids = np.array([0, 1, 2, 3, 255, 65_536, 99_991, 2**31, 2**32 - 1])
    want = np.array([stream(seed, *key, int(i)).random(3) for i in ids])
    assert np.array_equal(stream_uniforms(seed, key, ids, 3), want)


def test_ids_past_one_pass_are_drawn_as_alone():
    ids = np.arange(300_000)  # more than a pass takes: the chunks join where they should
    got = stream_uniforms(11, ("availability",), ids, 2)
    for i in (0, 262_143, 262_144, 299_999):
        assert got[i].tolist() == stream(11, "availability", i).random(2).tolist()


def test_ids_beyond_32_bits_are_refused():
    with pytest.raises(ValueError, match=r"expected ids in \[0, 2\^32\)"):
        stream_uniforms(0, ("x",), np.array([2**32]), 1)

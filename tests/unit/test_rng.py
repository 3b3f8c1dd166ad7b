"""nodes.rng: seed_ints, SeedSequence's hash vectorised over a key's last part, is seed_int word for word."""

import pytest

from nodes.rng import seed_int, seed_ints

LASTS = [0, 1, 5, 999, 2**16 + 3, 2**31, 2**32 - 1]


@pytest.mark.parametrize("seed", [0, 1, 7, 2**32 - 1, 2**32 + 5, 2**63 - 1, 2**130 + 3])  # 1 to 5 words
@pytest.mark.parametrize("key", [("train",), ("train", 0), ("train", 3), ("compression", 2**32 - 1), ("x", 2**40, 1)])
def test_seed_ints_are_seed_int_of_each_last_key_part(seed, key):
    assert seed_ints(seed, key, LASTS) == [seed_int(seed, *key, last) for last in LASTS]


def test_a_last_part_of_two_words_and_no_parts_are_seed_ints_too():
    lasts = [3, 2**32, 2**45 + 1]
    assert seed_ints(11, ("train", 2), lasts) == [seed_int(11, "train", 2, last) for last in lasts]
    assert seed_ints(11, ("train", 2), []) == []
    assert seed_ints(11, (), [4, 9]) == [seed_int(11, 4), seed_int(11, 9)]


def test_a_negative_seed_or_key_part_is_refused_as_by_seed_int():
    with pytest.raises(ValueError):
        seed_int(-1, "train", 0, 1)
    with pytest.raises(ValueError, match="non-negative"):
        seed_ints(-1, ("train", 0), [1])
    with pytest.raises(ValueError, match="non-negative"):
        seed_ints(1, ("train", -2), [1])

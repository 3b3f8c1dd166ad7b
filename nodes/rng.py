"""Named RNG streams: one seed drives everything.

Each consumer asks for its own stream keyed by what it is for and by (round, client),
so a draw never depends on how many workers ran or in which order replies arrived.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt


def _key(parts: Iterable[int | str]) -> tuple[int, ...]:
    return tuple(zlib.crc32(p.encode()) if isinstance(p, str) else int(p) for p in parts)


def seed_sequence(seed: int, *key: int | str) -> np.random.SeedSequence:
    return np.random.SeedSequence(entropy=int(seed), spawn_key=_key(key))


def stream(seed: int, *key: int | str) -> np.random.Generator:
    """`stream(seed, "dropout", round, client)` — an independent generator per purpose and key."""
    return np.random.default_rng(seed_sequence(seed, *key))


def seed_int(seed: int, *key: int | str) -> int:
    """A 63-bit integer seed for libraries that take one (torch.Generator.manual_seed)."""
    return int(seed_sequence(seed, *key).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


# numpy.random.SeedSequence's hash (O'Neill's seed_seq, numpy/random/bit_generator.pyx): its constants
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R, _XSHIFT, _POOL_SIZE = 0xCA01F9DD, 0x4973F715, np.uint32(16), 4
_WORD = 2**32
Words = npt.NDArray[np.uint32]  # a uint32 word of each key


def seed_ints(seed: int, key: Sequence[int | str], lasts: Sequence[int]) -> list[int]:
    """[seed_int(seed, *key, last) for last in lasts], in one pass of uint32 arrays over `lasts`: SeedSequence's
    pool mixing and generate_state, word for word (tests/unit/test_rng.py checks it against seed_int)."""
    if any(not 0 <= last < _WORD for last in lasts):  # a key part of more than one uint32 word
        return [seed_int(seed, *key, last) for last in lasts]
    run = _words(int(seed))
    fixed = run + [0] * (_POOL_SIZE - len(run)) + [w for part in _key(key) for w in _words(part)]
    words = [np.full(len(lasts), w, dtype=np.uint32) for w in fixed] + [np.array(lasts, dtype=np.uint32)]
    hash_const = [_INIT_A]

    def hashmix(value: Words) -> Words:
        value = value ^ np.uint32(hash_const[0])
        hash_const[0] = hash_const[0] * _MULT_A % _WORD
        value = value * np.uint32(hash_const[0])
        return value ^ (value >> _XSHIFT)

    def mix(x: Words, y: Words) -> Words:
        result: Words = x * np.uint32(_MIX_MULT_L) - y * np.uint32(_MIX_MULT_R)
        return result ^ (result >> _XSHIFT)

    with np.errstate(over="ignore"):  # uint32 arithmetic wraps, as the C code's
        pool = [hashmix(words[i] if i < len(words) else np.zeros(len(lasts), np.uint32)) for i in range(_POOL_SIZE)]
        for i_src in range(_POOL_SIZE):
            for i_dst in range(_POOL_SIZE):
                if i_src != i_dst:
                    pool[i_dst] = mix(pool[i_dst], hashmix(pool[i_src]))
        for i_src in range(_POOL_SIZE, len(words)):
            for i_dst in range(_POOL_SIZE):
                pool[i_dst] = mix(pool[i_dst], hashmix(words[i_src]))
        state, hash_b = [], _INIT_B  # generate_state(1, uint64): two uint32 words, low one first
        for i_dst in range(2):
            value = pool[i_dst] ^ np.uint32(hash_b)
            hash_b = hash_b * _MULT_B % _WORD
            value = value * np.uint32(hash_b)
            state.append((value ^ (value >> _XSHIFT)).astype(np.uint64))
    return ((state[0] | state[1] << np.uint64(32)) >> np.uint64(1)).tolist()  # type: ignore[no-any-return]


def _words(n: int) -> list[int]:
    """A non-negative integer's uint32 words, least significant first (0: one word), as SeedSequence reads it."""
    if n < 0:
        raise ValueError(f"a seed or key part is a non-negative integer, not {n}")
    words = [n % _WORD]
    while n >= _WORD:
        n //= _WORD
        words.append(n % _WORD)
    return words

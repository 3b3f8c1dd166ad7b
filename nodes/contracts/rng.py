"""Named RNG streams: one seed drives everything.

Each consumer asks for its own stream keyed by what it is for and by (round, client),
so a draw never depends on how many workers ran or in which order replies arrived.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import numpy as np


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


# --- many clients' streams at once ------------------------------------------------------------------
# numpy's SeedSequence (its hash and mix over 32-bit words) and PCG64 (a 128-bit LCG, XSL-RR output) reproduced
# over arrays, so that a draw from each of n clients' own streams costs numpy calls, not n generators.
_M32 = 0xFFFFFFFF
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_PCG_HI, _PCG_LO = np.uint64(0x2360ED051FC65DA4), np.uint64(0x4385DF649FCCF645)
_U32, _U64 = np.uint64(32), np.uint64(_M32)
_CHUNK = 1 << 18  # ids a pass takes: bounds the temporaries


def _words(value: int) -> list[int]:
    """An integer's 32-bit words, least significant first (SeedSequence's entropy of it)."""
    words = [value & _M32]
    while value > _M32:
        value >>= 32
        words.append(value & _M32)
    return words


def _hashmix(value: np.ndarray, h: list[int]) -> np.ndarray:
    value = value ^ np.uint32(h[0])
    h[0] = (h[0] * _MULT_A) & _M32
    value = value * np.uint32(h[0])
    return value ^ (value >> np.uint32(16))


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r = np.asarray(np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y, np.uint32)
    return r ^ (r >> np.uint32(16))


def _pools(entropy: list[np.ndarray]) -> list[np.ndarray]:
    """SeedSequence's pool of four words, for each column of `entropy` (its words, one array each)."""
    h = [_INIT_A]
    zero = np.zeros_like(entropy[0])
    pool = [_hashmix(entropy[i] if i < len(entropy) else zero, h) for i in range(4)]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = _mix(pool[dst], _hashmix(pool[src], h))
    for word in entropy[4:]:
        for dst in range(4):
            pool[dst] = _mix(pool[dst], _hashmix(word, h))
    return pool


def _state64(pool: list[np.ndarray]) -> list[np.ndarray]:
    """SeedSequence.generate_state(4, np.uint64) for each pool."""
    h, words = _INIT_B, []
    for i in range(8):
        v = pool[i % 4] ^ np.uint32(h)
        h = (h * _MULT_B) & _M32
        v = v * np.uint32(h)
        words.append((v ^ (v >> np.uint32(16))).astype(np.uint64))
    return [words[2 * j] | (words[2 * j + 1] << _U32) for j in range(4)]


def _mul_hi(a: np.ndarray, b: np.uint64) -> np.ndarray:
    """The high 64 bits of a * b."""
    a0, a1, b0, b1 = a & _U64, a >> _U32, b & _U64, b >> _U32
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> _U32) + (p01 & _U64) + (p10 & _U64)
    return np.asarray(p11 + (p01 >> _U32) + (p10 >> _U32) + (mid >> _U32), np.uint64)


def _add(hi: np.ndarray, lo: np.ndarray, b_hi: np.ndarray, b_lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    low = lo + b_lo
    return hi + b_hi + (low < lo).astype(np.uint64), low


def _step(hi: np.ndarray, lo: np.ndarray, inc: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """PCG64's state * multiplier + increment, modulo 2^128."""
    return _add(_mul_hi(lo, _PCG_LO) + lo * _PCG_HI + hi * _PCG_LO, lo * _PCG_LO, *inc)


def stream_uniforms(seed: int, key: tuple[int | str, ...], ids: np.ndarray, count: int) -> np.ndarray:
    """`stream(seed, *key, i).random(count)` for every i of `ids` (ids below 2^32), as rows: the same doubles,
    bit for bit, from array arithmetic instead of a generator per id (python -m bench --only million)."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and not 0 <= ids.min() <= ids.max() <= _M32:
        raise ValueError(f"ids in [{ids.min()}, {ids.max()}]: expected ids in [0, 2^32)")
    run = _words(int(seed))
    run += [0] * (4 - len(run))  # SeedSequence pads the entropy to its pool when a spawn key follows
    prefix = run + [w for k in _key(key) for w in _words(k)]
    out = np.empty((len(ids), count))
    for at in range(0, len(ids), _CHUNK):
        part = ids[at : at + _CHUNK].astype(np.uint32)
        s_hi, s_lo, q_hi, q_lo = _state64(_pools([np.full(len(part), w, np.uint32) for w in prefix] + [part]))
        inc = ((q_hi << np.uint64(1)) | (q_lo >> np.uint64(63)), (q_lo << np.uint64(1)) | np.uint64(1))
        hi, lo = _step(*_add(*inc, s_hi, s_lo), inc)  # state 0 stepped is the increment; then + seed, stepped
        for c in range(count):
            hi, lo = _step(hi, lo, inc)
            x, rot = hi ^ lo, hi >> np.uint64(58)
            bits = (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))
            out[at : at + len(part), c] = (bits >> np.uint64(11)) * (1.0 / 9007199254740992.0)
    return out

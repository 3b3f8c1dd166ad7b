"""Update compression: the codecs a worker applies to its update w_i - w (after any DP noise: post-
processing, no privacy cost) and the server inverts. Each tensor of the update becomes a few typed
parts (`Parts`, {"<name>:<part>": array}), which travel as ordinary tensor frames of the protocol's
`compressed` message; `decompress` checks them against the codec and the shapes the message names
and raises CompressionError on anything else (protocol.decode turns it into a ProtocolError).

* qsgd: stochastic b-bit quantisation (QSGD, Alistarh et al. 2017, eq. 1, with s = 2^(b-1) - 1
  signed levels of |x_i| / ||x||_2): unbiased, E[decoded] = x; the draws come from the caller's
  generator (the per-(run, round, client) stream), so no result depends on the worker.
* topk: the ceil(fraction * n) coordinates of largest magnitude (ties: the lower index), as uint32
  indices and float32 values.
* sign: signSGD with a scale (Bernstein et al. 2018; EF-signSGD, Karimireddy et al. 2019, alg. 1):
  a sign bit per coordinate and mean |x|.

`error_feedback` (Karimireddy et al. 2019, alg. 2) compresses p = update + residual and keeps
p - decoded as the next residual; whose the residual is (the server's) is the caller's concern.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from nodes.contracts.schema import CompressionConfig, CompressionKind

Parts = dict[str, np.ndarray]
Shapes = dict[str, tuple[int, ...]]


class CompressionError(ValueError):
    """Parts that do not form a valid compressed update."""


def levels(bits: int) -> int:
    """s, the positive quantisation levels of a b-bit signed code: codes 0..2s stand for -s..s."""
    return int(2 ** (bits - 1)) - 1


def kept(fraction: float, n: int) -> int:
    """topk's coordinates kept of a tensor of n (at least one of a non-empty tensor)."""
    return min(n, max(1, math.ceil(fraction * n))) if n else 0


def part_bytes(codec: CompressionConfig, n: int) -> int:
    """Bytes of the frames a tensor of n coordinates becomes (its float32 frame: 4 n)."""
    if codec.kind == CompressionKind.QSGD:
        return 4 + math.ceil(n * codec.bits / 8)
    if codec.kind == CompressionKind.TOPK:
        return 8 * kept(codec.fraction, n)
    if codec.kind == CompressionKind.SIGN:
        return 4 + math.ceil(n / 8)
    return 4 * n  # none: the float32 frame


def compress(codec: CompressionConfig, update: Mapping[str, np.ndarray], rng: np.random.Generator) -> Parts:
    """The update's parts, tensor by tensor in its order (qsgd draws from `rng` in that order)."""
    parts: Parts = {}
    for name, x in update.items():
        flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        for part, a in _ENCODERS[codec.kind](codec, flat, rng).items():
            parts[f"{name}:{part}"] = a
    return parts


def decompress(codec: CompressionConfig, shapes: Shapes, parts: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The dense float32 update that `parts` encode, shaped as `shapes`; CompressionError unless the
    parts are exactly the codec's, of their dtypes and sizes, with valid codes and indices."""
    names = {f"{name}:{part}" for name in shapes for part in _PARTS[codec.kind]}
    if set(parts) != names:
        raise CompressionError(f"parts {sorted(parts)[:6]} are not the {codec.kind} parts of {sorted(shapes)[:6]}")
    update = {}
    for name, shape in shapes.items():
        n = math.prod(shape)
        mine = {part: parts[f"{name}:{part}"] for part in _PARTS[codec.kind]}
        for part, a in mine.items():
            dtype, size = _PARTS[codec.kind][part](codec, n)
            if a.dtype != dtype or a.ndim != 1 or a.size != size:
                raise CompressionError(f"{name}:{part}: {a.dtype} of {a.size}, expected {np.dtype(dtype)} of {size}")
        update[name] = _DECODERS[codec.kind](codec, n, mine).reshape(shape)
    return update


def round_trip(
    codec: CompressionConfig, update: Mapping[str, np.ndarray], rng: np.random.Generator
) -> tuple[Parts, dict[str, np.ndarray]]:
    """The parts and what the server will decode from them (error feedback's residual is the difference)."""
    parts = compress(codec, update, rng)
    return parts, decompress(codec, {k: v.shape for k, v in update.items()}, parts)


# --- qsgd ----------------------------------------------------------------------------------------


def _qsgd(codec: CompressionConfig, x: np.ndarray, rng: np.random.Generator) -> Parts:
    s = levels(codec.bits)
    norm = np.float32(np.linalg.norm(x.astype(np.float64)))
    u = rng.random(x.size)  # one draw per coordinate, also where the norm is 0
    r = np.abs(x.astype(np.float64)) / float(norm) * s if norm > 0 else np.zeros(x.size)
    level = np.minimum(np.floor(r + u), s)  # QSGD eq. 1: floor(r) + 1 with probability r - floor(r)
    codes = (np.sign(x) * level + s).astype(np.uint32)
    return {"norm": np.array([norm], dtype=np.float32), "codes": _pack(codes, codec.bits)}


def _qsgd_decoded(codec: CompressionConfig, n: int, parts: Parts) -> np.ndarray:
    s = levels(codec.bits)
    codes = _unpack(parts["codes"], codec.bits, n)
    if codes.size and int(codes.max()) > 2 * s:
        raise CompressionError(f"qsgd code {int(codes.max())} above {2 * s}")
    norm = parts["norm"][0]
    if not norm >= 0:
        raise CompressionError(f"qsgd norm {norm} is negative")
    return ((codes.astype(np.float64) - s) * (float(norm) / s)).astype(np.float32)


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes of `bits` bits each, little-endian bit order, in ceil(n bits / 8) bytes."""
    planes = ((codes[:, None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    return np.packbits(planes.reshape(-1), bitorder="little")


def _unpack(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    planes = np.unpackbits(packed, count=n * bits, bitorder="little").reshape(n, bits).astype(np.uint32)
    if np.unpackbits(packed, bitorder="little")[n * bits :].any():
        raise CompressionError("padding bits set after the last code")
    return planes @ (np.uint32(1) << np.arange(bits, dtype=np.uint32))


# --- topk ----------------------------------------------------------------------------------------


def _topk(codec: CompressionConfig, x: np.ndarray, rng: np.random.Generator) -> Parts:
    k = kept(codec.fraction, x.size)
    order = np.argsort(-np.abs(x), kind="stable")  # the largest first, ties by index: deterministic
    index = np.sort(order[:k]).astype(np.uint32)
    return {"index": index, "value": x[index].astype(np.float32)}


def _topk_decoded(codec: CompressionConfig, n: int, parts: Parts) -> np.ndarray:
    index = parts["index"].astype(np.int64)
    if index.size and (index[-1] >= n or (np.diff(index) <= 0).any()):
        raise CompressionError(f"topk indices not strictly increasing below {n}")
    dense = np.zeros(n, dtype=np.float32)
    dense[index] = parts["value"]
    return dense


# --- sign ----------------------------------------------------------------------------------------


def _sign(codec: CompressionConfig, x: np.ndarray, rng: np.random.Generator) -> Parts:
    scale = np.float32(np.abs(x.astype(np.float64)).mean()) if x.size else np.float32(0)
    return {"scale": np.array([scale], dtype=np.float32), "bits": _pack((x < 0).astype(np.uint32), 1)}


def _sign_decoded(codec: CompressionConfig, n: int, parts: Parts) -> np.ndarray:
    scale = parts["scale"][0]
    if not scale >= 0:
        raise CompressionError(f"sign scale {scale} is negative")
    negative = _unpack(parts["bits"], 1, n)
    dense: np.ndarray = np.where(negative == 1, -scale, scale).astype(np.float32)
    return dense


Encoder = Callable[[CompressionConfig, np.ndarray, np.random.Generator], Parts]
Decoder = Callable[[CompressionConfig, int, Parts], np.ndarray]
PartSpec = Callable[[CompressionConfig, int], tuple[type, int]]  # a part's dtype and size, for n coordinates
_ENCODERS: dict[str, Encoder] = {
    CompressionKind.QSGD: _qsgd,
    CompressionKind.TOPK: _topk,
    CompressionKind.SIGN: _sign,
}
_DECODERS: dict[str, Decoder] = {
    CompressionKind.QSGD: _qsgd_decoded,
    CompressionKind.TOPK: _topk_decoded,
    CompressionKind.SIGN: _sign_decoded,
}
# each codec's parts of a tensor of n coordinates: name -> (dtype, size)
_PARTS: dict[str, dict[str, PartSpec]] = {
    CompressionKind.QSGD: {
        "norm": lambda c, n: (np.float32, 1),
        "codes": lambda c, n: (np.uint8, math.ceil(n * c.bits / 8)),
    },
    CompressionKind.TOPK: {
        "index": lambda c, n: (np.uint32, kept(c.fraction, n)),
        "value": lambda c, n: (np.float32, kept(c.fraction, n)),
    },
    CompressionKind.SIGN: {"scale": lambda c, n: (np.float32, 1), "bits": lambda c, n: (np.uint8, math.ceil(n / 8))},
}

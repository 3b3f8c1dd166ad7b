"""Update compression: the codecs a worker applies to its update and the server inverts.

A worker compresses its update w_i - w after any DP noise (post-processing, no privacy cost). Each
tensor of the update becomes a few typed parts (`Parts`, {"<name>:<part>": array}), which travel as
ordinary tensor frames of the protocol's `compressed` message; `decompress` checks them against the
codec and the shapes the message names and raises CompressionError on anything else (protocol.decode
turns it into a ProtocolError).

A codec is a `Codec` subclass in `CODECS`: the built-ins by name, a user's as
`compression.kind=package.module:ClassName`, which a process imports once as it sets up for a run
(`load_codec`: the server's validation, a worker's setup). `codec` finds only what is built in or
loaded: a codec a message names never makes a process import a module.

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
from collections.abc import Mapping, Sequence

import numpy as np

from nodes.contracts.plugins import Registry, is_user_class
from nodes.contracts.schema import NO_COMPRESSION, CompressionConfig

Parts = dict[str, np.ndarray]
Shapes = dict[str, tuple[int, ...]]
PartSpec = dict[str, tuple[type[np.generic], int]]  # a tensor's parts: name -> (dtype, size)


class CompressionError(ValueError):
    """Parts that do not form a valid compressed update."""


class CodecLoadError(ValueError):
    """compression.kind names no codec this process can load; the message is one line naming the key."""


class Codec:
    """A way to encode each tensor of an update for the upload, and to decode it on the server.

    A tensor of n coordinates becomes a few named parts, each a 1-D array whose dtype (one of the
    protocol's DTYPES) and size depend on n and the codec's options alone (`parts`): so an update's
    size is known before it is trained, and the server checks every part it receives against `parts`
    before `decode` reads it. A codec keeps no state; error feedback is the emulator's.

    Write `parts`, `encode` and `decode` (and `norm_factors` for the server's derived plausibility
    bound) in a subclass and name it as `compression.kind=package.module:ClassName`: the server and
    every worker import it.

    Args:
        options: the scenario's `compression` section; `bits` and `fraction` are there for any codec.
    """

    def __init__(self, options: CompressionConfig) -> None:
        """Keep the compression section as `self.options`."""
        self.options = options

    def parts(self, n: int) -> PartSpec:
        """Name the parts of a tensor of n coordinates.

        Args:
            n: the tensor's number of coordinates (0 for an empty tensor).

        Returns:
            Each part's name (no ":") and its (dtype, size), in the order `encode` returns them.
        """
        raise NotImplementedError

    def encode(self, x: np.ndarray, rng: np.random.Generator) -> Parts:
        """Encode one tensor of the update.

        Args:
            x: its n coordinates, flat float32.
            rng: the client's (seed, "compression", round, client) stream, shared by the update's
                tensors in their order: the only randomness a codec may use.

        Returns:
            The parts `parts(n)` names, of their dtypes and sizes.
        """
        raise NotImplementedError

    def decode(self, n: int, parts: Parts) -> np.ndarray:
        """Decode one tensor; the parts came from the network.

        Args:
            n: the tensor's number of coordinates.
            parts: exactly the parts `parts(n)` names, each of its dtype and size (checked already);
                raise CompressionError on anything else wrong with them (a code out of range).

        Returns:
            The n decoded coordinates, flat float32.

        Raises:
            CompressionError: anything else wrong with the parts; the server rejects the update.
        """
        raise NotImplementedError

    def norm_factors(self, shapes: Sequence[tuple[int, ...]]) -> tuple[float, float]:
        """Bound the decoded update and its error, per unit norm of what was encoded.

        Args:
            shapes: the update's tensor shapes.

        Returns:
            (decoded, residual): the most ||decoded|| and ||encoded - decoded|| can be for an encoded
            update of norm 1 (emulator.aggregate.plausibility); inf where the codec bounds nothing,
            which leaves its updates without the server's derived bound.
        """
        return math.inf, math.inf

    def nbytes(self, n: int) -> int:
        """Return the bytes of the frames a tensor of n coordinates becomes.

        Args:
            n: the tensor's number of coordinates.

        Returns:
            The parts' sizes, in bytes of their dtypes, as `parts(n)` names them.
        """
        return sum(np.dtype(dtype).itemsize * size for dtype, size in self.parts(n).values())


CODECS: Registry[Codec] = Registry("compression.kind", Codec, "nodes.contracts.codecs.Codec", CodecLoadError)
_LOADED: dict[str, type[Codec]] = {}  # the users' codecs this process imported, by reference


def load_codec(kind: str) -> None:
    """Import the codec `kind` names where it is a user's, so that `codec` finds it.

    A process calls it once, where it sets up for a run.

    Args:
        kind: compression.kind.

    Raises:
        CodecLoadError: the codec cannot be loaded; one line naming compression.kind.
    """
    if is_user_class(kind):
        _LOADED[kind] = CODECS.get(kind)


def known(kind: str) -> bool:
    """Return whether `codec` finds `kind`: a built-in, or a user's this process has loaded. Never imports."""
    return kind in _LOADED or kind in CODECS.names()


def choices() -> str:
    """Return compression.kind's choices, as `--help` and errors list them."""
    return f"{NO_COMPRESSION} | {CODECS.describe()}"


def codec(options: CompressionConfig) -> Codec:
    """Build the codec `options.kind` names, with `options`.

    Args:
        options: the scenario's `compression` section.

    Returns:
        The codec.

    Raises:
        CompressionError: `options.kind` is not `known`.
    """
    if not known(options.kind):
        raise CompressionError(f"codec {options.kind!r} is not one this process has loaded")
    return (_LOADED.get(options.kind) or CODECS.get(options.kind))(options)


def levels(bits: int) -> int:
    """Return s, the positive quantisation levels of a b-bit signed code: codes 0..2s stand for -s..s."""
    return int(2 ** (bits - 1)) - 1


def kept(fraction: float, n: int) -> int:
    """Return topk's coordinates kept of a tensor of n (at least one of a non-empty tensor)."""
    return min(n, max(1, math.ceil(fraction * n))) if n else 0


def part_bytes(options: CompressionConfig, n: int) -> int:
    """Return the bytes of the frames a tensor of n coordinates becomes (its float32 frame: 4 n)."""
    return 4 * n if options.kind == NO_COMPRESSION else codec(options).nbytes(n)


def compress(options: CompressionConfig, update: Mapping[str, np.ndarray], rng: np.random.Generator) -> Parts:
    """Encode the update's parts, tensor by tensor in its order (qsgd draws from `rng` in that order)."""
    encoder = codec(options)
    parts: Parts = {}
    for name, x in update.items():
        flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        for part, a in encoder.encode(flat, rng).items():
            parts[f"{name}:{part}"] = a
    return parts


def decompress(options: CompressionConfig, shapes: Shapes, parts: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Decode the dense float32 update that `parts` encode, shaped as `shapes`.

    Raises:
        CompressionError: unless the parts are exactly the codec's, of their dtypes and sizes, with valid
            codes and indices, and the codec decodes each tensor to its float32 coordinates.
    """
    decoder = codec(options)
    specs = {name: decoder.parts(math.prod(shape)) for name, shape in shapes.items()}
    names = {f"{name}:{part}" for name, spec in specs.items() for part in spec}
    if set(parts) != names:
        raise CompressionError(f"parts {sorted(parts)[:6]} are not the {options.kind} parts of {sorted(shapes)[:6]}")
    update = {}
    for name, shape in shapes.items():
        n = math.prod(shape)
        mine = {part: parts[f"{name}:{part}"] for part in specs[name]}
        for part, a in mine.items():
            dtype, size = specs[name][part]
            if a.dtype != dtype or a.ndim != 1 or a.size != size:
                raise CompressionError(f"{name}:{part}: {a.dtype} of {a.size}, expected {np.dtype(dtype)} of {size}")
        dense = decoder.decode(n, mine)
        if not (isinstance(dense, np.ndarray) and dense.dtype == np.float32 and dense.shape == (n,)):
            raise CompressionError(f"{name}: the {options.kind} codec decoded other than {n} float32 coordinates")
        update[name] = dense.reshape(shape)
    return update


def round_trip(
    options: CompressionConfig, update: Mapping[str, np.ndarray], rng: np.random.Generator
) -> tuple[Parts, dict[str, np.ndarray]]:
    """Return the parts and what the server will decode from them (error feedback's residual is the difference)."""
    parts = compress(options, update, rng)
    return parts, decompress(options, {k: v.shape for k, v in update.items()}, parts)


# --- qsgd ----------------------------------------------------------------------------------------


@CODECS.register("qsgd")
class Qsgd(Codec):
    """Stochastic b-bit quantisation: the tensor's norm and a packed signed level per coordinate."""

    def parts(self, n: int) -> PartSpec:
        """Name the norm and the codes, packed `bits` bits each."""
        return {"norm": (np.float32, 1), "codes": (np.uint8, math.ceil(n * self.options.bits / 8))}

    def encode(self, x: np.ndarray, rng: np.random.Generator) -> Parts:
        """Quantise each coordinate to a signed level, rounding by one draw from `rng` per coordinate."""
        bits = self.options.bits
        s = levels(bits)
        norm = np.float32(np.linalg.norm(x.astype(np.float64)))
        u = rng.random(x.size)  # one draw per coordinate, also where the norm is 0
        r = np.abs(x.astype(np.float64)) / float(norm) * s if norm > 0 else np.zeros(x.size)
        level = np.minimum(np.floor(r + u), s)  # QSGD eq. 1: floor(r) + 1 with probability r - floor(r)
        codes = (np.sign(x) * level + s).astype(np.uint32)
        return {"norm": np.array([norm], dtype=np.float32), "codes": _pack(codes, bits)}

    def decode(self, n: int, parts: Parts) -> np.ndarray:
        """Scale each signed level by norm / s; CompressionError on a code above 2 * s or a negative norm."""
        bits = self.options.bits
        s = levels(bits)
        codes = _unpack(parts["codes"], bits, n)
        if codes.size and int(codes.max()) > 2 * s:
            raise CompressionError(f"qsgd code {int(codes.max())} above {2 * s}")
        norm = parts["norm"][0]
        if not norm >= 0:
            raise CompressionError(f"qsgd norm {norm} is negative")
        return ((codes.astype(np.float64) - s) * (float(norm) / s)).astype(np.float32)

    def norm_factors(self, shapes: Sequence[tuple[int, ...]]) -> tuple[float, float]:
        """Bound by each coordinate's error, at most ||x|| / s: see emulator.aggregate.plausibility's docstring."""
        spread = math.sqrt(max((math.prod(s) for s in shapes), default=0)) / levels(self.options.bits)
        return 1 + spread, spread


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


@CODECS.register("topk")
class TopK(Codec):
    """The coordinates of largest magnitude, as uint32 indices and float32 values."""

    def parts(self, n: int) -> PartSpec:
        """Name the indices and the values of the coordinates kept."""
        k = kept(self.options.fraction, n)
        return {"index": (np.uint32, k), "value": (np.float32, k)}

    def encode(self, x: np.ndarray, rng: np.random.Generator) -> Parts:
        """Keep the coordinates of largest magnitude (ties: the lower index), in increasing index order."""
        k = kept(self.options.fraction, x.size)
        order = np.argsort(-np.abs(x), kind="stable")  # the largest first, ties by index: deterministic
        index = np.sort(order[:k]).astype(np.uint32)
        return {"index": index, "value": x[index].astype(np.float32)}

    def decode(self, n: int, parts: Parts) -> np.ndarray:
        """Set the kept coordinates, zeros elsewhere; CompressionError unless indices increase strictly below n."""
        index = parts["index"].astype(np.int64)
        if index.size and (index[-1] >= n or (np.diff(index) <= 0).any()):
            raise CompressionError(f"topk indices not strictly increasing below {n}")
        dense = np.zeros(n, dtype=np.float32)
        dense[index] = parts["value"]
        return dense

    def norm_factors(self, shapes: Sequence[tuple[int, ...]]) -> tuple[float, float]:
        """Bound by 1 each: the decoded update is a subset of the coordinates, and its error the rest."""
        return 1.0, 1.0


# --- sign ----------------------------------------------------------------------------------------


@CODECS.register("sign")
class Sign(Codec):
    """A sign bit per coordinate and the scale mean |x|."""

    def parts(self, n: int) -> PartSpec:
        """Name the scale and the sign bits, packed eight a byte."""
        return {"scale": (np.float32, 1), "bits": (np.uint8, math.ceil(n / 8))}

    def encode(self, x: np.ndarray, rng: np.random.Generator) -> Parts:
        """Keep each coordinate's sign and the scale mean |x|; no draw."""
        scale = np.float32(np.abs(x.astype(np.float64)).mean()) if x.size else np.float32(0)
        return {"scale": np.array([scale], dtype=np.float32), "bits": _pack((x < 0).astype(np.uint32), 1)}

    def decode(self, n: int, parts: Parts) -> np.ndarray:
        """Give each coordinate the scale with its sign; CompressionError on a negative scale."""
        scale = parts["scale"][0]
        if not scale >= 0:
            raise CompressionError(f"sign scale {scale} is negative")
        negative = _unpack(parts["bits"], 1, n)
        dense: np.ndarray = np.where(negative == 1, -scale, scale).astype(np.float32)
        return dense

    def norm_factors(self, shapes: Sequence[tuple[int, ...]]) -> tuple[float, float]:
        """Bound by 1 each: mean |x| sqrt(n) <= ||x|| (Cauchy-Schwarz), and the least-squares residual."""
        return 1.0, 1.0

"""Update compression (nodes.contracts.codecs, emulator.aggregate.compression): each codec's frame sizes and error
bounds, QSGD's unbiasedness, malformed compressed frames refused by protocol.decode, and the
server's residuals through a checkpoint."""

from __future__ import annotations

import math

import numpy as np
import pytest

from emulator.aggregate.compression import Compression, task_frame
from emulator.output import checkpoint
from nodes.contracts import protocol
from nodes.contracts.codecs import decompress, kept, levels, part_bytes, round_trip
from nodes.contracts.protocol import ProtocolError
from nodes.contracts.schema import CompressionConfig
from nodes.contracts.tasks import ClientTask
from nodes.transport.dispatch import Reply
from nodes.worker import compressed_update

QSGD8 = CompressionConfig(kind="qsgd", bits=8)
TOPK = CompressionConfig(kind="topk", fraction=0.1)
SIGN = CompressionConfig(kind="sign")
CODECS = [QSGD8, CompressionConfig(kind="qsgd", bits=3), TOPK, SIGN]
METRICS = {"steps": 1, "train_loss": 0.5, "update_norm": 1.0}


def update(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((13, 7)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: f"{c.kind}{c.bits}")
def test_parts_take_the_analytic_bytes(codec):
    parts, _ = round_trip(codec, update(), np.random.default_rng(0))
    for name, n in (("w", 91), ("b", 5)):
        assert sum(a.nbytes for k, a in parts.items() if k.startswith(name + ":")) == part_bytes(codec, n)
    assert part_bytes(QSGD8, 91) == 4 + 91 and part_bytes(SIGN, 91) == 4 + 12
    assert part_bytes(TOPK, 91) == 8 * 10 and kept(0.01, 100) == 1 and kept(0.01, 101) == 2


@pytest.mark.parametrize("bits", [2, 3, 8, 16])
def test_qsgd_is_within_one_level_of_the_update(bits):
    x = update()
    _, decoded = round_trip(CompressionConfig(kind="qsgd", bits=bits), x, np.random.default_rng(1))
    for k, v in x.items():
        step = np.linalg.norm(v.astype(np.float64)) / levels(bits)
        err = np.abs(decoded[k].astype(np.float64) - v)
        assert err.max() <= step * (1 + 1e-6), (k, err.max(), step)
        assert (np.sign(decoded[k]) * np.sign(v) >= 0).all()  # a level never crosses zero


def test_qsgd_is_unbiased_over_many_draws():
    x, bits, draws = update(), 3, 4000
    rng = np.random.default_rng(7)
    total = {k: np.zeros(v.shape) for k, v in x.items()}
    for _ in range(draws):
        _, decoded = round_trip(CompressionConfig(kind="qsgd", bits=bits), x, rng)
        for k in x:
            total[k] += decoded[k]
    for k, v in x.items():
        step = np.linalg.norm(v.astype(np.float64)) / levels(bits)
        # a draw is one of two levels `step` apart: its std <= step / 2; 5 standard errors of the mean
        bound = 5 * (step / 2) / math.sqrt(draws)
        assert np.abs(total[k] / draws - v).max() <= bound, k
    _, once = round_trip(CompressionConfig(kind="qsgd", bits=bits), x, np.random.default_rng(0))
    assert not np.allclose(once["w"], x["w"], atol=1e-3)  # the draws quantise: the mean is what is exact


def test_qsgd_draws_follow_the_generator():
    a = round_trip(QSGD8, update(), np.random.default_rng(3))[1]
    b = round_trip(QSGD8, update(), np.random.default_rng(3))[1]
    c = round_trip(QSGD8, update(), np.random.default_rng(4))[1]
    assert all(np.array_equal(a[k], b[k]) for k in a) and not all(np.array_equal(a[k], c[k]) for k in a)


def test_topk_keeps_the_largest_exactly_and_zeroes_the_rest():
    x = update()
    _, decoded = round_trip(TOPK, x, np.random.default_rng(0))
    for k, v in x.items():
        n, k_kept = v.size, kept(TOPK.fraction, v.size)
        nonzero = np.flatnonzero(decoded[k])
        assert len(nonzero) == k_kept
        assert np.array_equal(decoded[k].reshape(-1)[nonzero], v.reshape(-1)[nonzero])
        assert np.abs(v.reshape(-1)[nonzero]).min() >= np.sort(np.abs(v.reshape(-1)))[n - k_kept]
        err = np.sum((decoded[k].astype(np.float64) - v) ** 2)
        assert err <= (1 - k_kept / n) * np.sum(v.astype(np.float64) ** 2)


def test_sign_sends_the_signs_scaled_by_the_mean_magnitude():
    x = update()
    x["b"][2] = 0.0
    _, decoded = round_trip(SIGN, x, np.random.default_rng(0))
    for k, v in x.items():
        scale = np.abs(v.astype(np.float64)).mean()
        expected = np.where(v < 0, -scale, scale)
        np.testing.assert_allclose(decoded[k], expected, rtol=1e-6)
        # ||x - s sign(x)||^2 = ||x||^2 - n s^2 with s = mean |x|
        err = np.sum((decoded[k].astype(np.float64) - v) ** 2)
        assert err == pytest.approx(np.sum(v.astype(np.float64) ** 2) - v.size * scale**2, rel=1e-5)


# --- the wire ------------------------------------------------------------------------------------


def task(residual: dict[str, np.ndarray] | None = None) -> dict:
    model = {k: np.zeros_like(v) for k, v in update().items()}
    return {"round": 2, "client": 3, "model": model, **({"residual": residual} if residual is not None else {})}


def wire(codec: CompressionConfig, residual: dict[str, np.ndarray] | None = None) -> list:
    return list(compressed_update(codec, 0, task(residual), update(), METRICS).frames)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: f"{c.kind}{c.bits}")
def test_a_compressed_update_decodes_to_what_the_worker_decoded(codec):
    msg = protocol.decode(wire(codec), 2**20)
    shapes = {k: v.shape for k, v in update().items()}
    local = decompress(codec, shapes, msg["parts"])
    assert all(np.array_equal(msg["update"][k], local[k]) for k in shapes)
    assert msg["residual"] == {} and msg["codec"] == protocol.codec_fields(codec)


def forged(mutate) -> list:
    """A topk update's frames with its header changed by `mutate(header)`; the frames kept."""
    import msgpack

    frames = wire(TOPK)
    header = msgpack.unpackb(bytes(frames[0]))
    mutate(header)
    return [msgpack.packb(header), *frames[1:]]


def _swap_index(frames: list, index: np.ndarray) -> list:
    out = list(frames)
    out[1] = index.astype("<u4").tobytes()  # w:index, the first part
    return out


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param(lambda: _swap_index(wire(TOPK), np.arange(9, -1, -1)), id="indices not increasing"),
        pytest.param(lambda: _swap_index(wire(TOPK), np.arange(10) + 90), id="index past the tensor"),
        pytest.param(lambda: forged(lambda h: h["shapes"].__setitem__(0, ["w", [13, 8]])), id="shape of other parts"),
        pytest.param(lambda: forged(lambda h: h["codec"].__setitem__("kind", "sign")), id="parts of another codec"),
        pytest.param(lambda: forged(lambda h: h["parts"].pop()), id="a part missing"),
    ],
)
def test_a_malformed_compressed_frame_is_a_protocol_error(frames):
    with pytest.raises(ProtocolError) as e:
        protocol.decode(frames(), 2**20)
    assert e.value.reason in ("bad_compressed", "frames") and e.value.reason in protocol.REASONS


def test_bad_qsgd_codes_and_oversized_shapes_are_refused():
    frames = list(compressed_update(CompressionConfig(kind="qsgd", bits=3), 0, task(), update(), METRICS).frames)
    codes = np.frombuffer(frames[2], np.uint8).copy()  # w:codes: 91 codes of 3 bits; 7 (above 2s = 4) first
    codes[0] |= 0b111
    frames[2] = codes.tobytes()
    with pytest.raises(ProtocolError) as e:
        protocol.decode(frames, 2**20)
    assert e.value.reason == "bad_compressed"

    def huge(h):
        h["shapes"][0] = ["w", [2**20, 2**10]]

    with pytest.raises(ProtocolError) as e:
        protocol.decode(forged(huge), 2**20)
    assert e.value.reason == "oversized"  # 4 GiB dense from a few bytes of parts: refused before decoding


# --- the server's side -----------------------------------------------------------------------------


def reply(codec: CompressionConfig, residual: dict[str, np.ndarray] | None = None) -> Reply:
    frames = wire(codec, residual)
    return Reply(client=3, message=protocol.decode(frames, 2**20), nbytes=sum(len(bytes(f)) for f in frames))


def test_the_server_rebuilds_the_model_and_charges_the_compressed_message():
    weights = {k: np.full_like(v, 2.0) for k, v in update().items()}
    comp = Compression(TOPK)
    r = reply(TOPK)
    assert comp.unpack(r, weights) == ""
    for k in weights:
        np.testing.assert_array_equal(r.message["model"][k], weights[k] + r.message["update"][k])
    assert comp.charged_up(r) == r.nbytes < sum(v.nbytes for v in update().values())
    assert Compression(SIGN).unpack(reply(TOPK), weights).startswith("bad update: codec")
    assert Compression(CompressionConfig()).unpack(reply(TOPK), weights).startswith("bad update: compressed")


def test_error_feedback_residuals_travel_uncharged_and_are_kept_only_for_clients_that_trained():
    ef = CompressionConfig(kind="sign", error_feedback=True)
    comp = Compression(ef)
    weights = {k: np.zeros_like(v) for k, v in update().items()}
    r = reply(ef, residual={})
    assert comp.unpack(r, weights) == ""
    assert comp.charged_up(r) == len(protocol.Message(tuple(wire(SIGN)))) < r.nbytes  # as without feedback
    for k, v in update().items():  # residual = p - decoded(p), with p the update (no earlier residual)
        np.testing.assert_array_equal(r.message["residual"][k], v - r.message["update"][k])
    comp.keep({3: r, 4: r}, trained=[3])
    assert set(comp.residuals) == {3}
    t = ClientTask(client=3, steps=1, lr=0.1, sigma=0.0, clip=0.0, q=0.5)
    sent = comp.task(0, t, weights)
    assert comp.charged_down(0, t, weights, sent) == len(task_frame(0, t, weights)) < len(sent)
    got = protocol.decode(list(sent.frames), 2**20)
    assert all(np.array_equal(got["residual"][k], comp.residuals[3][k]) for k in weights)


def test_residuals_survive_a_checkpoint_and_a_bad_one_is_refused():
    shapes = {k: v.shape for k, v in update().items()}
    comp = Compression(CompressionConfig(kind="topk", error_feedback=True), {1: update(1), 4: update(4)})
    state = comp.state()
    back = Compression.residuals_of(state, shapes)
    assert set(back) == {1, 4} and all(np.array_equal(back[c][k], comp.residuals[c][k]) for c in back for k in shapes)
    expected = checkpoint.Expected(3, 5, shapes, rounds_on_disk={0}, load_policy=lambda s: None)
    doc = {"next_round": 1, "now": 1.0, "bytes_spent": 0, "links_bad": [], "policy": {}}
    weights = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    for good in ({}, {"residuals": state}):
        checkpoint.validate(weights, {**doc, **good, checkpoint.VERSION_KEY: checkpoint.FORMAT_VERSION}, expected)
    for bad in ({"9": state["1"]}, {"1": {"w": state["1"]["w"]}}, {"1": {**state["1"], "b": "AAAA"}}):
        with pytest.raises(checkpoint.InvalidCheckpoint, match="residuals"):
            checkpoint.validate(
                weights, {**doc, "residuals": bad, checkpoint.VERSION_KEY: checkpoint.FORMAT_VERSION}, expected
            )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["compression.kind=zip"], "compression.kind = 'zip': expected none | qsgd | topk | sign"),
        (["compression.error_feedback=true"], "compression.error_feedback = True: expected false with"),
        (["compression.kind=qsgd", "compression.bits=1"], "compression.bits = 1: expected an integer in [2, 16]"),
        (
            ["compression.kind=topk", "compression.fraction=0"],
            "compression.fraction = 0.0: expected a number in (0, 1]",
        ),
    ],
)
def test_a_bad_compression_section_is_refused_in_one_line(overrides, message):
    from emulator.config import load
    from emulator.config.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)

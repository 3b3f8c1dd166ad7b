"""The server's side of `compression` (nodes.contracts.codecs has the codecs): the task a client gets, the
compressed reply turned back into a model, the bytes the links charge, and each client's
error-feedback residual.

The residuals are the server's state, not a worker's: a task carries its client's (`task_residual`)
and the reply brings the next one back, so that whichever worker trains a client, and after a
resume, the result is the same. The residual stands for memory a real client keeps on the device:
the links are charged the messages without it (`charged_down`, `charged_up`), as a real client
would send and receive them. A residual changes only for a client that trained (it received its
task), whatever became of its upload: a real client keeps its own error however its upload fares.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from nodes.contracts import protocol
from nodes.contracts.codecs import Codec, codec, compress, load_codec
from nodes.contracts.protocol import Message, MessageType
from nodes.contracts.schema import NO_COMPRESSION, CompressionConfig
from nodes.contracts.tasks import ClientTask, Weights
from nodes.transport.dispatch import Reply


def task_frame(rnd: int, t: ClientTask, weights: Weights) -> Message:
    """The task message; its tensor frames are views of `weights`, shared by every client's task."""
    return protocol.encode(MessageType.TASK, round=rnd, client=t.client, params=t.to_wire(), model=weights)


def update_bytes(options: CompressionConfig, weights: Weights) -> int:
    """The size of a compressed update of `weights`' tensors as the links carry it (no residual, no
    metrics): the upload estimate of R_s and of the policies. Every codec's frames have a size fixed by
    the tensors' sizes (nodes.contracts.codecs.part_bytes), so an update of zeros has it."""
    zeros = {k: np.zeros_like(v) for k, v in weights.items()}
    return len(
        protocol.encode(
            MessageType.COMPRESSED,
            round=0,
            client=0,
            codec=protocol.codec_fields(options),
            shapes=[[k, list(v.shape)] for k, v in weights.items()],
            parts=compress(options, zeros, np.random.default_rng(0)),
            residual={},
            metrics={},
        )
    )


class Compression:
    """The `compression` section (`self.options`), its codec (None without) and the residuals it keeps,
    by client."""

    def __init__(self, options: CompressionConfig, residuals: dict[int, Weights] | None = None):
        self.options = options
        load_codec(options.kind)
        self.codec: Codec | None = codec(options) if options.kind != NO_COMPRESSION else None
        self.residuals: dict[int, Weights] = residuals or {}

    @property
    def feedback(self) -> bool:
        return self.codec is not None and self.options.error_feedback

    def task(self, rnd: int, t: ClientTask, weights: Weights) -> Message:
        """Client `t.client`'s task message: with error feedback, its residual along ({} = zero)."""
        if not self.feedback:
            return task_frame(rnd, t, weights)
        residual = self.residuals.get(t.client, {})
        return protocol.encode(
            MessageType.TASK_RESIDUAL, round=rnd, client=t.client, params=t.to_wire(), model=weights, residual=residual
        )

    def charged_down(self, rnd: int, t: ClientTask, weights: Weights, task: Message) -> int:
        """What the link carries of `task`: the plain task, which is what a client holding its residual gets."""
        if not self.feedback:
            return len(task)
        return len(task_frame(rnd, t, weights))

    def charged_up(self, reply: Reply) -> int:
        """What the link carries of a (checked) reply: the compressed update without the residual."""
        msg = reply.message
        if not self.feedback or msg is None:
            return reply.nbytes
        fields = {k: msg[k] for k in protocol.FIELDS[MessageType.COMPRESSED]}
        return len(protocol.encode(MessageType.COMPRESSED, **{**fields, "residual": {}}))

    def unpack(self, reply: Reply, weights: Weights) -> str:
        """Why the reply is not an update this run's compression admits ('' if it is), else its model,
        w + the decoded update, set as the message's `model` (what aggregation reads)."""
        msg, kind = reply.message, self.options.kind
        assert msg is not None  # a reply without a failure has its message
        if kind == NO_COMPRESSION:
            return (
                "bad update: compressed, but compression.kind is none"
                if msg.get("type") == MessageType.COMPRESSED
                else ""
            )
        if msg.get("type") != MessageType.COMPRESSED:
            return f"bad update: uncompressed, but compression.kind is {kind}"
        if msg["codec"] != protocol.codec_fields(self.options):
            return f"bad update: codec {msg['codec']}, expected {protocol.codec_fields(self.options)}"
        update, residual = msg["update"], msg["residual"]
        if not _fits(update, weights) or not (_fits(residual, weights) if self.feedback else residual == {}):
            return "bad update: its tensors or residual do not match the model"
        with np.errstate(over="ignore"):  # an absurd update is the plausibility check's, or the model's check's
            msg["model"] = {k: weights[k] + update[k] for k in weights}
        return ""

    def keep(self, replies: Mapping[int, Reply], trained: Iterable[int]) -> None:
        """The new residuals of the clients that trained and replied (copies: the frames are ZeroMQ's)."""
        if not self.feedback:
            return
        for c in trained:
            r = replies[c]
            if not r.failure and r.message is not None:
                self.residuals[c] = {k: np.array(v) for k, v in r.message["residual"].items()}

    def state(self) -> dict[str, dict[str, str]]:
        """The residuals as the checkpoint keeps them: client -> tensor -> its float32 bytes, base64."""
        return {
            str(c): {k: base64.b64encode(np.ascontiguousarray(v, "<f4").tobytes()).decode() for k, v in r.items()}
            for c, r in sorted(self.residuals.items())
        }

    @staticmethod
    def residuals_of(state: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[int, Weights]:
        """`state`'s residuals (a checkpoint's, validated by emulator.output.checkpoint), shaped as the model."""
        return {
            int(c): {
                k: np.frombuffer(base64.b64decode(b), dtype="<f4").astype(np.float32).reshape(shapes[k])
                for k, b in r.items()
            }
            for c, r in state.items()
        }


def _fits(tensors: Any, weights: Weights) -> bool:
    return (
        isinstance(tensors, dict)
        and tensors.keys() == weights.keys()
        and all(tensors[k].shape == weights[k].shape and tensors[k].dtype == np.float32 for k in weights)
    )

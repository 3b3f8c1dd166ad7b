"""The contract between the server and its workers: what a client is asked to do, what it returns.

Both layers use these records; they live here, below `emulator/`, so workers never import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from nodes.contracts.schema import DPConfig

_WIRE_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
# Task fields left off the wire at their default (ClientTask.to_wire): added after the task's message
# had its size, which the results record (bytes_down, the byte budget's R_s).
_WIRE_OPTIONAL = ("update_clip",)

Weights = dict[str, np.ndarray]  # a model's (or an update's) tensors by parameter name

# A plausible tensor's values (the model's, a residual's, a buffered flight's) are finite and below this in magnitude:
# the square of 2^64 overflows float32 (its largest value is below 2^128), so from a weight this large every norm,
# loss and clipped gradient a worker or the server computes is inf. A NaN or inf model is not a run's to resume: every
# worker rejects its task (protocol.decode).
MAX_ABS = 2.0**64


@dataclass
class ClientTask:
    """What one selected client is asked to do this round; its fields travel in the task message.

    The first six drive DP-SGD (sigma = clip = 0: plain SGD); the rest are generic
    mechanisms the trainer applies, whatever paper asks for them. dp.batch_divisor and
    dp.empty_batch, constant over a run, are the trainer's own (nodes.training.trainer.build_trainer).
    A policy builds one with `ClientTask.dp_sgd`.

    Attributes:
        client: The client's id.
        steps: tau, the local steps.
        lr: eta, the learning rate.
        sigma: The noise multiplier: each step's noise is N(0, sigma^2 C^2).
        clip: C, the L2 bound of each per-sample gradient.
        q: The Poisson sampling rate of each step's batch.
        prox_mu: FedProx: adds mu/2 ||w - w_global||^2 to the local loss.
        weight_clip: > 0: the trained model's parameters are scaled to L2 norm <= weight_clip.
        output_noise: none | gaussian | laplace: noise on the uploaded parameters.
        output_noise_scale: Its std (gaussian) or scale b (laplace), per coordinate.
        report_grad_diff: Report ||grad F_i(w_i) - grad F_i(w)|| and ||w_i - w|| (full local data).
        report_last_step: Report the last step's ||w change|| and loss change on its batch.
        update_clip: > 0: the update w_i - w is scaled to L2 norm <= update_clip before any output noise.
    """

    client: int
    steps: int
    lr: float
    sigma: float
    clip: float
    q: float
    prox_mu: float = 0.0
    weight_clip: float = 0.0
    output_noise: str = "none"
    output_noise_scale: float = 0.0
    report_grad_diff: bool = False
    report_last_step: bool = False
    update_clip: float = 0.0

    @classmethod
    def dp_sgd(cls, client: int, dp: DPConfig, **changes: Any) -> ClientTask:
        """Return the scenario's DP-SGD round for `client`, with `changes` to any of its fields.

        Args:
            client: The client's id.
            dp: The scenario's dp section: dp.tau steps at dp.lr, dp.sigma, dp.clip, dp.q.
            **changes: Fields and their values instead of the scenario's (a policy's own tau, sigma or
                mechanisms).

        Returns:
            The task.

        Raises:
            TypeError: A key of `changes` is not a field of ClientTask.
        """
        scenario = {"steps": dp.tau, "lr": dp.lr, "sigma": dp.sigma, "clip": dp.clip, "q": dp.q}
        return cls(client=client, **{**scenario, **changes})  # as dataclasses.replace would, in one call

    def to_wire(self) -> dict[str, Any]:
        """Return the task's fields as its message carries them.

        Every field, but an optional one at its default: a task that does not use it is the same message, of
        the same size, as before the field existed.

        Returns:
            The fields' values, by name.
        """
        return {
            f.name: getattr(self, f.name)
            for f in _TASK_FIELD_LIST
            if f.name not in _WIRE_OPTIONAL or getattr(self, f.name) != f.default
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ClientTask:
        """Return the task that `to_wire`'s fields describe, each value converted to its field's type.

        Args:
            d: The task message's fields, by name.

        Returns:
            The task.

        Raises:
            ValueError: The names are not the task's fields (the optional ones may be left out).
        """
        names = _TASK_FIELDS  # the wire's field names and their types
        if not _TASK_REQUIRED <= set(d) <= _TASK_NAMES:
            optional = ", ".join(_WIRE_OPTIONAL)
            raise ValueError(f"task params {sorted(d)} do not match {sorted(names)} ({optional} optional)")
        return cls(**{k: _WIRE_TYPES[names[k]](v) for k, v in d.items()})


_TASK_FIELD_LIST = fields(ClientTask)  # once: dataclasses.fields builds its tuple at every call
_TASK_FIELDS = {f.name: str(f.type) for f in _TASK_FIELD_LIST}  # annotations are strings (__future__)
_TASK_NAMES = frozenset(_TASK_FIELDS)
_TASK_REQUIRED = _TASK_NAMES - set(_WIRE_OPTIONAL)  # the fields every task message carries


@dataclass
class ClientResult:
    """What one client's update brought the server: what a policy aggregates.

    Attributes:
        client: The client's id.
        weights: Its trained model, by tensor name (rescaled by FedNova's normalisation under
            round.partial_work_normalize).
        steps: The local steps its task asked for.
        train_loss: Its mean training loss over the round's batches, as it reported it.
        update_norm: ||w_i - w||, the L2 norm of its update.
        metrics: Everything the trainer reported.
    """

    client: int
    weights: dict[str, np.ndarray]
    steps: int
    train_loss: float
    update_norm: float
    metrics: dict[str, Any] = field(default_factory=dict)

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


@dataclass
class ClientTask:
    """What one selected client is asked to do this round; its fields travel in the task message.

    The first six drive DP-SGD (sigma = clip = 0: plain SGD); the rest are generic
    mechanisms the trainer applies, whatever paper asks for them. dp.batch_divisor and
    dp.empty_batch, constant over a run, are the trainer's own (nodes.training.trainer.build_trainer).
    """

    client: int
    steps: int
    lr: float
    sigma: float
    clip: float
    q: float
    prox_mu: float = 0.0  # FedProx: adds mu/2 ||w - w_global||^2 to the local loss
    weight_clip: float = 0.0  # > 0: the trained model's parameters are scaled to L2 norm <= weight_clip
    output_noise: str = "none"  # none | gaussian | laplace: noise on the uploaded parameters
    output_noise_scale: float = 0.0  # its std (gaussian) or scale b (laplace), per coordinate
    report_grad_diff: bool = False  # report ||grad F_i(w_i) - grad F_i(w)|| and ||w_i - w|| (full local data)
    report_last_step: bool = False  # report the last step's ||w change|| and loss change on its batch
    update_clip: float = 0.0  # > 0: the update w_i - w is scaled to L2 norm <= update_clip before any output noise

    @classmethod
    def dp_sgd(cls, client: int, dp: DPConfig, **changes: Any) -> ClientTask:
        """The scenario's DP-SGD round for `client` (dp.tau steps at dp.lr, dp.sigma, dp.clip, dp.q), with
        `changes` to any of its fields (a policy's own tau, sigma or mechanisms)."""
        scenario = {"steps": dp.tau, "lr": dp.lr, "sigma": dp.sigma, "clip": dp.clip, "q": dp.q}
        return cls(client=client, **{**scenario, **changes})  # as dataclasses.replace would, in one call

    def to_wire(self) -> dict[str, Any]:
        """Every field, but an optional one at its default: a task that does not use it is the same message,
        of the same size, as before the field existed."""
        return {
            f.name: getattr(self, f.name)
            for f in _TASK_FIELD_LIST
            if f.name not in _WIRE_OPTIONAL or getattr(self, f.name) != f.default
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ClientTask:
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
    client: int
    weights: dict[str, np.ndarray]
    steps: int
    train_loss: float
    update_norm: float
    metrics: dict[str, Any] = field(default_factory=dict)  # everything the trainer reported

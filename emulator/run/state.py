"""Where a run starts: round 0, or the round after its checkpoint with what the checkpoint kept
(virtual time, bytes spent, each link's loss state, the policy's and its accountant's state) and the
outcomes of the rounds on disk before it. `checkpoint_state` writes what `RunState.restore` reads.
RNG streams are keyed by (purpose, round, client), so there is no generator state to keep."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator.aggregate.compression import Compression
from emulator.output import checkpoint, results
from emulator.policies import ClientOutcome, Policy
from emulator.policies.boundary import not_json
from emulator.rounds.budgets import Budgets
from emulator.timemodel.clock import Outcome
from emulator.timemodel.loss import LOSS_MODELS
from emulator.timemodel.resources import Resources
from nodes.contracts.tasks import Weights

Restart = tuple[Weights, dict[str, Any]]  # a checkpoint's (weights, state): checkpoint.load


@dataclass
class RunState:
    first_round: int = 0
    now: float = 0.0  # virtual time
    weights: Weights | None = None  # None: the initial model, which the workers build
    bytes_spent: int = 0
    energy_spent: float = 0.0  # joules of the rounds on disk (their rows hold them: no checkpoint key)
    batteries: dict[int, tuple[float, float]] = field(default_factory=dict)  # (t, joules) after a last task
    links_bad: list[int] = field(default_factory=list)  # the links in their loss model's bad state
    policy: dict[str, Any] | None = None  # Policy.state_dict(); None: as built
    outcomes: list[ClientOutcome] = field(default_factory=list)  # of the rounds before first_round
    residuals: dict[int, Weights] = field(default_factory=dict)  # compression's error feedback, by client
    buffered: dict[str, Any] | None = None  # round.mode=buffered|async: its dispatches and clients in flight

    @classmethod
    def restore(cls, writer: results.RunWriter, restart: Restart | None) -> RunState:
        """A new run's state, or a resumed one's from its (validated) checkpoint. What a killed run
        wrote past its checkpoint (or before its first), torn temporary files included, is discarded
        first: the tables then hold exactly the rounds before the first one to play."""
        weights, saved = restart if restart is not None else (None, {})
        first = saved.get("next_round", 0)
        writer.discard_from(first)
        if restart is None:
            return cls()
        return cls(
            first_round=first,
            now=saved["now"],
            weights=weights,
            bytes_spent=saved["bytes_spent"],
            links_bad=saved["links_bad"],
            policy=saved["policy"],
            outcomes=past_outcomes(writer.dir),
            energy_spent=past_energy(writer.dir),
            batteries=past_batteries(writer.dir),
            residuals=Compression.residuals_of(saved.get("residuals", {}), {k: w.shape for k, w in restart[0].items()}),
            buffered=saved.get("buffered"),
        )

    def apply_to_links(self, resources: Resources) -> None:
        for c in self.links_bad:
            resources[c].loss.bad = True

    def apply_to(self, budgets: Budgets, policy: Policy) -> None:
        budgets.bytes_spent = self.bytes_spent
        budgets.energy_spent = self.energy_spent
        if self.policy is not None:
            policy.load_state_dict(self.policy)


def checkpoint_state(
    next_round: int,
    now: float,
    budgets: Budgets,
    resources: Resources,
    policy: Policy,
    compression: Compression,
    buffered: dict[str, Any] | None = None,
) -> str:
    """The state the checkpoint keeps, taken as a round ends: with the evaluation overlapped, the
    checkpoint is written after the next round has moved the clock, the budgets and the policy on.
    Taken as its JSON document, which is cheaper than a deep copy of the per-client state. The
    residuals of error feedback only where it is on, and buffered mode's clients in flight
    (emulator.rounds.flights) only in that mode: other runs' checkpoints are as before."""
    residuals = {"residuals": compression.state()} if compression.feedback else {}
    if buffered is not None:
        residuals["buffered"] = buffered
    state = policy.state_dict()
    try:
        return checkpoint.snapshot(
            {
                "next_round": next_round,
                "now": now,
                "bytes_spent": budgets.bytes_spent,
                "links_bad": links_bad(resources),
                "policy": state,
                **residuals,
            }
        )
    except (TypeError, ValueError) as e:  # only the policy's part can fail to encode: the rest is the runtime's
        raise not_json(policy, state, e) from e


def links_bad(resources: Resources) -> list[int]:
    """The links in their loss model's bad state (Gilbert-Elliott's), in id order. Only a stateful model
    leaves the good state, and only a made link's: a run under another has none to look for among the
    clients it selected."""
    if not LOSS_MODELS.get(resources.links.dropout.model).stateful:
        return []
    return sorted(c for c, r in resources.made.items() if r.loss.bad)


def past_outcomes(run_dir: Path) -> list[ClientOutcome]:
    """The outcomes of the rounds on disk (a resumed run's history)."""
    return [
        ClientOutcome(
            round=r["round"],
            client=r["client"],
            outcome=r["outcome"],
            t_down_start=r["t_download_start"],
            t_down_end=r["t_download_end"],
            t_compute_end=r["t_compute_end"],
            t_up_end=r["t_upload_end"],
            train_loss=_arrived_loss(r),
        )
        for r in results.read_table(run_dir, "client_rounds").to_pylist()
    ]


def past_energy(run_dir: Path) -> float:
    """The joules of the rounds on disk, summed in round order as the run charged them (Budgets.spend)."""
    rounds = results.read_table(run_dir, "rounds").sort_by("round")
    return sum((e for e in rounds["energy_j"].to_pylist() if e is not None), 0.0)


def past_batteries(run_dir: Path) -> dict[int, tuple[float, float]]:
    """Each client's (end, charge) after its last task on disk, where batteries are modelled."""
    cr = results.read_table(run_dir, "client_rounds").sort_by("round").select(["client", "t_end", "battery_end_j"])
    after = {}
    for c, t, joules in zip(*(cr[k].to_pylist() for k in cr.column_names), strict=True):  # rounds in order
        if joules is not None:
            after[c] = (t, joules)
    return after


def _arrived_loss(row: dict[str, Any]) -> float:
    if row["outcome"] != Outcome.ARRIVED or row["train_loss"] is None:
        return math.nan
    return float(row["train_loss"])

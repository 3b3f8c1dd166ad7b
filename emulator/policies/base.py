"""The policy contract (Flower's Strategy, narrowed): configure a round, then aggregate it.

The runtime knows nothing about any one paper: it asks the policy for a `RoundPlan`, reports
every selected client's outcome (`observe_outcomes`, Flower's `failures` and more), delivers the
`ClientResult`s that arrived on time (`aggregate`) and reports the evaluation back (`observe`).
A policy is one module: its options (`Options`, checked by `check`), its accountant, its round.
What it may know of the system (data sizes, links, compute, past outcomes) is `RunContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from emulator.policies.accounting import Accountant, RdpAccountant
from emulator.policies.options import is_user_policy, parse_options
from emulator.policies.system import ClientInfo, ClientOutcome
from nodes.contracts.rng import stream
from nodes.contracts.schema import Check, Selection
from nodes.contracts.tasks import ClientResult, ClientTask

if TYPE_CHECKING:
    # the scenario with the policies' sections is emulator.config's, which imports this
    from nodes.contracts.schema import Scenario


@dataclass(frozen=True)
class RoundPlan:
    tasks: tuple[ClientTask, ...]  # distinct clients among those offered, in any order: the runtime sorts them by id
    # Policy state recorded in `rounds` once the round is over, with what aggregate() and
    # observe() add to it (e.g. mu estimated from the round's updates).
    state: dict[str, Any] = field(default_factory=dict)  # plain JSON values: numbers, None, per-client dicts
    # A round even without tasks: a Poisson draw of no client still releases an aggregate (its noise alone).
    empty_round: bool = False


@dataclass
class RunContext:
    """What a policy may know about the run when it is built."""

    n_clients: int
    data_sizes: list[int]
    num_params: int
    rounds_budget: int  # R_s as derived from the round, byte and time budgets
    task_bytes: int = 0  # one task message (the global model and its parameters)
    update_bytes: int = 0  # one update as the links carry it: a compressed update's size, else (0) task_bytes
    clients: Sequence[ClientInfo] = ()  # per client: resources as drawn for the run and outcome history
    now: Callable[[], float] = lambda: 0.0  # virtual time; while configure_round runs, the round's start
    mode: str = "sync"  # round.mode: sync | buffered | async (docs/async.md)
    # Buffered and async modes: how many clients configure_round is to select now (the free slots);
    # 0 in sync mode, where clients.per_round says.
    slots: Callable[[], int] = lambda: 0

    def __post_init__(self) -> None:
        self.update_bytes = self.update_bytes or self.task_bytes


def select_clients(cfg: Scenario, rnd: int, eligible: Sequence[int], how: str = "", k: int = 0) -> list[int]:
    """Client selection: all, K-of-N uniform (per-round stream), or round-robin over client ids.
    `how` overrides clients.select for policies whose paper fixes the rule; `k` > 0 overrides
    clients.per_round (buffered mode's free slots)."""
    c = cfg.clients
    how = how or c.select
    k = k or c.per_round or len(eligible)
    if how == Selection.ALL or k >= len(eligible):
        return sorted(eligible)
    if how == Selection.UNIFORM:
        pick = stream(cfg.seed, "select", rnd).choice(len(eligible), size=k, replace=False)
        return sorted(eligible[i] for i in pick)
    start = (rnd * k) % len(eligible)  # round_robin
    return sorted(eligible[(start + j) % len(eligible)] for j in range(k))


def dp_sgd_tasks(cfg: Scenario, clients: Sequence[int]) -> tuple[ClientTask, ...]:
    """The scenario's DP-SGD round (dp.tau steps at dp.lr, dp.sigma, dp.clip, dp.q) for each client, by id."""
    return tuple(ClientTask.dp_sgd(i, cfg.dp) for i in sorted(clients))


class Policy:
    name = "base"
    Options: type | None = None  # the dataclass of its options: a built-in's scenario section, named after
    options_help = ""  # it (that section's line in --help); a user policy's `policy_args`
    options: Any  # read_options's: a policy with Options declares it as that class
    # What the policy learns as it runs (plain numbers, lists, None): its part of a checkpoint.
    state_keys: tuple[str, ...] = ()
    # Whether it selects from the per-client view (links, compute, history): the runtime must describe every client.
    needs_client_view = False
    # Whether round.partial_work applies: its tasks are DP-SGD steps, each charged alone, and it aggregates by
    # FedAvg (what FedNova's normalisation feeds); an output-noise or update-clipping mechanism is not.
    partial_work = False
    # Whether round.mode=buffered|async applies (emulator.run.buffered): configure_round selects ctx.slots()
    # clients from those offered, and the runtime aggregates by the staleness rule, not by `aggregate`.
    buffered = False

    @classmethod
    def check(cls, cfg: Scenario, check: Check) -> None:
        """Refuse what this policy's section or, when it is the scenario's policy, the scenario may not
        hold: `check(ok, key, value, expected)` raises on failure. Ranges are checked already."""

    def __init__(self, cfg: Scenario, ctx: RunContext):
        if self.needs_client_view and len(ctx.clients) != ctx.n_clients:
            raise ValueError(f"{self.name}: RunContext.clients must describe every client (links, compute, history)")
        self.cfg, self.ctx = cfg, ctx
        self.options = self.read_options(cfg)
        self.accountant = self.make_accountant()  # the runtime's only view of privacy

    @classmethod
    def read_options(cls, cfg: Scenario) -> Any:
        """This policy's options: a built-in's section of the scenario (cfg.<name>), a user policy's
        (policy=module:Class) `policy_args` as its Options (Any: whichever the policy's is)."""
        if is_user_policy(cfg.policy):
            # policy_args is the server's scenario's (emulator.config, which imports this module), not
            # nodes.contracts.schema's
            args: dict[str, Any] = getattr(cfg, "policy_args", {})
            return parse_options(cls.Options, args)
        return getattr(cfg, cls.name, None)

    def make_accountant(self) -> Accountant:
        """The mechanism the policy's tasks use: sample-level DP-SGD unless a policy says otherwise."""
        return RdpAccountant(self.cfg.dp, self.ctx.n_clients)

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        """The round's tasks, for distinct clients among `eligible` (in id order); what the runtime
        checks of this and every other method is emulator.policies.boundary's."""
        raise NotImplementedError

    def observe_outcomes(self, rnd: int, outcomes: Mapping[int, ClientOutcome]) -> dict[str, Any]:
        """Every selected client's outcome this round (arrived, late, lost_down, lost_up, failed,
        implausible, with its virtual times), before aggregation; returns what to add to the round's
        recorded state. Past rounds' are in `ctx.clients[i].history`."""
        return {}

    def aggregate(
        self, rnd: int, global_weights: dict[str, np.ndarray], results: list[ClientResult], factors: dict[int, float]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The new global model and what to add to the round's recorded state. Here weighted FedAvg:
        w = sum_i p_i w_i over the on-time results (factors sum to 1)."""
        return fedavg(global_weights, results, factors), {}

    def observe(self, rnd: int, test_loss: float, test_accuracy: float) -> dict[str, Any]:
        """The server's evaluation after aggregation, for adaptive policies to react to; returns
        what to add to the round's recorded state. Called every round, before the next is planned,
        only for a policy that overrides it (`reads_evaluation`)."""
        return {}

    @classmethod
    def reads_evaluation(cls) -> bool:
        """Whether the policy's later rounds depend on the server's evaluation, i.e. it overrides
        observe(): then every round is evaluated before the next is planned (eval.every = 1, no
        overlap). Read from the class, so that no policy can forget to say so."""
        return cls.observe is not Policy.observe

    def state_dict(self) -> dict[str, Any]:
        """JSON-able snapshot of the policy and its privacy accountant after a completed round."""
        return {"policy": {k: getattr(self, k) for k in self.state_keys}, "accountant": self.accountant.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = set(self.state_keys)
        if set(state["policy"]) != mine:
            raise ValueError(f"{self.name}: checkpoint holds {sorted(state['policy'])}, the policy has {sorted(mine)}")
        for k in self.state_keys:
            setattr(self, k, state["policy"][k])
        self.accountant.load_state_dict(state["accountant"])

    def should_stop(self) -> str:
        """Why the run must end before the next round ('' to go on), for policies with their own horizon."""
        return ""


def fedavg(
    global_weights: dict[str, np.ndarray], results: Sequence[ClientResult], factors: dict[int, float]
) -> dict[str, np.ndarray]:
    """Weighted FedAvg: w = sum_i p_i w_i over the on-time results (factors sum to 1)."""
    if not results:
        return global_weights
    # sum() starts from 0 but, over at least one result, ends an array
    return {
        name: cast(np.ndarray, sum(factors[r.client] * r.weights[name].astype(np.float64) for r in results)).astype(
            w.dtype
        )
        for name, w in global_weights.items()
    }

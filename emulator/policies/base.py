"""The policy contract (Flower's Strategy, narrowed): configure a round, then aggregate it.

The runtime knows nothing about any one paper: it asks the policy for a `RoundPlan`, reports
every selected client's outcome (`observe_outcomes`, Flower's `failures` and more), delivers the
`ClientResult`s that arrived on time (`aggregate`) and reports the evaluation back (`observe`).
A policy is one module: its options (`Options`, checked by `check`), its accountant, its round.
What it may know of the system (data sizes, links, compute, past outcomes) is `RunContext`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from emulator.policies.accounting import Accountant, RdpAccountant
from emulator.policies.system import ClientInfo, ClientOutcome
from nodes.contracts.rng import stream
from nodes.contracts.schema import Check, DPConfig, Selection
from nodes.contracts.tasks import ClientResult, ClientTask


@dataclass(frozen=True)
class RoundPlan:
    """One round as `Policy.configure_round` plans it.

    Attributes:
        tasks: One task per selected client: distinct clients among those offered, in any order (the runtime
            sorts them by id).
        state: Policy state recorded in `rounds` once the round is over, with what aggregate() and observe()
            add to it (e.g. mu estimated from the round's updates): plain JSON values (numbers, None,
            per-client dicts).
        empty_round: Play the round even without tasks: a Poisson draw of no client still releases an
            aggregate (its noise alone).
    """

    tasks: tuple[ClientTask, ...]
    state: dict[str, Any] = field(default_factory=dict)
    empty_round: bool = False


@dataclass(frozen=True)
class RunSettings:
    """The run's settings that a policy may read besides its own options: `ctx.settings`.

    The run's assembler takes them from the scenario (emulator.config.policy_settings); a policy sees no
    other section.

    Attributes:
        seed: The run's seed, from which every random stream derives (nodes.contracts.rng.stream).
        dp: The dp section: the DP-SGD round a task takes (`ClientTask.dp_sgd`), epsilon's target and delta.
        n_clients: clients.n.
        select: clients.select: all | uniform | round_robin.
        per_round: clients.per_round (0: every eligible client).
        deadline_s: round.deadline_s (inf: none).
        rounds: budget.rounds as set (the derived R_s is RunContext.rounds_budget).
        server_up_bps: links.server_up_bps, the server's shared uplink (0: none).
        sampling_caveat: Why the run breaks what amplification by sampling assumes, that the server's draw
            alone decides whose update is aggregated ('' when it does not).
    """

    seed: int = 0
    dp: DPConfig = field(default_factory=DPConfig)
    n_clients: int = 1
    select: str = Selection.ALL
    per_round: int = 0
    deadline_s: float = math.inf
    rounds: int = 0
    server_up_bps: float = 0.0
    sampling_caveat: str = ""


@dataclass
class RunContext:
    """What a policy may know about the run when it is built: its `self.ctx`.

    Attributes:
        n_clients: N, the number of clients.
        data_sizes: |D_i|, each client's number of training samples, by client id.
        num_params: The number of the model's parameters.
        rounds_budget: R_s as derived from the round, byte and time budgets.
        task_bytes: The size of one task message (the global model and its parameters).
        update_bytes: The size of one update as the links carry it: a compressed update's size, else (0)
            task_bytes.
        clients: Per client (`ClientInfo`): its resources as drawn for the run and its outcome history.
        now: The virtual time; while configure_round runs, the round's start.
        mode: round.mode: sync | buffered | async (docs/async.md).
        slots: Buffered and async modes: how many clients configure_round is to select now (the free
            slots); 0 in sync mode, where clients.per_round says.
        settings: The scenario's settings a policy may read besides its options (`RunSettings`).
    """

    n_clients: int
    data_sizes: list[int]
    num_params: int
    rounds_budget: int
    task_bytes: int = 0
    update_bytes: int = 0
    clients: Sequence[ClientInfo] = ()
    now: Callable[[], float] = lambda: 0.0
    mode: str = "sync"
    slots: Callable[[], int] = lambda: 0
    settings: RunSettings = field(default_factory=RunSettings)

    def __post_init__(self) -> None:
        """Take task_bytes for an update_bytes of 0."""
        self.update_bytes = self.update_bytes or self.task_bytes


def select_clients(settings: RunSettings, rnd: int, eligible: Sequence[int], how: str = "", k: int = 0) -> list[int]:
    """Select clients: all, K-of-N uniform (per-round stream), or round-robin over client ids.

    Args:
        settings: The run's: its clients.select and clients.per_round, and its seed.
        rnd: The round (in buffered and async modes, the dispatch).
        eligible: The clients to select from, in id order.
        how: Overrides clients.select for policies whose paper fixes the rule.
        k: > 0 overrides clients.per_round (buffered mode's free slots).

    Returns:
        The selected client ids, sorted: every one of `eligible` when k covers them all.
    """
    how = how or settings.select
    k = k or settings.per_round or len(eligible)
    if how == Selection.ALL or k >= len(eligible):
        return sorted(eligible)
    if how == Selection.UNIFORM:
        pick = stream(settings.seed, "select", rnd).choice(len(eligible), size=k, replace=False)
        return sorted(eligible[i] for i in pick)
    start = (rnd * k) % len(eligible)  # round_robin
    return sorted(eligible[(start + j) % len(eligible)] for j in range(k))


def dp_sgd_tasks(dp: DPConfig, clients: Sequence[int]) -> tuple[ClientTask, ...]:
    """Return the scenario's DP-SGD round (dp.tau steps at dp.lr, dp.sigma, dp.clip, dp.q) for each client.

    Args:
        dp: The dp section the tasks take: `self.ctx.settings.dp` in a policy. (The whole scenario, which
            the deprecated `self.cfg` gives, is read for its dp section.)
        clients: The selected clients.

    Returns:
        One `ClientTask.dp_sgd` task per client, by id.
    """
    dp = getattr(dp, "dp", dp)  # self.cfg's scenario, until the deprecated Policy.cfg is removed
    return tuple(ClientTask.dp_sgd(i, dp) for i in sorted(clients))


class Policy:
    """The base class of every policy, built-in or a user's (`policy=package.module:ClassName`).

    The server builds one for the run. Before each round it asks should_stop; in the round it calls
    configure_round, observe_outcomes, aggregate (not in buffered and async modes), then observe (only a
    policy that overrides it); state_dict after a completed round is its part of the checkpoint. A subclass
    writes configure_round and overrides the others it needs.

    Args:
        options: Its options: a built-in's section of the scenario (cfg.<name>), a user policy's `policy_args`
            as its Options; None for a policy without options.
        ctx: What the policy may know about the run, its settings (`ctx.settings`) included.

    Raises:
        ValueError: The policy needs_client_view and ctx.clients does not describe every client.

    Attributes:
        name: The policy's name (a built-in's section of the scenario is named after it).
        Options: The dataclass of its options: a built-in's scenario section (that section's line in --help is
            `options_help`); a user policy's `policy_args`.
        options_help: A built-in's section's line in --help.
        options: Its options, as given: a policy with Options declares it as that class.
        state_keys: What the policy learns as it runs (plain numbers, lists, None): its part of a checkpoint.
        needs_client_view: Whether it selects from the per-client view (links, compute, history): the runtime
            must describe every client.
        partial_work: Whether round.partial_work applies: its tasks are DP-SGD steps, each charged alone, and
            it aggregates by FedAvg (what FedNova's normalisation feeds); an output-noise or update-clipping
            mechanism is not.
        buffered: Whether round.mode=buffered|async applies (emulator.run.buffered): configure_round selects
            ctx.slots() clients from those offered, and the runtime aggregates by the staleness rule, not by
            `aggregate`.
        changes_sigma: Whether configure_round may give a round's DP-SGD tasks a sigma (or q) of their own: each
            is then a distinct run in its clients' ledgers, which dp.accountant = prv | pld compose one by one, so
            that a run may hold up to budget.rounds of them (refused at start past what each composes in bounded
            time; emulator.privacy.numerical).
        ctx: The `RunContext`.
        accountant: make_accountant's: the runtime's only view of privacy.
    """

    name = "base"
    Options: type | None = None
    options_help = ""
    options: Any
    state_keys: tuple[str, ...] = ()
    needs_client_view = False
    partial_work = False
    buffered = False
    changes_sigma = False
    scenario: Any = None  # the whole scenario, for the deprecated `cfg` only (emulator.policies.boundary.build)

    @classmethod
    def check(cls, options: Any, settings: RunSettings, check: Check) -> None:
        """Refuse what this policy's options or the run's settings may not hold for it.

        Called as the scenario is loaded, before there is an instance. Ranges are checked already.

        Args:
            options: Its options, as the instance will be given them.
            settings: The run's settings, as `ctx.settings` will hold them.
            check: `check(ok, key, value, expected)` raises on failure: the one line `key = value: expected
                ...`.

        Raises:
            ConfigError: Through `check`, for what the policy refuses (exit 2).
        """

    def __init__(self, options: Any, ctx: RunContext):
        """Keep the options and the context and make the accountant."""
        if self.needs_client_view and len(ctx.clients) != ctx.n_clients:
            raise ValueError(f"{self.name}: RunContext.clients must describe every client (links, compute, history)")
        self.options, self.ctx = options, ctx
        self.accountant = self.make_accountant()  # the runtime's only view of privacy

    @property
    def cfg(self) -> Any:
        """The whole scenario: deprecated, read `self.options` and `self.ctx.settings` instead (said once)."""
        if not self.__dict__.get("told_cfg_deprecated"):
            self.told_cfg_deprecated = True
            warnings.warn(
                f"policy {type(self).__module__}:{type(self).__qualname__}: self.cfg is deprecated and will be "
                "removed; read self.options and self.ctx.settings (docs/policies.md)",
                FutureWarning,
                stacklevel=2,
            )
        if self.scenario is None:
            raise AttributeError(f"policy {self.name} was built without a scenario: read self.ctx.settings")
        return self.scenario

    def make_accountant(self) -> Accountant:
        """Return the accountant of the mechanism the policy's tasks use.

        Sample-level DP-SGD unless a policy says otherwise.

        Returns:
            The accountant that says what each client has spent and which clients may still be selected.
        """
        return RdpAccountant(self.ctx.settings.dp, self.ctx.n_clients)

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        """Plan one round: the tasks, for distinct clients among `eligible`.

        Called at the round's start (ctx.now()); in buffered and async modes at each dispatch, for at most
        ctx.slots() clients. A task the accountant does not allow is dropped. What the runtime checks of this
        and every other method is emulator.policies.boundary's.

        Args:
            rnd: The round (in buffered and async modes, the dispatch number).
            eligible: The clients the accountant still admits and the clock offers (those available, under
                availability.on_unavailable=exclude), in id order.

        Returns:
            The round's plan: its tasks and its state.

        Raises:
            NotImplementedError: The policy does not define it.
        """
        raise NotImplementedError

    def observe_outcomes(self, rnd: int, outcomes: Mapping[int, ClientOutcome]) -> dict[str, Any]:
        """Observe every selected client's outcome this round, before aggregation.

        Past rounds' are in `ctx.clients[i].history`.

        Args:
            rnd: The round.
            outcomes: By client id, every selected client's outcome (arrived, late, lost_down, lost_up, failed,
                implausible, with its virtual times).

        Returns:
            What to add to the round's recorded state.
        """
        return {}

    def aggregate(
        self, rnd: int, global_weights: dict[str, np.ndarray], results: list[ClientResult], factors: dict[int, float]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Aggregate the on-time results into the new global model.

        Here weighted FedAvg: w = sum_i p_i w_i over the on-time results (factors sum to 1).

        Args:
            rnd: The round.
            global_weights: The round's global model w, by tensor name.
            results: The `ClientResult`s that arrived on time.
            factors: By client id, the impact factor p_i of each of `results`, renormalised over them.

        Returns:
            The new global model (the tensors of `global_weights`, as they were shaped) and what to add to the
            round's recorded state.
        """
        return fedavg(global_weights, results, factors), {}

    def observe(self, rnd: int, test_loss: float, test_accuracy: float) -> dict[str, Any]:
        """Observe the server's evaluation after aggregation, for adaptive policies to react to.

        Called every round, before the next is planned, only for a policy that overrides it
        (`reads_evaluation`).

        Args:
            rnd: The round.
            test_loss: The new global model's mean test loss.
            test_accuracy: Its test accuracy.

        Returns:
            What to add to the round's recorded state.
        """
        return {}

    @classmethod
    def clients_asked(cls, options: Any, n_clients: int) -> int:
        """Return the most clients a round asks for their state (`ctx.clients[i]`) besides those it trains.

        The memory guard counts each as a client the server makes (emulator.run.guards.clients_made).

        Args:
            options: The policy's options, as its constructor is given them.
            n_clients: clients.n.

        Returns:
            The count: 0 unless the policy looks at clients it may not select.
        """
        return 0

    @classmethod
    def reads_evaluation(cls) -> bool:
        """Return whether the policy's later rounds depend on the server's evaluation.

        They do when it overrides observe(): then every round is evaluated before the next is planned
        (eval.every = 1, no overlap). Read from the class, so that no policy can forget to say so.

        Returns:
            Whether the class overrides observe().
        """
        return cls.observe is not Policy.observe

    def state_dict(self) -> dict[str, Any]:
        """Return a JSON-able snapshot of the policy and its privacy accountant after a completed round.

        Returns:
            {"policy": the state_keys attributes, by name, "accountant": the accountant's state_dict()}.
        """
        return {"policy": {k: getattr(self, k) for k in self.state_keys}, "accountant": self.accountant.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot that state_dict took: a resumed run's checkpoint.

        Args:
            state: A state_dict() of this policy.

        Raises:
            ValueError: The checkpoint's policy state holds other keys than state_keys.
        """
        mine = set(self.state_keys)
        if set(state["policy"]) != mine:
            raise ValueError(f"{self.name}: checkpoint holds {sorted(state['policy'])}, the policy has {sorted(mine)}")
        for k in self.state_keys:
            setattr(self, k, state["policy"][k])
        self.accountant.load_state_dict(state["accountant"])

    def should_stop(self) -> str:
        """Return why the run must end before the next round, for policies with their own horizon.

        Returns:
            The reason, or '' to go on.
        """
        return ""


def fedavg(
    global_weights: dict[str, np.ndarray], results: Sequence[ClientResult], factors: dict[int, float]
) -> dict[str, np.ndarray]:
    """Average the results by their factors, weighted FedAvg: w = sum_i p_i w_i (factors sum to 1).

    Args:
        global_weights: The round's global model, by tensor name.
        results: The on-time results.
        factors: By client id, the impact factor p_i of each of `results`.

    Returns:
        The new global model, each tensor in its global dtype; `global_weights` itself without results.
    """
    if not results:
        return global_weights
    # sum() starts from 0 but, over at least one result, ends an array
    return {
        name: cast(np.ndarray, sum(factors[r.client] * r.weights[name].astype(np.float64) for r in results)).astype(
            w.dtype
        )
        for name, w in global_weights.items()
    }

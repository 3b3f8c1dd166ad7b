"""The Policy contract, checked where the runtime calls a policy: `CheckedPolicy` holds the run's policy
(built by `build`) and checks what each call returns; a user policy's exception, or any policy's answer
that breaks the contract, is one `PolicyError` naming the policy, the method and what went wrong.

The checks cost O(selected) a round: a plan's tasks, its state and what the other calls add to it, the
model's tensor names and shapes (not their values). The checkpoint's policy state, which may grow with
the clients, is checked as it is encoded (`not_json`), not encoded twice.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from functools import partial
from itertools import pairwise
from operator import attrgetter, is_
from typing import Any, TypeVar

import numpy as np

from emulator.policies.base import Policy, RoundPlan, RunContext
from emulator.policies.options import is_user_policy
from emulator.policies.system import ClientOutcome
from nodes.contracts.schema import MAX_STEPS
from nodes.contracts.tasks import ClientResult, ClientTask

T = TypeVar("T")
SHOWN = 80  # characters of a returned value echoed in an error
MESSAGE = 300  # characters of an exception's message
MAX_DEPTH = 100  # of a state searched for what is not JSON
OUTPUT_NOISE = ("none", "gaussian", "laplace")  # nodes.training.trainer's (which imports torch: not here)
_TASK_FIELDS = tuple((f.name, str(f.type)) for f in fields(ClientTask))  # annotations are strings (__future__)
_OTHER_FIELDS = attrgetter(*(name for name, _ in _TASK_FIELDS if name != "client"))  # a task's but its client


class PolicyError(RuntimeError):
    """A policy raised, or broke its contract: the run fails; the message is one line naming the policy
    and the method, and the traceback (its __cause__'s, for an exception) is the run's error.log."""


def build(cls: type[Policy], ref: str, options: Any, ctx: RunContext, scenario: Any = None) -> CheckedPolicy:
    """The policy `cls` (the scenario's `policy=ref`) built with its options on `ctx`, held at the boundary.

    `scenario`, the whole scenario, serves only the deprecated `Policy.cfg`, during __init__ too."""

    def new() -> Policy:
        policy = cls.__new__(cls)
        policy.scenario = scenario
        policy.__init__(options, ctx)  # type: ignore[misc]  # built in two steps for `scenario`
        return policy

    return CheckedPolicy(_call(ref, is_user_policy(ref), "__init__", new), ref)


def _call(ref: str, user: bool, method: str, call: Callable[[], T]) -> T:
    """`call()`; a user policy's exception becomes a PolicyError. A built-in's propagates as it is: the
    emulator's own error (a one-line refusal the CLI knows, or a bug with its traceback)."""
    try:
        return call()
    except Exception as e:
        if not user:
            raise
        text = " ".join(str(e).split())
        said = f": {_clip(text, MESSAGE)}" if text else ""
        raise PolicyError(f"policy {ref}.{method} raised {type(e).__name__}{said}") from e


class CheckedPolicy(Policy):
    """The run's policy, each call checked (see the module's docstring). Its attributes are the policy's:
    what the runtime reads (ctx, accountant, options) is looked up on the policy held, `inner`."""

    def __init__(self, inner: Policy, ref: str) -> None:  # not Policy's: `inner` is built
        self.inner, self.ref, self.user = inner, ref, is_user_policy(ref)
        # class attributes that Policy's defaults would otherwise answer for the policy's own
        self.name, self.state_keys = inner.name, inner.state_keys
        self.needs_client_view, self.partial_work, self.buffered = (
            inner.needs_client_view,
            inner.partial_work,
            inner.buffered,
        )

    def __getattr__(self, name: str) -> Any:  # only for what this object lacks: the policy's own attributes
        if name == "inner":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def reads_evaluation(self) -> bool:  # type: ignore[override]  # the policy's class decides, not this one's
        return self.inner.reads_evaluation()

    # --- the calls, each checked -----------------------------------------------------------------

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        plan = self._call("configure_round", lambda: self.inner.configure_round(rnd, eligible))
        return self._plan(plan, eligible)

    def observe_outcomes(self, rnd: int, outcomes: Mapping[int, ClientOutcome]) -> dict[str, Any]:
        seen = self._call("observe_outcomes", lambda: self.inner.observe_outcomes(rnd, outcomes))
        return self._state("observe_outcomes", seen)

    def aggregate(
        self, rnd: int, global_weights: dict[str, np.ndarray], results: list[ClientResult], factors: dict[int, float]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        out = self._call("aggregate", lambda: self.inner.aggregate(rnd, global_weights, results, factors))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise self._broken("aggregate", f"returned {_shown(out)}: expected (weights, state)")
        weights, state = out
        problem = _model_problem(weights, global_weights)
        if problem:
            raise self._broken("aggregate", f"returned weights that {problem}")
        return weights, self._state("aggregate", state)

    def observe(self, rnd: int, test_loss: float, test_accuracy: float) -> dict[str, Any]:
        observed = self._call("observe", lambda: self.inner.observe(rnd, test_loss, test_accuracy))
        return self._state("observe", observed)

    def state_dict(self) -> dict[str, Any]:
        state = self._call("state_dict", self.inner.state_dict)
        if not isinstance(state, dict):
            raise self._broken("state_dict", f"returned {_shown(state)}: expected a dict")
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._call("load_state_dict", lambda: self.inner.load_state_dict(state))

    def should_stop(self) -> str:
        why = self._call("should_stop", self.inner.should_stop)
        if not isinstance(why, str):
            raise self._broken("should_stop", f"returned {_shown(why)}: expected a str ('' to go on)")
        return why

    # --- the checks ------------------------------------------------------------------------------

    def _call(self, method: str, call: Callable[[], T]) -> T:
        return _call(self.ref, self.user, method, call)

    def _broken(self, method: str, what: str) -> PolicyError:
        return PolicyError(f"policy {self.ref}.{method} {what}")

    def _plan(self, plan: object, offered: Sequence[int]) -> RoundPlan:
        """`plan` if it keeps the contract, its tasks sorted by client id if they were not."""
        if not isinstance(plan, RoundPlan):
            raise self._broken("configure_round", f"returned {_shown(plan)}: expected a RoundPlan")
        tasks = plan.tasks
        if not isinstance(tasks, (tuple, list)):
            raise self._broken("configure_round", f"returned tasks {_shown(tasks)}: expected a tuple of ClientTask")
        checked = self._tasks(tasks)
        clients = [t.client for t in checked]
        # a range's or an id set's own `in` is O(1); a list's is a scan, so it is bisected (in id order)
        own = type(offered).__contains__ not in (list.__contains__, tuple.__contains__, Sequence.__contains__)
        among = offered.__contains__ if own else partial(_among, offered=offered)
        if any(a >= b for a, b in pairwise(clients)):
            checked.sort(key=lambda t: t.client)
            clients.sort()
            twice = next((a for a, b in pairwise(clients) if a == b), None)
            if twice is not None:
                raise self._broken("configure_round", f"selected client {twice} twice: expected distinct clients")
        missing = next((c for c in clients if not among(c)), None)
        if missing is not None:
            raise self._broken(
                "configure_round",
                f"selected client {missing}, which was not offered (expected one of the {len(offered)} eligible "
                f"clients in `eligible`)",
            )
        slots = self.ctx.slots()
        if slots and len(clients) > slots:
            raise self._broken("configure_round", f"selected {len(clients)} clients for {slots} free slots")
        if not isinstance(plan.empty_round, bool):
            raise self._broken("configure_round", f"returned empty_round = {_shown(plan.empty_round)}: expected a bool")
        self._state("configure_round", plan.state, "RoundPlan.state")
        if all(a is b for a, b in zip(checked, tasks)) and isinstance(tasks, tuple):
            return plan
        return replace(plan, tasks=tuple(checked))

    def _tasks(self, tasks: Sequence[object]) -> list[ClientTask]:
        """A plan's tasks, checked (`_task`). Tasks that differ only in their client (a plan's usual) hold the
        same field objects: a task whose other fields are the last plain task's own objects is not checked again."""
        checked: list[ClientTask] = []
        last: tuple[object, ...] = ()  # the other fields of the last task found plain
        for i, t in enumerate(tasks):
            if type(t) is ClientTask and type(t.client) is int and t.client >= 0:
                others = _OTHER_FIELDS(t)
                if last and all(map(is_, others, last)):
                    checked.append(t)
                    continue
                ok = self._task(i, t)
                if ok is t:
                    last = others
            else:
                ok = self._task(i, t)
            checked.append(ok)
        return checked

    def _task(self, i: int, t: object) -> ClientTask:
        """Task `i` of a plan if its fields are of their types and ranges (numpy numbers made Python's)."""
        if not isinstance(t, ClientTask):
            raise self._broken("configure_round", f"returned tasks[{i}] = {_shown(t)}: expected a ClientTask")
        changed: dict[str, Any] = {}
        for name, kind in _TASK_FIELDS:
            v = getattr(t, name)
            ok, plain = _field(name, kind, v)
            if not ok:
                raise self._broken(
                    "configure_round", f"returned tasks[{i}] with {name} = {_shown(v)}: expected {_EXPECTED[name]}"
                )
            if plain is not v:
                changed[name] = plain
        return replace(t, **changed) if changed else t

    def _state(self, method: str, state: object, what: str = "") -> dict[str, Any]:
        """`state`, which joins rounds.policy_state, if it is a dict of JSON values."""
        what = what or "a state"
        if not isinstance(state, dict):
            raise self._broken(method, f"returned {what} {_shown(state)}: expected a dict")
        try:
            json.dumps(state, sort_keys=True)  # as the rounds table encodes it
        except (TypeError, ValueError) as e:
            where = _not_json(state) or _clip(str(e), SHOWN)
            raise self._broken(method, f"returned {what} that is not JSON: {where}") from None
        return state


def not_json(policy: Policy, state: object, e: Exception) -> PolicyError:
    """The PolicyError for a state_dict() that the checkpoint could not encode (`e`, json's error)."""
    ref = policy.ref if isinstance(policy, CheckedPolicy) else policy.name
    where = _not_json(state) or _clip(str(e), SHOWN)
    return PolicyError(f"policy {ref}.state_dict returned a state that is not JSON: {where}")


def _not_json(value: object, path: str = "", depth: int = 0) -> str:
    """Where in `value` the first thing JSON cannot hold is, and what it is."""
    where = path or "the state"
    if depth > MAX_DEPTH:
        return f"{_clip(where, SHOWN)} nests deeper than {MAX_DEPTH} levels (a container that holds itself?)"
    if isinstance(value, dict):
        kinds = {type(k) for k in value}
        for k in value:
            if not isinstance(k, (str, int, float, bool, type(None))):
                return f"{where} has the key {_shown(k)}: expected text or numbers"
        if len(kinds) > 1 and str in kinds:
            return f"{where} mixes text and number keys, which cannot be sorted"
        for k, v in value.items():
            problem = _not_json(v, f"{path}.{k}" if path else str(k), depth + 1)
            if problem:
                return problem
        return ""
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            problem = _not_json(v, f"{path}[{i}]", depth + 1)
            if problem:
                return problem
        return ""
    if isinstance(value, (str, int, float, bool, type(None))):
        return ""
    return f"{_clip(where, SHOWN)} = {_shown(value)}"


def _field(name: str, kind: str, v: object) -> tuple[bool, Any]:
    """Whether a task's field `v` is of its `kind` and range, and its plain Python value."""
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            return False, v
        count = int(v)
        return count >= 0 and (name != "steps" or count <= MAX_STEPS), count
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            return False, v
        x = v if type(v) in (int, float) else float(v)  # an int stays one: it is on the wire as it is
        return bool(math.isfinite(x) and x >= 0 and (name != "q" or x <= 1)), x
    if kind == "bool":
        if not isinstance(v, (bool, np.bool_)):
            return False, v
        return True, v if type(v) is bool else bool(v)
    return v in OUTPUT_NOISE if name == "output_noise" else isinstance(v, str), v


_EXPECTED = {
    name: {
        "int": f"an int in [0, {MAX_STEPS}]" if name == "steps" else "an int >= 0",
        "float": "a number in [0, 1]" if name == "q" else "a finite number >= 0",
        "bool": "a bool",
        "str": " | ".join(OUTPUT_NOISE) if name == "output_noise" else "a str",
    }[kind]
    for name, kind in _TASK_FIELDS
}
_EXPECTED["client"] = "a client id (an int)"


def _among(c: int, *, offered: Sequence[int]) -> bool:
    """Whether `offered` (in id order, as Accountant.eligible_clients gives them) holds client `c`: by
    bisection, O(log n) on a sequence of any size; a linear look only where that finds nothing."""
    i = bisect.bisect_left(offered, c)
    return (i < len(offered) and offered[i] == c) or c in offered


def _model_problem(weights: object, model: Mapping[str, np.ndarray]) -> str:
    """'' if `weights` has the model's tensor names, shapes and dtypes, else how it differs."""
    if not isinstance(weights, Mapping):
        return f"are {_shown(weights)}: expected a dict of the model's tensors"
    if weights.keys() != model.keys():
        extra, lacking = sorted(map(str, weights.keys() - model.keys())), sorted(model.keys() - weights.keys())
        parts = [f"lack {', '.join(lacking)}" if lacking else "", f"add {', '.join(extra)}" if extra else ""]
        return _clip(" and ".join(p for p in parts if p), SHOWN) + " (expected the model's tensors)"
    for name, w in model.items():
        v = weights[name]
        if not isinstance(v, np.ndarray):
            return f"hold {_clip(name, SHOWN)} = {_shown(v)}: expected an array"
        if v.shape != w.shape or v.dtype != w.dtype:
            return f"hold {_clip(name, SHOWN)} as {v.dtype}{list(v.shape)}: expected {w.dtype}{list(w.shape)}"
    return ""


def _shown(v: object) -> str:
    """A returned value as an error echoes it: its type and, cut, its repr."""
    if v is None:
        return "None"
    kind = type(v).__name__
    return f"{_clip(repr(v), SHOWN)} ({'an' if kind[0] in 'aeiou' else 'a'} {kind})"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"

"""emulator.run.evaluation: which rounds are evaluated, evaluations overlapped or not, and each round's hooks in
order once its evaluation is in."""

from __future__ import annotations

import math
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from emulator.config import ConfigError, load
from emulator.hooks import RoundHook
from emulator.policies import POLICIES, Policy
from emulator.rounds.round import RoundRecord
from emulator.run.evaluation import PENDING, PENDING_BYTES, EvaluationSchedule, Evaluator
from nodes.transport.dispatch import Reply


def record(rnd: int, value: float = 0.0, checkpoint: str = "{}", replies: dict | None = None) -> RoundRecord:
    """A played round as the evaluator sees it: its number, its model, its checkpoint state, its replies (none by
    default), no evaluation yet."""
    blank = dict.fromkeys(
        [
            "plan",
            "tasks",
            "timeline",
            "outcomes",
            "planned",
            "factors",
            "policy_state",
            "epsilon",
            "max_epsilon",
        ]
    )
    return RoundRecord(
        rnd=rnd,
        weights={"w": np.full(3, value, np.float32)},
        test_loss=math.nan,
        test_accuracy=math.nan,
        epsilon_spent={},
        wall_s=0.0,
        checkpoint=checkpoint,
        replies=replies or {},
        **blank,
    )


class Outputs(RoundHook):
    """A hook the evaluator runs: (round, test accuracy, weights, checkpoint state) in call order."""

    def __init__(self):
        self.done: list[tuple[int, float, float, str]] = []

    def after_round(self, rec: RoundRecord) -> None:
        self.done.append((rec.rnd, rec.test_accuracy, float(rec.weights["w"][0]), rec.checkpoint))


def on_a_thread(evaluate):
    """An evaluation of (round, weights) started as the evaluator process's is: a Future, answered
    elsewhere; `evaluate` reads the weights."""
    thread = ThreadPoolExecutor(1)
    return lambda rnd, weights: thread.submit(evaluate, weights)


def mean_weight(weights) -> tuple[float, float]:
    return 1.0, float(weights["w"].mean())


def held_until(release: threading.Event):
    """mean_weight once `release` is set: an evaluator still at work."""

    def slow(weights) -> tuple[float, float]:
        release.wait(10)
        return mean_weight(weights)

    return slow


def test_overlapped_a_rounds_outputs_wait_for_the_next_round_and_run_in_round_order():
    out = Outputs()
    ev = Evaluator(on_a_thread(mean_weight), overlap=True, hooks=[out])
    ev.round_played(record(0, 1.0, checkpoint='{"next_round": 1}'), evaluate=True)
    assert out.done == []  # evaluating while round 1 trains
    ev.flush()  # what round 1's training does meanwhile (RoundLoop)
    assert out.done == [(0, 1.0, 1.0, '{"next_round": 1}')]
    ev.round_played(record(1, 2.0, checkpoint='{"next_round": 2}'), evaluate=False)
    assert len(out.done) == 1  # not evaluated (NaN), but its rows wait for round 2's training all the same
    ev.round_played(record(2, 3.0, checkpoint='{"next_round": 3}'), evaluate=True)  # round 2 had no tasks
    assert [(d[0], d[2]) for d in out.done] == [(0, 1.0), (1, 2.0)] and math.isnan(out.done[1][1])
    ev.flush()
    assert out.done[2] == (2, 3.0, 3.0, '{"next_round": 3}')


def test_a_round_is_output_while_the_next_trains_only_once_its_evaluation_is_in():
    release, out = threading.Event(), Outputs()
    slow = held_until(release)
    ev = Evaluator(on_a_thread(slow), overlap=True, hooks=[out])
    assert ev.flush_if_evaluated()  # nothing pending
    ev.round_played(record(0, 1.0, checkpoint="{}"), evaluate=True)
    assert not ev.flush_if_evaluated() and out.done == []  # it does not wait
    release.set()
    while not ev.flush_if_evaluated():
        time.sleep(0.01)
    assert out.done == [(0, 1.0, 1.0, "{}")]
    ev.round_played(record(1, 2.0, checkpoint="{}"), evaluate=False)  # nothing to wait for
    assert ev.flush_if_evaluated() and [d[0] for d in out.done] == [0, 1]


def test_rounds_holding_more_than_pending_bytes_wait_one_at_a_time():
    release, out = threading.Event(), Outputs()
    slow = held_until(release)
    big = {c: Reply(client=c, nbytes=PENDING_BYTES // 2) for c in range(2)}  # one round's updates: PENDING_BYTES
    ev = Evaluator(on_a_thread(slow), overlap=True, hooks=[out])
    ev.round_played(record(0, checkpoint="{}", replies=big), evaluate=True)
    assert out.done == []  # alone, a round waits whatever it holds
    threading.Timer(0.2, release.set).start()
    ev.round_played(record(1, checkpoint="{}"), evaluate=True)  # two over PENDING_BYTES: the oldest is waited for
    assert [d[0] for d in out.done] == [0]
    ev.flush()
    assert [d[0] for d in out.done] == [0, 1]


def test_without_overlap_each_round_is_evaluated_and_output_before_the_next():
    out = Outputs()
    ev = Evaluator(on_a_thread(mean_weight), overlap=False, hooks=[out])
    ev.round_played(record(0, 1.0, checkpoint="{}"), evaluate=True)
    assert out.done == [(0, 1.0, 1.0, "{}")]


def test_the_evaluation_and_the_checkpoint_get_the_round_s_model_even_if_it_is_changed_in_place_later():
    started, release, seen = threading.Event(), threading.Event(), []

    def slow(weights):
        started.set()
        release.wait(10)
        seen.append(weights["w"].copy())
        return mean_weight(weights)

    out = Outputs()
    ev = Evaluator(on_a_thread(slow), overlap=True, hooks=[out])
    played = record(0, 1.0)
    ev.round_played(played, evaluate=True)
    started.wait(10)
    played.weights["w"][:] = 99.0  # what a next round's aggregate() may do to the arrays it is handed
    release.set()
    ev.flush()
    assert seen[0].tolist() == [1.0] * 3 and out.done == [(0, 1.0, 1.0, "{}")]


def test_an_error_in_the_evaluation_is_raised_once_where_its_round_is_output():
    def broken(weights):
        raise RuntimeError("evaluation broke")

    out = Outputs()
    ev = Evaluator(on_a_thread(broken), overlap=True, hooks=[out])
    ev.round_played(record(0, checkpoint="{}"), evaluate=True)
    with pytest.raises(RuntimeError, match="evaluation broke"):
        ev.flush()
    ev.flush()  # nothing pending: the run's way out adds nothing
    assert out.done == []


class FailsAtRound0(RoundHook):
    """A hook that refuses round 0 (InitialModelCheck's mismatch, a full disk under the rows)."""

    def after_round(self, rec: RoundRecord) -> None:
        if rec.rnd == 0:
            raise RuntimeError("round 0 refused")


@pytest.mark.parametrize("fails", ["hook", "evaluation"])
def test_after_a_round_that_fails_its_output_no_later_round_is_output(fails):
    """Round 1 played while round 0 was being evaluated: once round 0's output fails, the run's way
    out (flush) must not write round 1's rows after the missing round 0."""
    release, out = threading.Event(), Outputs()
    slow = held_until(release)

    def evaluate(weights):
        if fails == "evaluation" and float(weights["w"][0]) == 0.0:
            release.wait(10)
            raise RuntimeError("round 0's evaluation broke")
        return slow(weights)

    hooks = [FailsAtRound0(), out] if fails == "hook" else [out]
    ev = Evaluator(on_a_thread(evaluate), overlap=True, hooks=hooks)
    ev.round_played(record(0, 0.0, checkpoint="{}"), evaluate=True)
    ev.round_played(record(1, 1.0, checkpoint="{}"), evaluate=True)
    release.set()
    with pytest.raises(RuntimeError, match="round 0"):
        ev.flush()
    ev.flush()  # the run's way out
    assert out.done == []


def test_at_most_pending_rounds_wait_for_their_evaluations_and_are_output_in_order():
    release, out = threading.Event(), Outputs()
    slow = held_until(release)
    ev = Evaluator(on_a_thread(slow), overlap=True, hooks=[out])
    for rnd in range(PENDING):  # the evaluator still setting up: none is in, none is waited for
        ev.round_played(record(rnd, float(rnd), checkpoint="{}"), evaluate=rnd % 2 == 0)
    assert out.done == [] and not ev.flush_if_evaluated()
    threading.Timer(0.2, release.set).start()
    ev.round_played(record(PENDING, checkpoint="{}"), evaluate=False)  # one too many: the oldest is waited for
    assert [d[0] for d in out.done] == [0]
    ev.flush()
    assert [d[0] for d in out.done] == list(range(PENDING + 1))
    assert [math.isnan(d[1]) for d in out.done] == [rnd % 2 == 1 or rnd == PENDING for rnd in range(PENDING + 1)]


def test_an_interrupt_while_waiting_leaves_the_round_pending_for_the_way_out():
    release, out = threading.Event(), Outputs()
    slow = held_until(release)
    ev = Evaluator(on_a_thread(slow), overlap=True, hooks=[out])
    ev.round_played(record(0, 1.0, checkpoint="{}"), evaluate=True)
    main = threading.get_ident()
    # Python's own handler: a test process started as a background job of a non-interactive shell
    # (`make test &`) inherits SIGINT ignored, and the SIGINT would raise nothing (a CI run started so)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT)).start()  # Ctrl-C while the run waits
        with pytest.raises(KeyboardInterrupt):
            ev.flush()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert out.done == []
    release.set()
    ev.flush()
    assert out.done == [(0, 1.0, 1.0, "{}")]


# --- which policies read the evaluation, and eval.every -----------------------------------


def test_exactly_the_policies_that_override_observe_read_the_evaluation():
    assert {name for name, p in POLICIES.items() if p.reads_evaluation()} == {"adap_dpfl", "udp_crd"}

    class Mine(Policy):
        def observe(self, rnd, test_loss, test_accuracy):
            return {}

    class Heir(POLICIES["adap_dpfl"]):  # type: ignore[misc,valid-type]
        pass

    assert Mine.reads_evaluation() and Heir.reads_evaluation() and not Policy.reads_evaluation()


@pytest.mark.parametrize("policy", ["adap_dpfl", "udp_crd"])
def test_eval_every_above_1_is_refused_for_a_policy_that_reads_the_evaluation(policy):
    with pytest.raises(ConfigError) as e:
        load(None, [f"policy={policy}", "eval.every=3"])
    assert str(e.value) == (
        f"eval.every = 3: expected 1 with policy={policy}, which reads the server's evaluation of every round "
        "(it overrides observe)"
    )
    assert load(None, [f"policy={policy}", "eval.overlap=false"]).eval.every == 1


def test_eval_every_is_a_count_of_rounds():
    assert load(None, ["eval.every=7"]).eval.every == 7
    for bad in ("0", "-1", "1.5", "inf"):
        with pytest.raises(ConfigError, match=r"^eval\.every = "):
            load(None, [f"eval.every={bad}"])


def test_the_schedule_evaluates_every_kth_round_and_the_last_after_it_or_every_round_within_it():
    after = EvaluationSchedule(every=3, rounds=8, policy_reads=False)
    assert not after.within_rounds and [r for r in range(8) if after.after(r)] == [2, 5, 7]
    within = EvaluationSchedule(every=1, rounds=8, policy_reads=True)
    assert within.within_rounds and not any(within.after(r) for r in range(8))

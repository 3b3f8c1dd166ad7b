"""The server's evaluations of the global model, asked of its evaluator process (nodes/transport/evaluator.py):
which rounds are evaluated and when (`EvaluationSchedule`, the one place that decides it), and each
round's hooks (emulator.hooks) in round order once the round's evaluation is in.

A policy that does not read the evaluation (Policy.reads_evaluation) needs nothing of round r's
evaluation to plan round r+1, so with `eval.overlap` round r is evaluated while later rounds train
on the workers; and nothing of round r's hooks (its rows, its checkpoint) either, so with
`eval.overlap` they run while a later round trains too, as soon as round r's evaluation is in
(RoundLoop hands `flush_if_evaluated` to the workers' run as the server's work meanwhile), or when a
later round has been played; at most PENDING rounds wait so. The hooks see what they would have
seen in turn: the round's record, with the checkpoint state taken as the round ended and a copy of
its weights, in round order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace

from emulator.hooks import RoundHook
from emulator.rounds.round import RoundRecord
from nodes.contracts.tasks import Weights

# Starts the evaluation of round r's global model: (test loss, test accuracy) once done (EvaluatorProcess.evaluate).
Submit = Callable[[int, Weights], Future[tuple[float, float]]]
# With eval.overlap, how many played rounds may wait for their evaluations before the next waits for the oldest:
# the evaluator's set-up and the first evaluations overlap the first rounds, where a short run's start would wait
# on them (python -m bench --only w2). Each holds its record (its updates among them) and a copy of its model: past
# PENDING_BYTES of those, only one round waits, as before there was a queue.
PENDING = 4
PENDING_BYTES = 256 * 2**20


@dataclass(frozen=True)
class EvaluationSchedule:
    """Which rounds the server evaluates, and when: every round within the round for a policy that
    reads the evaluation (it observes it before the next round is planned), else every `every`-th
    round and the round budget's last, after the round (a stop found later is the run's to evaluate)."""

    every: int
    rounds: int  # the round budget
    policy_reads: bool

    @property
    def within_rounds(self) -> bool:
        return self.policy_reads

    def after(self, rnd: int) -> bool:
        return not self.policy_reads and ((rnd + 1) % self.every == 0 or rnd + 1 == self.rounds)


@dataclass(frozen=True)
class _Played:
    record: RoundRecord
    evaluation: Future[tuple[float, float]] | None  # None: a round left unevaluated (NaN)
    nbytes: int  # what it holds: its updates' messages and its model's copy


class Evaluator:
    """`round_played` hands each round in; its hooks run in round order once its evaluation is in.
    With overlap at most PENDING rounds wait for theirs; `flush` waits for every one."""

    def __init__(self, submit: Submit, overlap: bool, hooks: Sequence[RoundHook]) -> None:
        self._submit, self._overlap, self._hooks = submit, overlap, hooks
        self._pending: deque[_Played] = deque()

    def __call__(self, rnd: int, weights: Weights) -> tuple[float, float]:
        """Evaluate round `rnd`'s `weights` and wait: for a policy that reads the evaluation, and the last round."""
        return self._submit(rnd, weights).result()

    def round_played(self, record: RoundRecord, evaluate: bool) -> None:
        """Round `record` has been played (its checkpoint state taken). The rounds before whose
        evaluations are in have their hooks run now; this one's now without overlap, else once its
        evaluation (if `evaluate`) is in: while a later round trains, or when one has been played.
        With more than PENDING rounds waiting, or more than one holding over PENDING_BYTES, the oldest
        are waited for here."""
        self._output_evaluated()
        # A copy, for the evaluation and the checkpoint: the next round may hand these arrays back
        # changed (a policy's aggregate() may write into them), and the evaluation reads them meanwhile.
        record = replace(record, weights={k: v.copy() for k, v in record.weights.items()})
        evaluation = self._submit(record.rnd, record.weights) if evaluate else None
        held = sum(r.nbytes for r in record.replies.values()) + sum(w.nbytes for w in record.weights.values())
        self._pending.append(_Played(record, evaluation, held))
        if not self._overlap:
            self.flush()
        while len(self._pending) > PENDING or (
            len(self._pending) > 1 and sum(p.nbytes for p in self._pending) > PENDING_BYTES
        ):
            self._output_first()

    def flush_if_evaluated(self) -> bool:
        """The hooks of the waiting rounds whose evaluations are in, in order, without waiting; whether
        none is left waiting."""
        self._output_evaluated()
        return not self._pending

    def flush(self) -> None:
        """Wait for every waiting round's evaluation, and run its hooks, in round order."""
        while self._pending:
            self._output_first()

    def _output_evaluated(self) -> None:
        while self._pending and (self._pending[0].evaluation is None or self._pending[0].evaluation.done()):
            self._output_first()

    def _output_first(self) -> None:
        """Wait for the oldest waiting round's evaluation, then run its hooks. An error of the evaluation
        or of a hook is raised here, once, and the rounds after it are never output: their rows would
        stand after a round missing from the tables. An interrupt while waiting leaves the round
        waiting, to be flushed on the run's way out."""
        record, evaluation = self._pending[0].record, self._pending[0].evaluation
        if evaluation is not None:
            try:
                test_loss, test_accuracy = evaluation.result()
            except KeyboardInterrupt:
                raise
            except BaseException:
                self._pending.clear()
                raise
            record = replace(record, test_loss=test_loss, test_accuracy=test_accuracy)
        self._pending.popleft()
        try:
            for hook in self._hooks:
                hook.after_round(record)
        except BaseException:
            self._pending.clear()
            raise

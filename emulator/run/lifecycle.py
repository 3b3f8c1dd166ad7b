"""One run's lifecycle: start or resume, play rounds until a budget or the policy stops it, stop.

Workers train for real (every task is sent to a worker process over ZeroMQ), the clock decides
who made it in time; a round itself is `emulator.rounds.round.play_round`, the rounds
`emulator.run.round_loop.RoundLoop`'s. After each round its hooks (emulator.hooks: rows, checkpoint,
progress bar, and any of the user's) run once its evaluation is in (emulator.run.evaluation, which
decides which rounds are evaluated and when), after the style of pfl's `FederatedAlgorithm.run`;
run.json is written at the start and at the end.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import shutil
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from emulator.aggregate.compression import task_frame, update_bytes
from emulator.config import from_dict, policy_options, policy_settings, validate
from emulator.energy.model import Energy
from emulator.hooks import RoundHook, RunInfo, load_hook
from emulator.output import checkpoint, results
from emulator.policies import ClientTask, Policy, RunContext, policy_class
from emulator.policies.boundary import CheckedPolicy, PolicyError, build
from emulator.privacy import ACCOUNTANTS, AccountantError, epsilon
from emulator.privacy.numerical import FALLBACKS, NumericalTheorem, reset_fallbacks
from emulator.rounds.budgets import Budgets
from emulator.run.buffered import BufferedLoop
from emulator.run.bundles import with_bundle
from emulator.run.devices import Placement, placement
from emulator.run.evaluation import Evaluator
from emulator.run.guards import check_memory, check_open_files, check_transport, preflight
from emulator.run.round_loop import EmulatedSystem, RoundLoop, Workers
from emulator.run.run_hooks import Checkpointer, InitialModelCheck, InitialModelMismatch, ProgressBar, RowsWriter
from emulator.run.state import Restart, RunState
from emulator.timemodel.clock import Clock
from emulator.timemodel.resources import trace_digests
from nodes.contracts.plugins import is_user_class
from nodes.contracts.schema import NO_COMPRESSION, Launcher, RoundMode, Scenario, to_dict
from nodes.contracts.tasks import Weights
from nodes.data import load_server_data
from nodes.transport.evaluator import EvaluatorProcess
from nodes.transport.pool import WorkerPool
from nodes.transport.supervisor import private_dir

if TYPE_CHECKING:
    from nodes.data.federated import ServerData

log = logging.getLogger("dpfl")


def run(cfg: Scenario) -> Path:
    # the address is bound and the workers started before the run directory exists: a run that cannot
    # start (an address in use, no room, a missing dataset) leaves none
    placed = placement(cfg)
    with _listening(cfg, placed) as (pool, evaluator):
        preflight(cfg)
        cfg, bundle = with_bundle(cfg, placed)
        check_memory(cfg, placed.local_workers)
        data = load_server_data(cfg.data, cfg.clients.n, cfg.seed)
        with results.new_run_dir(cfg.output.dir, cfg.output.name) as run_dir:
            manifest = {
                "scenario": to_dict(cfg),  # train.bundle = auto resolved: a resume trains the same K
                "seed": cfg.seed,
                "status": "starting",
                "traces": trace_digests(cfg.links, cfg.compute, cfg.availability),
                "devices": placed.record(),
                **({"bundle": bundle.record()} if bundle else {}),
                **results.provenance(),
            }
            return _execute(cfg, data, run_dir, manifest, None, pool, evaluator)


class ResumeError(ValueError):
    """The directory holds no run that can be continued."""


def resume(run_dir: Path | str) -> Path:
    """Continue a run stopped by a kill or power loss from its last completed round; a run
    killed before its first checkpoint starts again from round 0."""
    run_dir = Path(run_dir)
    if not (run_dir / "run.json").is_file():
        raise ResumeError(f"{run_dir}: not a run directory (no run.json)")
    with results.locked(run_dir):  # read under the lock: a resume that just ended may have completed it
        manifest = _manifest(run_dir)
        if manifest.get("status") == "complete":
            raise ResumeError(f"{run_dir}: the run is already complete")
        cfg = from_dict(manifest["scenario"])
        validate(cfg)
        _check_traces_unchanged(run_dir, cfg, manifest)
        placed = placement(cfg)
        with _listening(cfg, placed) as (pool, evaluator):
            check_memory(cfg, placed.local_workers)
            data = load_server_data(cfg.data, cfg.clients.n, cfg.seed)
            restart = _restart_point(run_dir, cfg, data)  # before _execute writes anything
            manifest.setdefault("resumed", []).append(
                {
                    "at_round": restart[1]["next_round"] if restart else 0,
                    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "devices": placed.record(),
                }
            )
            return _execute(cfg, data, run_dir, manifest, restart, pool, evaluator)


def _check_traces_unchanged(run_dir: Path, cfg: Scenario, manifest: dict[str, Any]) -> None:
    """The trace and availability files must be the ones the run started with (run.json's SHA-256s):
    rounds after the resume would otherwise follow other links than the rounds before it."""
    recorded = manifest.get("traces")
    if recorded is None:  # a run.json from before traces were recorded
        return
    for key, now in trace_digests(cfg.links, cfg.compute, cfg.availability).items():
        then = recorded.get(key)
        if then != now:
            was = f"sha256 {then['sha256'][:12]}…" if isinstance(then, dict) else "not recorded"
            raise ResumeError(
                f"{run_dir}: {key} = {now['path']} has changed since the run started ({was}, now "
                f"{now['sha256'][:12]}…): restore that file, or start a new run"
            )


def _manifest(run_dir: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError) as e:
        raise ResumeError(f"{run_dir}: not a run directory ({e})") from None
    if not (isinstance(manifest, dict) and isinstance(manifest.get("scenario"), dict)):
        raise ResumeError(f"{run_dir}: not a run directory (run.json holds no scenario)")
    return manifest


def _restart_point(run_dir: Path, cfg: Scenario, data: ServerData) -> Restart | None:
    """The newest checkpoint's (weights, state) that fits the run's scenario and tables
    (checkpoint.validate), or None for a run that never wrote one."""
    shapes = _model_shapes(cfg, data)

    model = {k: np.zeros(shape, np.float32) for k, shape in shapes.items()}

    def fresh() -> Policy:
        """A policy built as _execute builds it, for a model of the scenario's shapes."""
        return _new_policy(cfg, data.sizes, EmulatedSystem.build(cfg, data.sizes, RunState()), model)[0]

    # the first built here, not under checkpoint.load: a policy that cannot be built is its own error
    try:
        built = [fresh()]
    except PolicyError as e:
        e.args = (f"{e} ({_keep_traceback(run_dir, e)})",)
        raise

    def load_policy(state: Any) -> None:
        """Into a fresh policy, as it is (a state it refuses is the checkpoint's problem: it falls back)."""
        policy = built.pop() if built else fresh()
        (policy.inner if isinstance(policy, CheckedPolicy) else policy).load_state_dict(state)

    expected = checkpoint.Expected(
        rounds=cfg.budget.rounds,
        clients=cfg.clients.n,
        shapes=shapes,
        rounds_on_disk=_rounds_on_disk(run_dir),
        load_policy=load_policy,
    )
    try:
        restart = checkpoint.load(run_dir, expected)
    except checkpoint.CheckpointError as e:
        raise ResumeError(str(e)) from None
    if restart is None:
        log.warning(
            "%s: no checkpoint (the run was stopped before its first round completed): running it from round 0", run_dir
        )
    return restart


@contextmanager
def _listening(cfg: Scenario, placed: Placement) -> Iterator[tuple[WorkerPool, EvaluatorProcess]]:
    """The server's bound sockets, by default ipc sockets in a fresh directory only we may enter, and
    the local workers and the evaluator started on them, each on its device (`placed`): first, so that
    their import of torch overlaps the server's checks and data loading. The server imports no torch
    (nodes/transport/evaluator.py)."""
    transport = cfg.transport
    # local workers, or Ray's, and those joining by hand until transport.min_workers are ready
    check_open_files(max(placed.local_workers, transport.min_workers))
    check_transport(transport.address)
    sock_dir = private_dir()  # and a SIGKILLed server's left behind are swept
    try:
        evaluator = EvaluatorProcess(
            f"ipc://{sock_dir}/evaluator.sock", transport.max_message_bytes, transport.max_restarts, placed.evaluator
        )
        try:
            pool = WorkerPool(transport.address or f"ipc://{sock_dir}/server.sock", transport)
            try:
                if transport.launcher == Launcher.RAY:  # once bound: an address that cannot be costs no Ray connection
                    from nodes.transport.ray_workers import RayLauncher

                    pool.launcher = RayLauncher(transport)
                evaluator.proc = pool.start(placed.local_workers, evaluator.args(), placed.workers)
                yield pool, evaluator
            finally:
                pool.close()
        finally:
            evaluator.close()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def _execute(
    cfg: Scenario,
    data: ServerData,
    run_dir: Path,
    manifest: dict[str, Any],
    restart: Restart | None,
    pool: WorkerPool,
    evaluator_process: EvaluatorProcess,
) -> Path:
    """1. the run's state, new or restored; 2. its workers and evaluator set up and the initial model
    taken; 3. its policy and budgets; 4. its rounds, each followed by the hooks; 5. the last round's
    evaluation when a stop left it out; 6. run.json, however the run ends."""
    reset_fallbacks()  # this run's epsilons only, also where a sweep runs several in this process
    writer = results.RunWriter(run_dir)
    state = RunState.restore(writer, restart)  # 1
    system = EmulatedSystem.build(cfg, data.sizes, state)
    writer.write_manifest(manifest)
    writer.write_clients(_with_batteries(system.clients.table_columns(results.CLIENT_ROWS), system.energy))
    policy: Policy | None = None
    hooks: list[RoundHook] = []
    try:  # whatever happens, close() shuts every worker down
        weights, initial_check = _initial_model(cfg, data, run_dir, state, pool, evaluator_process)  # 2
        policy, budgets = _new_policy(cfg, data.sizes, system, weights)  # 3
        state.apply_to(budgets, policy)
        writer.write_manifest(_record_start(manifest, run_dir, pool, evaluator_process, budgets))
        hooks = [initial_check, *_hooks(cfg, writer, RunInfo(run_dir, to_dict(cfg), state.first_round, budgets.rounds))]
        loop = _loop(
            cfg, policy, system, budgets, pool.run_tasks, Evaluator(evaluator_process.evaluate, cfg.eval.overlap, hooks)
        )
        loop.restore(state.buffered, weights)
        manifest["stop_reason"], weights = loop.play(state.first_round, weights)  # 4
        loop.evaluate_last(writer.last_round_unevaluated(), weights, hooks)  # 5
        _check_rounds_on_disk(run_dir, loop.played)
        manifest["status"] = "complete"
    except KeyboardInterrupt as e:
        manifest["status"] = "interrupted"
        setattr(e, "run_dir", run_dir)  # noqa: B010  # for the CLI's resume hint: a timestamped name is known only here
        raise
    except BaseException as e:
        failure = _failed(run_dir, manifest, e)
        if failure is e:
            raise
        raise failure from e
    finally:  # 6
        _shut_down(hooks, pool, evaluator_process)
        _record_end(manifest, pool, evaluator_process, system.clock, policy)
        _write_end(writer, manifest, policy)
    return run_dir


# --- helpers (one concern each) -------------------------------------------------------------


def _loop(
    cfg: Scenario, policy: Policy, system: EmulatedSystem, budgets: Budgets, train: Workers, evaluator: Evaluator
) -> RoundLoop:
    """Synchronous rounds, or round.mode=buffered|async's versions (emulator.run.buffered, built on RoundLoop)."""
    if cfg.round.mode == RoundMode.SYNC:
        return RoundLoop(cfg, policy, system, budgets, train, evaluator)
    return BufferedLoop(cfg, policy, system, budgets, train, evaluator)


def _initial_model(
    cfg: Scenario,
    data: ServerData,
    run_dir: Path,
    state: RunState,
    pool: WorkerPool,
    evaluator_process: EvaluatorProcess,
) -> tuple[Weights, InitialModelCheck]:
    """Set the workers and the evaluator up and wait for the workers; the model round `state.first_round`
    starts from: the checkpoint's, or a local worker's build of the initial model while the evaluator's
    may still be on its way (the hook compares the two before round 0's rows)."""
    scenario = to_dict(cfg)
    pool.set_up(scenario, str(run_dir / "wire.jsonl") if cfg.transport.wire_log else "")
    built = evaluator_process.set_up(scenario, data.test)
    _load_accountant(cfg)
    pool.wait_ready(cfg.transport.min_workers)
    if state.weights is not None:
        return state.weights, InitialModelCheck(None, built)
    adopted = pool.initial_model
    if adopted is None:
        return built.result(), InitialModelCheck(None, built)
    return _checked_shapes(cfg, data, adopted), InitialModelCheck(adopted, built)


def _hooks(cfg: Scenario, writer: results.RunWriter, info: RunInfo) -> list[RoundHook]:
    """The run's own after-round work, then the TensorBoard logger and the user's hooks, in that order."""
    hooks: list[RoundHook] = [
        RowsWriter(writer, cfg.data),
        Checkpointer(info.run_dir),
        ProgressBar(info, cfg.output.progress),
    ]
    if cfg.output.tensorboard:
        from emulator.output.tensorboard import TensorBoardLogger

        hooks.append(TensorBoardLogger(cfg.output.tensorboard, info))
    return hooks + [load_hook(spec)(info) for spec in cfg.output.hooks]


def _record_start(
    manifest: dict[str, Any], run_dir: Path, pool: WorkerPool, evaluator: EvaluatorProcess, budgets: Budgets
) -> dict[str, Any]:
    """run.json once the run is running: where, on which processes, with which derived budgets."""
    manifest.update(
        status="running",
        run_dir=str(run_dir),
        server_address=pool.address,
        workers=pool.pids(),
        evaluator=evaluator.pids(),
        derived_budgets=budgets.derivation,
        **_launched(pool),
    )
    return manifest


def _shut_down(hooks: list[RoundHook], pool: WorkerPool, evaluator: EvaluatorProcess) -> None:
    """The hooks closed, then the processes: the evaluator is asked to exit first, so that its exit (the
    kernel freeing its memory) overlaps the workers'; `_listening` waits for it."""
    for hook in hooks:
        hook.close()
    evaluator.ask_to_exit()
    pool.close()


def _record_end(
    manifest: dict[str, Any], pool: WorkerPool, evaluator: EvaluatorProcess, clock: Clock, policy: Policy | None
) -> None:
    """run.json as the run ends: every process it used, the transport's counters, the privacy spent."""
    manifest.update(
        workers=pool.pids(),
        remote_workers=pool.remote_pids(),
        evaluator=evaluator.pids(),
        transport={**vars(pool.counters), "evaluator_deaths": evaluator.deaths()},
        **_launched(pool),
        finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        virtual_time_s=clock.now,
        privacy=policy.accountant.run_privacy() if policy else {},
        privacy_mechanism=policy.accountant.mechanism if policy else None,
        # a resumed run keeps what fell back before it was stopped
        privacy_fallback={**manifest.get("privacy_fallback", {}), **FALLBACKS},
    )


def _load_accountant(cfg: Scenario) -> None:
    """For DP-SGD's RDP accountant, Opacus's RDP analysis (its import of scipy.special) and one step at
    the scenario's (q, sigma) on a thread while the workers set up: CPU that round 0's end would
    otherwise wait for (emulator.privacy caches both; python -m bench --only w2). A user's theorem is
    first asked in round 0, where an error of it fails the run in one line."""
    if policy_class(cfg.policy).make_accountant is Policy.make_accountant and not is_user_class(cfg.dp.accountant):
        dp = cfg.dp
        args, accountant = ([(dp.q, dp.sigma, 1)], dp.delta, dp.conversion), {"accountant": dp.accountant}
        threading.Thread(target=epsilon, args=args, kwargs=accountant, daemon=True).start()
    _note_history_cost(cfg)


# A run whose accounting may take this long is told so at its start (a line on stderr): an upper estimate, as the
# privacy budget stops most clients' histories well before budget.rounds (adap_dpfl's dropout.yaml: 11 of 40 rounds).
HISTORY_NOTE_SECONDS = 600.0


def _note_history_cost(cfg: Scenario) -> None:
    """Under dp.accountant = prv | pld, a policy that may give each round a sigma of its own (Policy.changes_sigma)
    grows each client's history by a distinct run a round, each composed at every question of it: the estimate of
    what that costs by budget.rounds (every client asked every round, each run distinct), said where it is long."""
    cls = ACCOUNTANTS.get(cfg.dp.accountant)
    if not (issubclass(cls, NumericalTheorem) and policy_class(cfg.policy).changes_sigma):
        return
    clients = cfg.clients.per_round or cfg.clients.n
    seconds = clients * sum(cls.question_seconds(r) for r in range(1, cfg.budget.rounds + 1))
    if seconds >= HISTORY_NOTE_SECONDS:
        log.warning(
            "dp.accountant=%s: policy=%s may give each round a sigma of its own; over budget.rounds = %d, %d clients "
            "a round, each training every round, its accounting may take up to about %.0f min (python -m "
            "bench.accountants; dp.accountant=rdp: seconds)",
            cfg.dp.accountant,
            cfg.policy,
            cfg.budget.rounds,
            clients,
            seconds / 60,
        )


def _new_policy(cfg: Scenario, sizes: list[int], system: EmulatedSystem, weights: Weights) -> tuple[Policy, Budgets]:
    """The scenario's policy, before any state is loaded into it, and the budgets it was told of."""
    task_bytes = len(task_frame(0, ClientTask.dp_sgd(0, cfg.dp), weights))
    compressed = cfg.compression.kind != NO_COMPRESSION
    up = update_bytes(cfg.compression, weights) if compressed else 0
    budgets = Budgets(
        cfg.budget,
        system.resources,
        task_bytes=task_bytes,
        update_bytes=up,
        per_round=cfg.clients.per_round or cfg.clients.n,
        tau=cfg.dp.tau,
        deadline_s=cfg.round.deadline_s,
    )
    context = RunContext(
        n_clients=cfg.clients.n,
        data_sizes=sizes,
        num_params=sum(int(w.size) for w in weights.values()),
        rounds_budget=budgets.rounds,
        task_bytes=task_bytes,
        update_bytes=up or task_bytes,
        clients=system.clients,
        now=lambda: system.clock.now,
        mode=cfg.round.mode,
        settings=policy_settings(cfg),
    )
    cls = policy_class(cfg.policy)
    # held at its contract's boundary; the whole scenario only for the deprecated Policy.cfg
    return build(cls, cfg.policy, policy_options(cls, cfg), context, scenario=cfg), budgets


def _with_batteries(chunks: Iterator[dict[str, Any]], energy: Energy | None) -> Iterator[dict[str, Any]]:
    """The clients table's chunks with each client's battery columns where batteries are modelled."""
    batteries = None if energy is None else energy.batteries
    for chunk in chunks:
        yield chunk if batteries is None else {**chunk, **batteries.table_columns(chunk["client"])}


def _failed(run_dir: Path, manifest: dict[str, Any], e: BaseException) -> BaseException:
    """run.json's `failed` and its error, and the exception to raise: a policy's or a user accountant's one
    line, its traceback kept as error.log; a full disk met under any writer (a checkpoint's too) as a
    ResultsWriteError."""
    if isinstance(e, PolicyError | AccountantError):
        e.args = (f"{e} ({_keep_traceback(run_dir, e)})",)  # the CLI's line and run.json's error say the same
        manifest.update(status="failed", error=str(e))
        return e
    failure = _disk_full(run_dir, e) or e
    manifest.update(status="failed", error=f"{type(failure).__name__}: {failure}")
    return failure


def _write_end(writer: results.RunWriter, manifest: dict[str, Any], policy: Policy | None) -> None:
    """The privacy table, then run.json as the run ends (on a full disk too, results.RESERVE), and no temporary
    file left behind. A table that cannot be written fails a run that had completed."""
    table_error = None
    try:
        if policy:
            charged = writer.write_privacy(policy.accountant.client_rows())
            manifest["privacy"] = {**manifest["privacy"], "clients_charged": charged, "table": results.PRIVACY_FILE}
    except results.ResultsWriteError as e:  # run.json says so; a run that had failed keeps its error
        manifest["privacy"] = {**manifest.get("privacy", {}), "table": f"not written: {e}"}
        if manifest["status"] == "complete":
            manifest.update(status="failed", error=f"{type(e).__name__}: {e}")
            table_error = e
    try:
        writer.write_final_manifest(manifest)
    except OSError as e:
        if manifest["status"] == "complete":  # nothing else went wrong: this is the run's error
            raise results.ResultsWriteError(f"cannot write {writer.dir}/run.json: {e.strerror or e}") from e
        log.error("could not update %s/run.json: %s", writer.dir, e)  # keep the error that got us here
    finally:
        with contextlib.suppress(OSError):
            writer.discard_temporaries()
    if table_error:
        raise table_error


def _disk_full(run_dir: Path, e: BaseException) -> results.ResultsWriteError | None:
    """A full disk met outside the tables' writer (which says so itself) as its ResultsWriteError."""
    if isinstance(e, results.ResultsWriteError) or not (
        isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
    ):
        return None
    on_disk = _rounds_on_disk(run_dir)
    done = next(r for r in itertools.count() if r not in on_disk)
    kept = f"rounds 0-{done - 1} are complete on disk" if done else "no round is complete on disk"
    where = e.filename or run_dir
    return results.ResultsWriteError(
        f"cannot write {where}: {e.strerror or e}; {kept} (python -m emulator resume {run_dir})"
    )


def _keep_traceback(run_dir: Path, e: BaseException) -> str:
    """The traceback of `e` (and of the exception that caused it) as the run directory's error.log; where."""
    where = run_dir / "error.log"
    try:
        where.write_text("".join(traceback.format_exception(e)))
    except OSError as err:  # e.g. a full disk: the line itself is still said
        return f"no traceback kept: {err.strerror or err}"
    return f"traceback in {where}"


def _rounds_on_disk(run_dir: Path) -> set[int]:
    """The rounds with a row in the rounds table (one file per round, results.RunWriter)."""
    return {int(f.stem.split("-")[1]) for f in (run_dir / "rounds").glob("round-*.parquet")}


class RoundsMissing(results.ResultsWriteError):
    """The rounds table lacks rounds the run played: it is not complete."""


def _check_rounds_on_disk(run_dir: Path, played: int) -> None:
    lacking = sorted(set(range(played)) - _rounds_on_disk(run_dir))
    if lacking:
        raise RoundsMissing(
            f"{run_dir}: the rounds table lacks {len(lacking)} of the rounds 0-{played - 1} the run played "
            f"(the first: {lacking[0]}); not marking it complete"
        )


def _model_shapes(cfg: Scenario, data: ServerData) -> dict[str, tuple[int, ...]]:
    from nodes.training.model_catalog import architecture, parameter_shapes

    return parameter_shapes(architecture(cfg.model, data.input_shape, data.num_classes))


def _checked_shapes(cfg: Scenario, data: ServerData, model: Weights) -> Weights:
    expected = _model_shapes(cfg, data)
    got = {k: v.shape for k, v in model.items()}
    if got != expected or any(v.dtype != np.float32 for v in model.values()):
        raise InitialModelMismatch(f"a local worker's initial model has tensors {got}, expected float32 {expected}")
    return model


def _launched(pool: WorkerPool) -> dict[str, Any]:
    """run.json's ray_workers (transport.launcher=ray): where each worker ran, and its pid there."""
    return {f"{pool.launcher.kind}_workers": pool.launcher.placements()} if pool.launcher else {}

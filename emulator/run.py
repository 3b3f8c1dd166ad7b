"""One run's lifecycle: start or resume, play rounds until a budget or the policy stops it, stop.

Workers train for real (every task is sent to a worker process over ZeroMQ), the clock decides
who made it in time; a round itself is `emulator.round.play_round`. After each round the
callbacks write its rows to Parquet, save the checkpoint and move the progress bar, after the
style of pfl's `FederatedAlgorithm.run`, once the round's evaluation is in (emulator.evaluation:
every eval.every rounds and the last, overlapped with the next round's training where the policy
allows); run.json is written at the start and at the end.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from emulator import checkpoint, results
from emulator.budgets import Budgets
from emulator.clock import Clock
from emulator.config import from_dict, validate
from emulator.evaluation import Evaluator, Output
from emulator.guards import check_memory, check_open_files, check_transport, preflight
from emulator.links import build_resources, trace_digests
from emulator.policies import ClientOutcome, ClientTask, OutcomeLog, Policy, RunContext, policy_class
from emulator.policies.system import client_infos
from emulator.privacy import epsilon
from emulator.round import RoundNotPlayed, RoundRecord, Train, Weights, play_round, task_frame
from nodes.data import load_server_data
from nodes.evaluator import EvaluatorProcess
from nodes.pool import WorkerPool
from nodes.schema import Launcher, Scenario, to_dict

if TYPE_CHECKING:
    from nodes.data.federated import ServerData

log = logging.getLogger("dpfl")

Restart = tuple[Weights, dict[str, Any]]  # a checkpoint's (weights, state): checkpoint.load


def run(cfg: Scenario) -> Path:
    # the address is bound and the workers started before the run directory exists: a run that cannot
    # start (an address in use, no room, a missing dataset) leaves none
    with _listening(cfg) as (pool, evaluator):
        preflight(cfg)
        check_memory(cfg, _local_workers(cfg))
        data = load_server_data(cfg.data, cfg.clients.n, cfg.seed)
        with results.new_run_dir(cfg.output.dir, cfg.output.name) as run_dir:
            manifest = {
                "scenario": to_dict(cfg),
                "seed": cfg.seed,
                "status": "starting",
                "traces": trace_digests(cfg),
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
        restart = _restart_point(run_dir)
        manifest.setdefault("resumed", []).append(
            {"at_round": restart[1]["next_round"] if restart else 0, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        )
        with _listening(cfg) as (pool, evaluator):
            check_memory(cfg, _local_workers(cfg))
            data = load_server_data(cfg.data, cfg.clients.n, cfg.seed)
            return _execute(cfg, data, run_dir, manifest, restart, pool, evaluator)


def _check_traces_unchanged(run_dir: Path, cfg: Scenario, manifest: dict[str, Any]) -> None:
    """The trace and availability files must be the ones the run started with (run.json's SHA-256s):
    rounds after the resume would otherwise follow other links than the rounds before it."""
    recorded = manifest.get("traces")
    if recorded is None:  # a run.json from before traces were recorded
        return
    for key, now in trace_digests(cfg).items():
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


def _restart_point(run_dir: Path) -> Restart | None:
    """The checkpoint's (weights, state), or None for a run that never wrote one."""
    try:
        restart = checkpoint.load(run_dir)
    except checkpoint.CheckpointError as e:
        raise ResumeError(str(e)) from None
    if restart is None:
        log.warning(
            "%s: no checkpoint (the run was stopped before its first round completed): running it from round 0", run_dir
        )
    return restart


@contextmanager
def _listening(cfg: Scenario) -> Iterator[tuple[WorkerPool, EvaluatorProcess]]:
    """The server's bound sockets, by default ipc sockets in a fresh directory only we may enter, and
    the local workers and the evaluator started on them: first, so that their import of torch
    overlaps the server's checks and data loading. The server imports no torch (nodes/evaluator.py)."""
    transport = cfg.transport
    # local workers, or Ray's, and those joining by hand until transport.min_workers are ready
    check_open_files(max(_local_workers(cfg), transport.min_workers))
    check_transport(transport.address)
    sock_dir = tempfile.mkdtemp(prefix="dpfl-")
    try:
        evaluator = EvaluatorProcess(f"ipc://{sock_dir}/evaluator.sock", transport.max_message_bytes)
        try:
            pool = WorkerPool(transport.address or f"ipc://{sock_dir}/server.sock", transport)
            try:
                if transport.launcher == Launcher.RAY:  # once bound: an address that cannot be costs no Ray connection
                    from nodes.ray_workers import RayLauncher

                    pool.launcher = RayLauncher(transport)
                evaluator.proc = pool.start(_local_workers(cfg), evaluator.args())
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
    writer = results.RunWriter(run_dir)
    sizes = data.sizes
    resources = build_resources(cfg, cfg.seed)
    first_round, now, saved, weights = 0, 0.0, None, None
    if restart is not None:
        weights, saved = restart
        first_round, now = saved["next_round"], saved["now"]
        for r, bad in zip(resources, saved["link_bad"]):
            r.loss.bad = bad
    writer.discard_from(first_round)  # what a killed run wrote past its checkpoint, or before its first
    outcomes = OutcomeLog(cfg.clients.n)
    outcomes.extend(_past_outcomes(run_dir))  # the rounds kept are exactly those before first_round
    clients = client_infos(resources, sizes, outcomes)
    clock = Clock(
        resources,
        cfg.seed,
        cfg.links.server_down_bps,
        cfg.links.server_up_bps,
        start=now,
        on_unavailable=cfg.availability.on_unavailable,
    )
    policy: Policy | None = None
    bar: tqdm | None = None
    writer.write_manifest(manifest)
    writer.write_clients([c.table_row() for c in clients])

    wire_log = str(run_dir / "wire.jsonl") if cfg.transport.wire_log else ""
    try:  # whatever happens, close() shuts every worker down
        scenario = to_dict(cfg)
        pool.set_up(scenario, wire_log)
        initial_model = evaluator_process.set_up(scenario)
        _load_accountant(cfg)
        pool.wait_ready(cfg.transport.min_workers)
        # Round 0 starts from a local worker's build of the initial model, while the evaluator's
        # may still be on its way; the two are compared before round 0's rows (same_initial_model).
        adopted = None
        if weights is None:
            adopted = pool.initial_model
            weights = _checked_shapes(cfg, data, adopted) if adopted is not None else initial_model.result()
        task_bytes = len(task_frame(0, _plain_task(cfg), weights))
        budgets = Budgets(cfg, resources, task_bytes=task_bytes)
        policy = policy_class(cfg.policy)(
            cfg,
            RunContext(
                n_clients=cfg.clients.n,
                data_sizes=sizes,
                num_params=sum(int(w.size) for w in weights.values()),
                rounds_budget=budgets.rounds,
                task_bytes=task_bytes,
                clients=clients,
                now=lambda: clock.now,
            ),
        )
        if saved is not None:
            budgets.bytes_spent = saved["bytes_spent"]
            policy.load_state_dict(saved["policy"])
        manifest.update(
            status="running",
            run_dir=str(run_dir),
            server_address=pool.address,
            workers=pool.pids(),
            derived_budgets=budgets.derivation,
            **_launched(pool),
        )
        writer.write_manifest(manifest)
        bar = tqdm(
            total=budgets.rounds, initial=first_round, unit="round", disable=not cfg.output.progress, dynamic_ncols=True
        )

        def round_ended(record: RoundRecord) -> str:
            """As a round ends, its outcomes join the clients' history (the next round's plan reads it);
            returns its checkpoint's state, taken now: with the evaluation overlapped, the checkpoint
            is written after the next round has moved the clock, the budgets and the policy on. The
            snapshot is the JSON document the checkpoint holds: at 10,000 clients deepcopy of the
            per-client state cost ~0.3 s of server CPU a round."""
            outcomes.extend(record.outcomes.values())
            return checkpoint.snapshot(
                {
                    "next_round": record.rnd + 1,
                    "now": clock.now,
                    "bytes_spent": budgets.bytes_spent,
                    "link_bad": [r.loss.bad for r in resources],
                    "policy": policy.state_dict(),
                }
            )

        def same_initial_model(record: RoundRecord, state: str) -> None:
            """Before round 0's rows: the evaluator's build of the initial model is the adopted one. Not
            as round 0 ends, which would hold round 1 back until the evaluator is set up; with the
            evaluation overlapped, round 1 trains meanwhile."""
            nonlocal adopted
            if adopted is not None:
                _check_same_model(adopted, initial_model.result())
                adopted = None

        after_round: list[Output] = [
            same_initial_model,
            lambda record, state: writer.write_round(record.rnd, record.rows(cfg.data)),
            lambda record, state: checkpoint.save(run_dir, record.weights, state),
            lambda record, state: _show_progress(bar, record),
        ]
        evaluator = Evaluator(evaluator_process.evaluate, cfg.eval.overlap, after_round)
        manifest["stop_reason"], weights = _play(
            cfg, first_round, weights, policy, clock, budgets, pool.run_tasks, evaluator, round_ended
        )
        last = writer.last_round_unevaluated()
        if last is not None:  # a stop found as the next round was planned: the last round gets its evaluation
            writer.write_evaluation(last, *evaluator(weights))
        manifest["status"] = "complete"
    except KeyboardInterrupt as e:
        manifest["status"] = "interrupted"
        # for the CLI's summary and resume hint: a timestamped name is known only here (KeyboardInterrupt
        # declares no run_dir: set by name, as the CLI reads it)
        setattr(e, "run_dir", run_dir)  # noqa: B010
        raise
    except BaseException as e:
        manifest.update(status="failed", error=f"{type(e).__name__}: {e}")
        raise
    finally:
        if bar is not None:
            bar.close()
        pool.close()
        manifest.update(
            workers=pool.pids(), remote_workers=pool.remote_pids(), transport=vars(pool.counters), **_launched(pool)
        )
        manifest.update(
            finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            virtual_time_s=clock.now,
            privacy=policy.accountant.to_dict() if policy else {},
            privacy_mechanism=policy.accountant.mechanism if policy else None,
        )
        try:
            writer.write_manifest(manifest)
        except OSError as e:  # e.g. the disk filled up: keep the error that got us here
            log.error("could not update %s/run.json: %s", run_dir, e)
    return run_dir


def _play(
    cfg: Scenario,
    first_round: int,
    weights: Weights,
    policy: Policy,
    clock: Clock,
    budgets: Budgets,
    train: Train,
    evaluator: Evaluator,
    round_ended: Callable[[RoundRecord], str],
) -> tuple[str, Weights]:
    """Rounds from `first_round` until a budget or the policy stops the run; returns why it stopped
    and the final model. Every round's outputs have run when it returns, however it returns."""
    try:
        for rnd in range(first_round, cfg.budget.rounds):
            stop = policy.should_stop()
            if stop:
                return stop, weights
            try:
                record = play_round(
                    rnd,
                    weights,
                    cfg=cfg,
                    policy=policy,
                    clock=clock,
                    budgets=budgets,
                    train=train,
                    evaluate=evaluator,
                )
            except RoundNotPlayed as e:
                return str(e), weights
            weights = record.weights
            # every eval.every-th round and the round budget's last; a stop found later is the caller's
            evaluate = not policy.reads_evaluation() and (
                (rnd + 1) % cfg.eval.every == 0 or rnd + 1 == cfg.budget.rounds
            )
            evaluator.round_played(record, round_ended(record), evaluate)
            if budgets.time_exhausted(clock.now):
                return f"time budget {cfg.budget.time_s} s reached", weights
        return f"round budget {cfg.budget.rounds} reached", weights
    finally:  # Ctrl-C, SIGTERM and errors too: the round before keeps its rows and its checkpoint
        evaluator.flush()


# --- helpers (one concern each) -------------------------------------------------------------


def _load_accountant(cfg: Scenario) -> None:
    """For DP-SGD's RDP accountant, Opacus's RDP analysis (its import of scipy.special) and one step at
    the scenario's (q, sigma) on a thread while the workers set up: ~0.5 s of CPU that round 0's end
    would otherwise wait for (emulator.privacy caches both)."""
    if policy_class(cfg.policy).make_accountant is Policy.make_accountant:
        dp = cfg.dp
        threading.Thread(target=epsilon, args=([(dp.q, dp.sigma, 1)], dp.delta, dp.conversion), daemon=True).start()


class InitialModelMismatch(RuntimeError):
    """A local worker's initial model is not the evaluator's: the run would not be the seed's."""


def _checked_shapes(cfg: Scenario, data: ServerData, model: Weights) -> Weights:
    from nodes.model_catalog import architecture, parameter_shapes

    expected = parameter_shapes(architecture(cfg.model, data.input_shape, data.num_classes))
    got = {k: v.shape for k, v in model.items()}
    if got != expected or any(v.dtype != np.float32 for v in model.values()):
        raise InitialModelMismatch(f"a local worker's initial model has tensors {got}, expected float32 {expected}")
    return model


def _check_same_model(adopted: Weights, built: Weights) -> None:
    differ = [k for k in built if not np.array_equal(built[k], adopted[k])]
    if differ:
        raise InitialModelMismatch(
            f"the evaluator's initial model differs from the local workers' in {', '.join(differ)}: "
            "the same code, seed and torch should build it bit for bit"
        )


def _launched(pool: WorkerPool) -> dict[str, Any]:
    """run.json's ray_workers (transport.launcher=ray): where each worker ran, and its pid there."""
    return {f"{pool.launcher.kind}_workers": pool.launcher.placements()} if pool.launcher else {}


def _local_workers(cfg: Scenario) -> int:
    return cfg.workers or os.cpu_count() or 1


def _plain_task(cfg: Scenario) -> ClientTask:
    dp = cfg.dp
    return ClientTask(client=0, steps=dp.tau, lr=dp.lr, sigma=dp.sigma, clip=dp.clip, q=dp.q)


def _past_outcomes(run_dir: Path) -> list[ClientOutcome]:
    """The outcomes of the rounds already on disk (a resumed run's history)."""
    return [
        ClientOutcome(
            round=r["round"],
            client=r["client"],
            outcome=r["outcome"],
            t_down_start=r["t_download_start"],
            t_down_end=r["t_download_end"],
            t_compute_end=r["t_compute_end"],
            t_up_end=r["t_upload_end"],
            train_loss=_loss(r) if r["outcome"] == "arrived" else float("nan"),
        )
        for r in results.read_table(run_dir, "client_rounds").to_pylist()
    ]


def _loss(row: dict[str, Any]) -> float:
    return float("nan") if row["train_loss"] is None else row["train_loss"]


def _show_progress(bar: tqdm, record: RoundRecord) -> None:
    bar.update(1)
    bar.set_postfix(
        t=f"{record.timeline.t_end:.1f}s", acc=f"{record.test_accuracy:.3f}", eps=f"{max(record.epsilon):.2f}"
    )

"""One run, top to bottom: workers train for real, the clock decides who made it in time.

Each round: the policy plans -> every task is sent to a worker process over ZeroMQ and
trained -> the SimPy clock replays downloads, compute and uploads with the real message
sizes -> on-time updates are aggregated in client-id order with renormalised impact
factors -> the server evaluates, charges privacy ledgers and writes the round to Parquet.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from emulator import checkpoint, results
from emulator.budgets import Budgets
from emulator.clock import Clock, Job, RoundTimeline
from emulator.config import Scenario, from_dict, to_dict, validate
from emulator.guards import check_memory
from emulator.impact import impact_factors, renormalise
from emulator.links import build_resources
from emulator.policies import (
    POLICIES,
    Accountant,
    ClientResult,
    ClientTask,
    RoundPlan,
    RunContext,
)
from nodes import protocol
from nodes.data import load_federated
from nodes.data.quality import corruption_for
from nodes.models import build_model, loss_fn
from nodes.pool import Reply, WorkerPool
from nodes.trainer import evaluate, load_numpy_state, state_to_numpy

log = logging.getLogger("dpfl")


def run(cfg: Scenario) -> Path:
    check_memory(cfg, _local_workers(cfg))
    data = load_federated(cfg.data, cfg.clients.n, cfg.seed)   # before any output: a missing dataset leaves none
    # the address is bound before the run directory exists: one that cannot be bound leaves none
    with _listening(cfg.transport) as pool, results.new_run_dir(cfg.output.dir, cfg.output.name) as run_dir:
        manifest = {"scenario": to_dict(cfg), "seed": cfg.seed, "status": "starting", **results.provenance()}
        return _execute(cfg, data, run_dir, manifest, None, pool)


class ResumeError(ValueError):
    """The directory holds no run that can be continued."""


def resume(run_dir: Path | str) -> Path:
    """Continue a run stopped by a kill or power loss from its last completed round; a run
    killed before its first checkpoint starts again from round 0."""
    run_dir = Path(run_dir)
    if not (run_dir / "run.json").is_file():
        raise ResumeError(f"{run_dir}: not a run directory (no run.json)")
    with results.locked(run_dir):   # read under the lock: a resume that just ended may have completed it
        manifest = _manifest(run_dir)
        if manifest.get("status") == "complete":
            raise ResumeError(f"{run_dir}: the run is already complete")
        cfg = from_dict(manifest["scenario"])
        validate(cfg)
        check_memory(cfg, _local_workers(cfg))
        restart = _restart_point(run_dir)
        manifest.setdefault("resumed", []).append({"at_round": restart[1]["next_round"] if restart else 0,
                                                   "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        data = load_federated(cfg.data, cfg.clients.n, cfg.seed)
        with _listening(cfg.transport) as pool:
            return _execute(cfg, data, run_dir, manifest, restart, pool)


def _manifest(run_dir: Path) -> dict:
    try:
        manifest = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError) as e:
        raise ResumeError(f"{run_dir}: not a run directory ({e})") from None
    if not (isinstance(manifest, dict) and isinstance(manifest.get("scenario"), dict)):
        raise ResumeError(f"{run_dir}: not a run directory (run.json holds no scenario)")
    return manifest


def _restart_point(run_dir: Path):
    """The checkpoint's (weights, state), or None for a run that never wrote one."""
    try:
        restart = checkpoint.load(run_dir)
    except checkpoint.CheckpointError as e:
        raise ResumeError(str(e)) from None
    if restart is None:
        log.warning("%s: no checkpoint (the run was stopped before its first round completed): "
                    "running it from round 0", run_dir)
    return restart


@contextmanager
def _listening(transport) -> Iterator[WorkerPool]:
    """The server's bound socket; by default an ipc socket in a fresh directory only we may enter."""
    sock_dir = tempfile.mkdtemp(prefix="dpfl-")
    try:
        pool = WorkerPool(transport.address or f"ipc://{sock_dir}/server.sock", transport)
        try:
            yield pool
        finally:
            pool.close()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def _execute(cfg: Scenario, data, run_dir: Path, manifest: dict, restart, pool: WorkerPool) -> Path:
    writer = results.RunWriter(run_dir)
    sizes = [len(y) for _, y in data.train]
    model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.seed)
    weights = state_to_numpy(model)
    resources = build_resources(cfg, cfg.seed)
    first_round, now, saved = 0, 0.0, None
    if restart is not None:
        weights, saved = restart
        first_round, now = saved["next_round"], saved["now"]
        for r, bad in zip(resources, saved["link_bad"]):
            r.loss.bad = bad
    writer.discard_from(first_round)   # what a killed run wrote past its checkpoint, or before its first
    clock = Clock(resources, cfg.seed, cfg.links.server_down_bps, cfg.links.server_up_bps, start=now)
    policy = bar = None
    writer.write_manifest(manifest)

    wire_log = str(run_dir / "wire.jsonl") if cfg.transport.wire_log else ""
    try:   # from the first worker on: whatever happens, close() shuts every worker down
        pool.start(to_dict(cfg), _local_workers(cfg), wire_log)
        pool.wait_ready(cfg.transport.min_workers)
        budgets = Budgets(cfg, resources, task_bytes=len(_task_frame(0, _plain_task(cfg), weights)))
        policy = POLICIES[cfg.policy](cfg, RunContext(n_clients=cfg.clients.n, data_sizes=sizes,
                                                      num_params=sum(int(w.size) for w in weights.values()),
                                                      rounds_budget=budgets.rounds))
        if saved is not None:
            budgets.bytes_spent = saved["bytes_spent"]
            policy.load_state_dict(saved["policy"])
        manifest.update(status="running", run_dir=str(run_dir), server_address=pool.address,
                        workers=pool.pids(), derived_budgets=budgets.derivation)
        writer.write_manifest(manifest)
        bar = tqdm(total=budgets.rounds, initial=first_round, unit="round", disable=not cfg.output.progress,
                   dynamic_ncols=True)
        privacy = policy.accountant
        for rnd in range(first_round, cfg.budget.rounds):
            wall = time.monotonic()
            stop = policy.should_stop()
            if stop:
                manifest["stop_reason"] = stop
                break
            eligible = [i for i in range(cfg.clients.n) if privacy.eligible(i)]
            plan = policy.configure_round(rnd, eligible)
            tasks = [t for t in plan.tasks if privacy.allows(t)]
            if not tasks:
                manifest["stop_reason"] = "privacy budget exhausted for every client"
                break
            frames = [(t.client, _task_frame(rnd, t, weights)) for t in tasks]
            replies = pool.run_tasks(rnd, frames)
            jobs = [_job(t, frame, replies[t.client], weights) for t, (_, frame) in zip(tasks, frames)]
            stop = budgets.exhausted_by(jobs, clock.now)
            if stop:
                manifest["stop_reason"] = stop
                break
            timeline = clock.simulate_round(rnd, jobs, budgets.deadline(clock.now))
            budgets.spend(timeline)
            spent = _charge_privacy(privacy, tasks, timeline)
            p = impact_factors(cfg.impact, rnd, sizes)
            arrived = [c for c in sorted(timeline.clients) if timeline.clients[c].outcome == "arrived"]
            factors = renormalise(p, arrived)
            updates = [replies[c] for c in arrived]
            weights = policy.aggregate(rnd, weights, [_result(r) for r in updates], factors)
            load_numpy_state(model, weights)
            test_loss, test_acc = evaluate(model, *data.test, cfg.dp.batch_eval, loss_fn(cfg.model.name))
            policy.observe(rnd, test_loss, test_acc)
            eps = [privacy.epsilon(i) for i in range(cfg.clients.n)]
            writer.write_round(rnd, _rows(cfg, rnd, plan, tasks, timeline, replies, p, factors, eps, spent,
                                          test_loss, test_acc, time.monotonic() - wall))
            checkpoint.save(run_dir, weights, {"next_round": rnd + 1, "now": clock.now, "bytes_spent": budgets.bytes_spent,
                                               "link_bad": [r.loss.bad for r in resources],
                                               "policy": policy.state_dict()})
            bar.update(1)
            bar.set_postfix(t=f"{timeline.t_end:.1f}s", acc=f"{test_acc:.3f}",
                            eps=f"{max(eps):.2f}")
            if budgets.time_exhausted(clock.now):
                manifest["stop_reason"] = f"time budget {cfg.budget.time_s} s reached"
                break
        else:
            manifest["stop_reason"] = f"round budget {cfg.budget.rounds} reached"
        manifest["status"] = "complete"
    except KeyboardInterrupt:
        manifest["status"] = "interrupted"
        raise
    except BaseException as e:
        manifest.update(status="failed", error=f"{type(e).__name__}: {e}")
        raise
    finally:
        if bar is not None:
            bar.close()
        pool.close()
        manifest.update(workers=pool.pids(), transport=vars(pool.counters))
        manifest.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), virtual_time_s=clock.now,
                        privacy=policy.accountant.to_dict() if policy else {})
        try:
            writer.write_manifest(manifest)
        except OSError as e:   # e.g. the disk filled up: keep the error that got us here
            log.error("could not update %s/run.json: %s", run_dir, e)
    return run_dir


# --- helpers (one concern each) -------------------------------------------------------------

def _local_workers(cfg: Scenario) -> int:
    return cfg.workers or os.cpu_count() or 1


def _plain_task(cfg: Scenario) -> ClientTask:
    dp = cfg.dp
    return ClientTask(client=0, steps=dp.tau, lr=dp.lr, sigma=dp.sigma, clip=dp.clip, q=dp.q)


def _task_frame(rnd: int, t: ClientTask, weights: dict[str, np.ndarray]) -> bytes:
    return protocol.encode("task", round=rnd, client=t.client, params=t.to_wire(), model=protocol.pack_tensors(weights))


def _job(t: ClientTask, frame: bytes, reply: Reply, weights: dict[str, np.ndarray]) -> Job:
    if not reply.failure:
        reply.failure = _update_problem(reply, weights)
    ok = not reply.failure
    return Job(client=t.client, bytes_down=len(frame), steps=t.steps, bytes_up=reply.nbytes if ok else 0, failed=not ok)


def _update_problem(reply: Reply, weights: dict[str, np.ndarray]) -> str:
    """An update that could poison the global model is a failed client, not an input."""
    try:
        new = protocol.unpack_tensors(reply.message["model"])
    except protocol.ProtocolError as e:
        return f"bad update: {e}"
    if new.keys() != weights.keys() or any(new[k].shape != weights[k].shape for k in weights):
        return "bad update: tensors do not match the model"
    if not all(np.isfinite(v).all() for v in new.values()):
        return "bad update: non-finite values"
    reply.message["model"] = new
    return ""


def _result(reply: Reply) -> ClientResult:
    m = reply.message["metrics"]
    return ClientResult(client=reply.client, weights=reply.message["model"], steps=int(m["steps"]),
                        train_loss=float(m["train_loss"]), update_norm=float(m["update_norm"]), metrics=m)


def _charge_privacy(privacy: Accountant, tasks: list[ClientTask], tl: RoundTimeline) -> dict[int, float]:
    """Every client that received the model ran its steps: it pays, whatever became of the upload.
    The policy's accountant decides what a round costs (its own mechanism may charge the others too)."""
    before = {t.client: privacy.epsilon(t.client) for t in tasks}
    privacy.charge([t for t in tasks if tl.clients[t.client].trained])
    return {c: privacy.epsilon(c) - e for c, e in before.items()}


def _rows(cfg, rnd, plan: RoundPlan, tasks, tl: RoundTimeline, replies, p, factors, eps, spent,
          test_loss, test_acc, wall_s) -> dict[str, list[dict]]:
    by_client = {t.client: t for t in tasks}
    outcomes = [c.outcome for c in tl.clients.values()]
    arrived_loss = [float(replies[c].message["metrics"]["train_loss"]) for c in factors]
    rounds = [{
        "round": rnd, "t_start": tl.t_start, "t_end": tl.t_end, "deadline": tl.deadline,
        "selected": len(tasks), "arrived": outcomes.count("arrived"), "late": outcomes.count("late"),
        "lost": outcomes.count("lost_down") + outcomes.count("lost_up"), "failed": outcomes.count("failed"),
        "bytes_down": sum(c.bytes_down for c in tl.clients.values()),
        "bytes_up": sum(c.bytes_up for c in tl.clients.values()),
        "bytes_total": sum(c.bytes_down + c.bytes_up for c in tl.clients.values()),
        "tau": plan.state.get("tau"), "sigma": plan.state.get("sigma"), "mu": plan.state.get("mu"),
        "horizon": plan.state.get("T"),
        "policy_state": json.dumps(plan.state, sort_keys=True),
        "test_loss": test_loss, "test_accuracy": test_acc,
        "train_loss": float(np.nanmean(arrived_loss)) if arrived_loss else None,
        "max_epsilon": max(eps), "wall_s": wall_s,
    }]
    clients = []
    for c, ct in sorted(tl.clients.items()):
        t, r = by_client[c], replies[c]
        m = r.message["metrics"] if r.message and not r.failure else {}
        quality = corruption_for(cfg.data, c, rnd)   # a pure function of the scenario, as on the worker
        clients.append({
            "round": rnd, "client": c, "outcome": ct.outcome, "impact_planned": float(p[c]),
            "impact_factor": factors.get(c, 0.0),
            "t_download_start": ct.t_down_start, "t_download_end": ct.t_down_end,
            "t_compute_end": ct.t_compute_end, "t_upload_end": ct.t_up_end,
            "bytes_down": ct.bytes_down, "bytes_up": ct.bytes_up, "local_steps": t.steps if ct.trained else 0,
            "q": t.q, "sigma": t.sigma, "clip": t.clip, "lr": t.lr,
            "epsilon": eps[c], "epsilon_spent": spent.get(c, 0.0),
            "train_loss": m.get("train_loss"), "update_norm": m.get("update_norm"), "failure": r.failure or None,
            "output_noise_scale": t.output_noise_scale if t.output_noise != "none" else 0.0,
            "salt_pepper": quality.salt_pepper, "label_noise": quality.label_noise,
        })
    events = [{"round": rnd, "t": t, "client": c, "kind": k, "nbytes": n} for t, c, k, n in tl.events]
    return {"rounds": rounds, "client_rounds": clients, "events": events}

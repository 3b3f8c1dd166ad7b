"""Partial work (round.partial_work): a client runs the local steps that fit before the deadline.

Before the tasks are sent, each client's step count becomes the largest k <= its task's steps with

    start + download(bytes_down) + compute(k) + upload(bytes_up) <= deadline

on the client's own link and device (`ClientResources`: latency, bandwidth schedules or traces,
compute rate), a pure function of virtual time. The upload is estimated at the task message's size
(an update carries the same tensors; a compressed one is smaller, so the estimate errs towards fewer
steps). Not modelled by the estimate: a server capacity shared with other transfers, losses and
unavailability; a client they delay is late or lost as without partial work. A client for which not
even one step fits keeps its task and is late as before.

On aggregation, with round.partial_work_normalize, the updates are normalised by the steps done
(FedNova, Wang et al. 2020): d_i = (w_i - w) / tau_i, w' = w + tau_eff * sum_i p_i d_i with
tau_eff = sum_i p_i tau_i; done here by handing the policy's FedAvg w_i' = w + (tau_eff / tau_i)(w_i - w).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from emulator.timemodel.resources import ClientResources
from nodes.contracts.tasks import ClientResult, ClientTask, Weights


def steps_that_fit(
    res: ClientResources, start: float, deadline: float, bytes_down: int, bytes_up: int, steps: int
) -> int:
    """The most local steps k in [1, steps] whose round ends by `deadline`; 0 when not even one does."""
    t_down = start + res.download_time(bytes_down, start)

    def end(k: int) -> float:
        t = t_down + res.compute_time(k, t_down)
        return t + res.upload_time(bytes_up, t)

    lo, hi = 0, steps  # end(lo) fits (or lo = 0), end(k) > deadline for every k > hi
    while lo < hi:  # end(k) grows with k: binary search
        mid = (lo + hi + 1) // 2
        if end(mid) <= deadline:
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit_task(task: ClientTask, res: ClientResources, start: float, deadline: float, nbytes: int) -> ClientTask:
    """The task with the steps that fit (`nbytes` estimates both messages); unchanged when none does."""
    k = steps_that_fit(res, start, deadline, nbytes, nbytes, task.steps)
    return replace(task, steps=k) if 0 < k < task.steps else task


def normalised(
    weights: Weights, results: Sequence[ClientResult], factors: dict[int, float], steps: dict[int, int]
) -> list[ClientResult]:
    """The results as FedAvg must see them to aggregate FedNova's update: w_i' = w + (tau_eff / tau_i)(w_i - w)."""
    tau_eff = sum(factors[r.client] * steps[r.client] for r in results)
    base = {name: w.astype(np.float64) for name, w in weights.items()}  # the policy's FedAvg casts the sum back
    return [
        replace(r, weights={name: w + tau_eff / steps[r.client] * (r.weights[name] - w) for name, w in base.items()})
        for r in results
    ]

"""`fedcs` — FedCS client selection (Nishio & Yonetani, ICC 2019, Alg. 2): in its resource
request the server asks a random fraction `fedcs.request_fraction` (the paper's C) of the
eligible clients, or `fedcs.request_clients` of them, for their state (stream "fedcs", round),
estimates each one's round time (download + local steps + upload of a model-sized message) from
the answers, and admits clients
greedily, shortest estimate first, while every admitted one still fits the deadline, up to
clients.per_round. Each admitted client runs the scenario's DP-SGD round, as in `fedavg_dp`.

A client answers (`fedcs.estimate = reported`) with the throughput each of its links delivered
over the last `fedcs.report_window_s` seconds and its device's current speed: a measurement,
so a trace that changes during the round still surprises the server. `nominal` estimates from
the rates drawn for the run (a trace's mean) instead, a server that never asks.

FedCS schedules the uploads one after another on a shared channel; here they share the server's
uplink when links.server_up_bps limits it, so admitting a k-th client caps every admitted upload
at 1/k of that capacity and their estimates are redone with it. Losses are the clock's, unforeseen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from emulator.policies.base import Policy, RoundPlan, RunContext, RunSettings, dp_sgd_tasks
from emulator.policies.system import ClientInfo
from nodes.contracts.rng import stream
from nodes.contracts.schema import MAX_CLIENTS, MAX_SECONDS, Check, Choice, Range, setting


class Estimate(Choice):
    REPORTED = "reported"
    NOMINAL = "nominal"


@dataclass
class FedCsConfig:
    deadline_s: float = setting(0.0, "round time the selection aims at, virtual seconds (0 = round.deadline_s)")
    estimate: str = setting(
        "reported",
        "round times from: reported (each client's links over the last report_window_s and its current "
        "device speed, FedCS's resource request) | nominal (the rates drawn for the run; a trace's mean)",
    )
    report_window_s: float = setting(1.0, "reported: the seconds of past throughput a client averages")
    request_fraction: float = setting(
        1.0, "C: the share of eligible clients asked each round, drawn at random (at least one; 1 = all)"
    )
    request_clients: int = setting(
        0, "the number of eligible clients asked each round, drawn at random (0: request_fraction of them)"
    )
    RANGES: ClassVar[dict[str, Range]] = dict(
        deadline_s=Range(0, MAX_SECONDS),
        report_window_s=Range(1e-3, MAX_SECONDS),
        request_fraction=Range(1e-6, 1),
        request_clients=Range(0, MAX_CLIENTS),
    )


def admit_within(
    clients: Sequence[ClientInfo],
    k: int,
    deadline: float,
    message_bytes: int,
    steps: int,
    server_up_bps: float,
    update_bytes: int = 0,
) -> list[int]:
    """FedCS's greedy choice: candidates by estimated round time (ties by id); each is admitted when,
    with it, every admitted client's estimate fits `deadline`. At most k; at least the fastest one,
    since a round without clients would end the run. Uploads are `update_bytes` (0: `message_bytes`)."""
    up = update_bytes or message_bytes

    def estimates(admitted: list[ClientInfo]) -> list[float]:
        share = server_up_bps / len(admitted) if server_up_bps > 0 else math.inf
        return [c.estimated_round_s(message_bytes, steps, up, share) for c in admitted]

    candidates = sorted(clients, key=lambda c: (c.estimated_round_s(message_bytes, steps, up), c.client))
    admitted: list[ClientInfo] = []
    for c in candidates:
        if len(admitted) == k:
            break
        if max(estimates([*admitted, c])) <= deadline:
            admitted.append(c)
    return sorted(c.client for c in admitted or candidates[:1])


def request(eligible: Sequence[int], fraction: float, rng: np.random.Generator, clients: int = 0) -> list[int]:
    """FedCS's resource request: `clients` of them at random, or ceil(C |eligible|) when 0; all when as many.
    A fixed number keeps a round's requests the same however many clients are registered."""
    k = clients or max(1, math.ceil(fraction * len(eligible)))
    if k >= len(eligible):
        return list(eligible)
    return sorted(int(eligible[i]) for i in rng.choice(len(eligible), size=k, replace=False))


class FedCS(Policy):
    name = "fedcs"
    partial_work = True
    Options = FedCsConfig
    needs_client_view = True
    options_help = "policy=fedcs (Nishio & Yonetani 2019, deadline-aware selection)"
    options: FedCsConfig

    @classmethod
    def check(cls, options: FedCsConfig, settings: RunSettings, check: Check) -> None:
        check(Estimate.admits(options.estimate), "fedcs.estimate", options.estimate, Estimate.describe())

    @classmethod
    def clients_asked(cls, options: FedCsConfig, n_clients: int) -> int:
        return options.request_clients or math.ceil(options.request_fraction * n_clients)

    def __init__(self, options: FedCsConfig, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        self.deadline = options.deadline_s or ctx.settings.deadline_s

    def configure_round(self, rnd: int, eligible: Sequence[int]) -> RoundPlan:
        run, now = self.ctx.settings, self.ctx.now()
        k = run.per_round or len(eligible)
        o = self.options
        asked = request(eligible, o.request_fraction, stream(run.seed, "fedcs", rnd), o.request_clients)
        view = [self.ctx.clients[i] for i in asked]
        if o.estimate == Estimate.REPORTED:
            view = [c.reported(now, o.report_window_s) for c in view]
        chosen = admit_within(
            view,
            k,
            self.deadline,
            self.ctx.task_bytes,
            run.dp.tau,
            run.server_up_bps,
            self.ctx.update_bytes,
        )
        return RoundPlan(tasks=dp_sgd_tasks(run.dp, chosen), state={"tau": float(run.dp.tau), "sigma": run.dp.sigma})

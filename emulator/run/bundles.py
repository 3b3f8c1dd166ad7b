"""train.bundle = auto: the K clients a worker trains as one computation (docs/bundles.md#choosing-k),
chosen once when a run starts from its model, device, tasks a hand-out and workers.

The rule is `python -m bench --only w1,w2`'s: a dense model's bundle costs fewer messages and passes
per client the larger it is, up to an even split of the tasks over the workers (beyond, a worker
idles while another trains a larger share); a conv net's
bundle on the CPU is slower than one client at a time (its grouped convolution), and on a GPU it is
not yet measured (bench.gpu_check's `bundles` line), so a conv net keeps K = 1 on both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from emulator.run.guards import clients_per_round, model_size
from nodes.contracts.schema import BUNDLE_AUTO, RoundMode, bundle_size
from nodes.training.model_catalog import CONV_NETS

if TYPE_CHECKING:
    from emulator.run.devices import Placement
    from nodes.contracts.schema import Scenario

# The most parameters a bundle's K stacked models hold together (2**26 float32 values a copy); a bundle
# keeps a few copies (weights, gradients, noise), so this bounds its memory whatever the model.
BUNDLE_PARAMETERS = 1 << 26


@dataclass(frozen=True)
class BundleChoice:
    """The K train.bundle = auto chose, and why (run.json's `bundle`, the run's summary)."""

    k: int
    why: str

    def record(self) -> dict[str, Any]:
        return {"setting": BUNDLE_AUTO, "chosen": self.k, "why": self.why}


def choose_bundle(cfg: Scenario, device: str, workers: int) -> BundleChoice:
    """K for a run of `cfg` whose `workers` workers train on `device` (cpu | cuda).

    Args:
        cfg: the scenario; its model, round mode and clients a round are read.
        device: what device=auto resolved to (emulator.run.devices.Placement.device).
        workers: the workers a round's tasks are handed out to (local, Ray's or joining).

    Returns:
        1 for a conv net, else K = ceil(tasks a hand-out / workers): at most one bundle a worker, none
        larger than an even split's share (and at most BUNDLE_PARAMETERS // the model's parameters),
        with the reason in words.
    """
    if cfg.model.name in CONV_NETS:
        return BundleChoice(1, f"{cfg.model.name} is a conv net: one client at a time on {device}")
    tasks, what = _tasks_a_hand_out(cfg)
    workers = max(1, workers)
    k = math.ceil(tasks / workers)
    cap = max(1, BUNDLE_PARAMETERS // max(1, model_size(cfg).parameters))
    why = f"dense model on {device}: {tasks} {what} over {workers} worker{'s' if workers != 1 else ''}"
    if k > cap:
        return BundleChoice(cap, f"{why}, at most {cap} stacked models of {cfg.model.name}")
    return BundleChoice(k, why)


def _tasks_a_hand_out(cfg: Scenario) -> tuple[int, str]:
    """The tasks the server hands out at once: a round's; a buffered version's (FedBuff's K freed
    slots); one at a time in async mode."""
    if cfg.round.mode == RoundMode.BUFFERED:
        return cfg.buffered.k, "tasks a version (buffered.k)"
    if cfg.round.mode == RoundMode.ASYNC:
        return 1, "task at a time (round.mode=async)"
    return clients_per_round(cfg), "clients a round"


def with_bundle(cfg: Scenario, placed: Placement) -> tuple[Scenario, BundleChoice | None]:
    """`cfg` with train.bundle = auto replaced by the K it chooses for workers `placed` so (a run's
    resolved scenario, which run.json keeps and a resume reads), and the choice; `cfg` itself and
    None for an explicit K. The workers counted are the server's own and those it waits for
    (transport.min_workers)."""
    if bundle_size(cfg.train.bundle) is not None:
        return cfg, None
    choice = choose_bundle(cfg, placed.device, max(placed.local_workers, cfg.transport.min_workers))
    return replace(cfg, train=replace(cfg.train, bundle=str(choice.k))), choice

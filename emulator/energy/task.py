"""The energy of one client's task, a pure function of its timeline (`ClientTimeline`) and its device's
power: the radio while the model comes down and the update goes up, the radio's tail after each, and the
processor while it trains.

Phases, as the clock times them: the download from its start (latency included) to its end, or to the
moment it was cut (late, or the client left); training from the download's end to the compute's end (or
the cut); the upload from the compute's end to its arrival, loss or cut. A transfer that completed moved
all its bytes, one lost on the way too; a cut one moved the bits the clock says crossed before the cut.
The tail after the download lasts until the upload starts (at most `tail_s`); the one after the last
transfer is charged in full to the task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from emulator.energy.radio import RadioPower
from emulator.timemodel.clock import ClientTimeline, Outcome


@dataclass(frozen=True)
class TaskEnergy:
    """Joules of one task, by what drew them."""

    radio_down_j: float
    radio_up_j: float
    tail_j: float
    compute_j: float

    @property
    def total_j(self) -> float:
        return self.radio_down_j + self.radio_up_j + self.tail_j + self.compute_j


def task_energy(ct: ClientTimeline, radio: RadioPower, compute_w: float) -> TaskEnergy:
    """The energy of the task whose round ended as `ct` says, on `radio`, training at `compute_w` watts.

    Args:
        ct: the client's timeline, its round ended (an outcome and `t_end`).
        radio: its radio's power model.
        compute_w: watts its device draws while it trains.

    Returns:
        The joules of its download, upload, tails and training.
    """
    if ct.outcome is None or math.isnan(ct.t_end):
        raise ValueError(f"client {ct.client}: its round has not ended, so its energy is not known")
    start, down_done = ct.t_down_start, not math.isnan(ct.t_down_end)
    if ct.t_end == start and not ct.bytes_down:  # unavailable as its round started: nothing ran
        return TaskEnergy(0.0, 0.0, 0.0, 0.0)
    down_end = ct.t_down_end if down_done else ct.t_end
    down_bits = 8.0 * ct.bytes_down if down_done else ct.cut_bits
    radio_down = radio.transfer_j("down", down_end - start, down_bits)
    trained = down_done and ct.outcome not in (Outcome.LOST_DOWN, Outcome.FAILED)
    computed = not math.isnan(ct.t_compute_end)
    compute = compute_w * ((ct.t_compute_end if computed else ct.t_end) - ct.t_down_end) if trained else 0.0
    last_tail = 0.0 if ct.battery_empty else radio.tail_j(math.inf)  # an empty battery ends the radio's tail
    if not computed:
        tail = radio.tail_j(ct.t_end - down_end) if ct.battery_empty and down_done else last_tail
        return TaskEnergy(radio_down, 0.0, tail, compute)
    up_end = ct.t_up_end if not math.isnan(ct.t_up_end) else ct.t_end
    up_bits = ct.cut_bits if not math.isnan(ct.cut_bits) else 8.0 * ct.bytes_up
    radio_up = radio.transfer_j("up", up_end - ct.t_compute_end, up_bits)
    return TaskEnergy(radio_down, radio_up, radio.tail_j(ct.t_compute_end - down_end) + last_tail, compute)

"""A run's energy model: its clients' radio, their compute power and their batteries."""

from __future__ import annotations

from collections.abc import Sequence

from emulator.energy.battery import Batteries, per_client
from emulator.energy.radio import RADIOS
from emulator.energy.task import TaskEnergy, task_energy
from emulator.timemodel.clock import ClientTimeline
from emulator.timemodel.resources import ClientResources, Resources
from nodes.contracts.rng import stream
from nodes.contracts.schema import EnergyConfig, Radio


class Energy:
    """The energy model of a run's clients: one radio for all, each client's compute power drawn once
    from stream(seed, "energy") (a constant draws nothing and holds no array), and their batteries where
    energy.battery.enabled."""

    def __init__(
        self, cfg: EnergyConfig, n_clients: int, seed: int, resources: Resources | Sequence[ClientResources] = ()
    ):
        if cfg.radio == Radio.NONE:
            raise ValueError("energy.radio = none: energy is not modelled")
        self.radio = RADIOS[cfg.radio]
        self._compute_w = per_client(cfg.compute_w, n_clients, stream(seed, "energy"))
        self.batteries = (
            Batteries(cfg.battery, n_clients, seed, resources, self.radio, self.compute_w)
            if cfg.battery.enabled
            else None
        )

    @classmethod
    def of(
        cls, cfg: EnergyConfig, n_clients: int, seed: int, resources: Resources | Sequence[ClientResources] = ()
    ) -> Energy | None:
        """The run's model, None where energy.radio = none; `resources` are the clients' (their batteries
        recharge while they are unavailable)."""
        return None if cfg.radio == Radio.NONE else cls(cfg, n_clients, seed, resources)

    def compute_w(self, client: int) -> float:
        w = self._compute_w
        return w if isinstance(w, float) else float(w[client])

    def of_task(self, ct: ClientTimeline) -> TaskEnergy:
        return task_energy(ct, self.radio, self.compute_w(ct.client))

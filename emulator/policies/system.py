"""What a policy sees of the system: each client's resources as drawn for the run, and how its
rounds went (FedScale's per-client metadata plus Flower's `failures`, read-only).

The runtime owns an `OutcomeLog` and appends each round's outcomes once the round is over; a
policy reads them through `RunContext.clients[i].history` (every past round it was selected
in) and receives the round's own in `Policy.observe_outcomes`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, KeysView, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, overload

from emulator.timemodel.by_index import ByIndex
from emulator.timemodel.clock import Outcome
from emulator.timemodel.resources import ClientResources, Resources

NAN = float("nan")


@dataclass(frozen=True)
class ClientOutcome:
    """One selected client's round as the clock decided it (its `RoundTimeline.clients[c]`)."""

    round: int
    client: int
    outcome: str  # arrived | late | lost_down | lost_up | failed | implausible (rejected: aggregate.max_update_norm)
    t_down_start: float
    t_down_end: float
    t_compute_end: float
    t_up_end: float
    train_loss: float  # as the client reported it; NaN unless its update arrived

    @property
    def arrived(self) -> bool:
        return self.outcome == Outcome.ARRIVED

    @property
    def duration_s(self) -> float:
        """Download start to upload end, as observed; NaN unless the update arrived."""
        return self.t_up_end - self.t_down_start if self.arrived else NAN


class History(Sequence[ClientOutcome]):
    """A read-only view of one client's outcomes, oldest first; it grows as the run goes."""

    def __init__(self, by_client: dict[int, list[ClientOutcome]], client: int):
        self._by_client, self._client = by_client, client

    @property
    def _outcomes(self) -> list[ClientOutcome]:
        return self._by_client.get(self._client, [])

    @overload
    def __getitem__(self, k: int) -> ClientOutcome: ...
    @overload
    def __getitem__(self, k: slice) -> list[ClientOutcome]: ...

    def __getitem__(self, k: int | slice) -> ClientOutcome | list[ClientOutcome]:
        return self._outcomes[k]

    def __len__(self) -> int:
        return len(self._outcomes)

    @property
    def arrivals(self) -> int:
        return sum(o.arrived for o in self._outcomes)

    def last_arrived(self) -> ClientOutcome | None:
        return next((o for o in reversed(self._outcomes) if o.arrived), None)


@dataclass(frozen=True)
class ClientInfo:
    """One client as drawn for the run: its data, link (nominal rates, before any schedule or
    shared-link contention) and compute speed, and a view of its outcome history."""

    client: int
    data_size: int
    down_bps: float
    up_bps: float
    latency_s: float
    step_s: float  # virtual seconds per local step
    trace: str  # the bandwidth trace its link follows, "" for a nominal link
    history: History = field(compare=False, repr=False)
    resources: ClientResources | None = field(default=None, compare=False, repr=False)  # None: nominal only

    def estimated_round_s(self, bytes_down: int, steps: int, bytes_up: int, up_share_bps: float = math.inf) -> float:
        """Download + compute + upload at this view's rates, each transfer after one latency;
        `up_share_bps` caps the upload rate (a share of a server link). inf over a link at 0 bits/s."""
        return (
            2 * self.latency_s
            + _seconds(8.0 * bytes_down, self.down_bps)
            + steps * self.step_s
            + _seconds(8.0 * bytes_up, min(self.up_bps, up_share_bps))
        )

    def reported(self, t: float, window_s: float) -> ClientInfo:
        """The client as it describes itself when asked at virtual time t (FedCS's resource request):
        each link at the rate it delivered over the last `window_s` seconds, the device at its
        current speed. A measurement of the past, not a forecast: a trace may change right after."""
        if self.resources is None:
            return self
        r = self.resources
        return replace(
            self,
            down_bps=r.down.mean_rate(t - window_s, t),
            up_bps=r.up.mean_rate(t - window_s, t),
            step_s=r.step_seconds_at(t),
        )

    def table_row(self) -> dict[str, int | float | str]:
        """This client's row of the run's `clients` table (results.CLIENTS_SCHEMA)."""
        return {
            "client": self.client,
            "data_size": self.data_size,
            "down_bps": self.down_bps,
            "up_bps": self.up_bps,
            "latency_s": self.latency_s,
            "step_s": self.step_s,
            "trace": self.trace,
        }


def _seconds(bits: float, bps: float) -> float:
    return bits / bps if bps > 0 else math.inf


class OutcomeLog:
    """The runtime's side of the histories: a list per client selected so far, appended to after each round."""

    def __init__(self, n_clients: int):
        self.n = n_clients
        self._by_client: dict[int, list[ClientOutcome]] = {}  # a client never selected has none

    def extend(self, outcomes: Iterable[ClientOutcome]) -> None:
        for o in outcomes:
            self._by_client.setdefault(o.client, []).append(o)

    def history(self, client: int) -> History:
        return History(self._by_client, client)

    def selected(self) -> KeysView[int]:
        """The clients selected so far: those with a history."""
        return self._by_client.keys()


class ClientViews(ByIndex[ClientInfo]):
    """The per-client view of `emulator.timemodel.resources.build_resources`'s draw for this run, each client's made
    when asked for: a run of a million clients holds views (and resources) only of those it reads."""

    def __init__(self, resources: Sequence[ClientResources], data_sizes: Sequence[int], log: OutcomeLog):
        self.resources, self.data_sizes, self.log = resources, data_sizes, log

    def __len__(self) -> int:
        return len(self.resources)

    def _at(self, i: int) -> ClientInfo:
        return self._view(self.resources[i])

    def __iter__(self) -> Iterator[ClientInfo]:
        return (self._view(r) for r in self.resources)

    def table_columns(self, size: int) -> Iterator[dict[str, Any]]:
        """The `clients` table's columns (ClientInfo.table_row's), `size` clients at a time: from the drawn
        arrays when no link follows a trace (each view's values, with no view made), else view by view."""
        r, n = self.resources, len(self)
        if isinstance(r, Resources) and not r.links_traced:
            for at in range(0, n, size):
                end = min(at + size, n)
                yield {
                    "client": range(at, end),
                    "data_size": self.data_sizes[at:end],
                    "down_bps": r.down[at:end],
                    "up_bps": r.up[at:end],
                    "latency_s": r.latency[at:end],
                    "step_s": r.step[at:end],
                    "trace": [""] * (end - at),
                }
            return
        for at in range(0, n, size):
            rows = [self._view(r[i]).table_row() for i in range(at, min(at + size, n))]
            yield {key: [row[key] for row in rows] for key in rows[0]}

    def _view(self, r: ClientResources) -> ClientInfo:
        return ClientInfo(
            client=r.client_id,
            data_size=int(self.data_sizes[r.client_id]),
            down_bps=r.down.bps,
            up_bps=r.up.bps,
            latency_s=r.latency_s,
            step_s=r.step_s,
            trace=r.trace,
            history=self.log.history(r.client_id),
            resources=r,
        )


def histories(clients: Sequence[ClientInfo]) -> dict[int, History]:
    """The history of each client selected so far, by id: of a run's ClientViews read from its log, with no
    view made of the others (a round of a million-client run reads its selected clients' only); of any
    other sequence, by reading each client's."""
    if isinstance(clients, ClientViews):
        return {c: clients.log.history(c) for c in clients.log.selected()}
    return {c.client: c.history for c in clients if c.history}


def client_infos(resources: Sequence[ClientResources], data_sizes: Sequence[int], log: OutcomeLog) -> ClientViews:
    """The per-client view of `emulator.timemodel.resources.build_resources`'s draw for this run."""
    return ClientViews(resources, data_sizes, log)

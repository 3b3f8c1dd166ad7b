"""A local slot whose worker refused the run's setup (nodes.transport.inbound.Unfit) is retired at once, not
restarted: the setup would be refused alike. When no worker is left, the run's one line names what it said."""

from __future__ import annotations

import pytest

from emulator.config import load
from nodes.transport.dispatch import Dispatcher
from nodes.transport.roster import Roster, Worker
from nodes.transport.supervisor import Supervisor

SAID = "setup_failed: FileNotFoundError: dataset fashion_mnist: train-images-idx3-ubyte.gz not found"


class Proc:
    """A local worker's process that is still running until the supervisor kills it."""

    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None
        return self.returncode


@pytest.fixture
def supervisor(monkeypatch):
    """A Supervisor of `n` local slots (already started) that records each restart instead of spawning it."""

    def make(n: int, max_restarts: int) -> tuple[Supervisor, list[int]]:
        roster = Roster()
        s = Supervisor(
            load(None, [f"transport.max_restarts={max_restarts}"]).transport, roster, None, Dispatcher(roster)
        )
        s.restarts = [0] * n
        spawned: list[int] = []
        monkeypatch.setattr(s, "_spawn", spawned.append)
        for slot in range(n):
            roster.add(Worker(ident=f"local-{slot}.0".encode(), proc=Proc(), slot=slot, local=True))
        return s, spawned

    return make


def refuse(s: Supervisor, slot: int, said: str = SAID) -> None:
    w = s.roster[f"local-{slot}.0".encode()]
    s.bury(w, "refused", f"worker {w.name} rejected the setup, which the server's own check passes: {said}", said)


def test_slots_whose_workers_refused_the_setup_are_retired_at_once_and_the_last_line_says_why(supervisor):
    s, spawned = supervisor(2, max_restarts=3)
    refuse(s, 0)
    refuse(s, 1)
    assert spawned == [] and not s.roster  # no restart, though 3 were allowed
    d = s.deaths
    assert (d.worker_deaths, d.death_causes, d.restarts, d.retired_slots) == (2, {"refused": 2}, 0, [0, 1])
    assert (
        s.no_workers_message()
        == f"no workers left: every local worker refused the setup ({SAID}), and no remote worker is ready"
    )


def test_a_crash_is_still_restarted_and_the_line_names_refusals_and_used_up_slots_apart(supervisor):
    s, spawned = supervisor(3, max_restarts=0)
    s.bury(s.roster[b"local-0.0"], "died", "worker local-0.0 died (exit -9)")
    refuse(s, 1)
    refuse(s, 2, "unknown_codec: compression.kind = 'mine:Codec': cannot import mine")
    assert spawned == [] and s.deaths.retired_slots == [0, 1, 2]
    assert s.no_workers_message() == (
        f"no workers left: local worker slots [1, 2] refused the setup ({SAID}; "
        "other slots said otherwise: see the log); "
        "local worker slots [0] each failed more than transport.max_restarts = 0 times, and no remote worker is ready"
    )
    s, spawned = supervisor(1, max_restarts=1)
    s.bury(s.roster[b"local-0.0"], "died", "worker local-0.0 died (exit -9)")
    assert spawned == [0] and s.deaths.restarts == 1 and not s.deaths.retired_slots

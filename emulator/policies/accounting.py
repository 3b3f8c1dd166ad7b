"""Per-client privacy accounting: the runtime's only view of privacy.

The runtime asks an `Accountant` who may take part, whether a task keeps its client within
budget, charges the clients that trained, and records epsilon per client per round (after
Opacus's `IAccountant`, per client). Which theorem turns a client's history into epsilon is the
policy's business: each policy declares its accountant (`Policy.make_accountant`), and the
accountant's `mechanism` tag travels with its state, so a checkpoint's history is never read
by another mechanism's theorem:

* `RdpAccountant` (default): sample-level DP-SGD, one `PrivacyLedger` per client of
  (q, sigma, steps) runs, so changing sigma or q composes (ALI-DPFL Definition 3), read by the
  scenario's dp.accountant: rdp (its name's), prv, pld or a user's theorem; its tag is that
  accountant's. The ledgers are the mechanism's history, not any theorem's, so each accountant
  reads the others' (`RdpAccountant.reads`). A run resumes under its run.json's scenario, so its
  own accountant; a ledger read under another accountant is accounted afresh by it, whole history
  and all (the rows already written keep the epsilons of the accountant that wrote them).
* `ReleaseAccountant`: client-level output perturbation; every upload is one release of the
  model with noise scale s, and the policy's mechanism maps a client's released scales to
  epsilon (Fu Thm 1-2, Talaei eq. 8, Wei eq. 29).
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from emulator.formats import encoded_json
from emulator.privacy import ACCOUNTANTS, PrivacyLedger, epsilon, theorem
from emulator.timemodel.by_index import Without

if TYPE_CHECKING:
    from nodes.contracts.schema import DPConfig
    from nodes.contracts.tasks import ClientTask

# Calibrations spend the budget exactly, so the last release lands on the target up to rounding.
REL_TOL = 1e-9


def privacy_row(
    client: int, epsilon: float, ledger: dict[str, Any], epsilon_unamplified: float | None = None
) -> dict[str, Any]:
    """A client's row of the run's privacy table (emulator.output.results.PRIVACY_SCHEMA): its epsilon and what
    its accountant charged it (`ledger`, JSON)."""
    return {
        "client": client,
        "epsilon": epsilon,
        "epsilon_unamplified": epsilon_unamplified,
        "ledger": json.dumps(ledger, sort_keys=True),
    }


class MechanismMismatch(ValueError):
    """A checkpoint's privacy history was written by another mechanism than the policy's."""


class Accountant(ABC):
    def __init__(self, target: float, mechanism: str):
        self.target = target  # per-client epsilon budget (inf = unlimited)
        self.mechanism = mechanism  # which theorem reads the history, e.g. "rdp"

    @abstractmethod
    def epsilon(self, client: int) -> float:
        """Epsilon the client has spent so far."""

    @abstractmethod
    def epsilon_after(self, task: ClientTask) -> float:
        """Epsilon the task's client would have spent once the task ran."""

    @abstractmethod
    def eligible(self, client: int) -> bool:
        """May the client be offered any task at all?"""

    def allows(self, task: ClientTask) -> bool:
        return not math.isfinite(self.target) or self.epsilon_after(task) <= self.target

    def eligible_clients(self, n: int) -> Sequence[int]:
        """The clients `eligible` admits, in id order, of n. An accountant whose clients never charged
        share one answer says so in O(clients charged) (`RdpAccountant`)."""
        return [i for i in range(n) if self.eligible(i)]

    def max_epsilon(self, n: int) -> float:
        """The most any of the n clients has spent (the rounds table's max_epsilon)."""
        return max(self.epsilon(i) for i in range(n))

    @abstractmethod
    def charge(self, trained: Sequence[ClientTask]) -> None:
        """A round is over: the tasks of the clients that received the model and trained."""

    @abstractmethod
    def client_rows(self) -> Iterator[dict[str, Any]]:
        """Per client charged, its row of the run's privacy table (`privacy_row`), in id order."""

    def run_privacy(self) -> dict[str, Any]:
        """run.json's privacy beside the table: what is not per client (here nothing)."""
        return {}

    @abstractmethod
    def history(self) -> dict[str, Any]:
        """The clients' histories as plain data (what state_dict keeps besides the tag)."""

    @abstractmethod
    def load_history(self, history: dict[str, Any]) -> None:
        """The inverse of `history`."""

    def state_dict(self) -> dict[str, Any]:
        """Plain data to resume from (checkpoints), tagged with the mechanism."""
        return {"mechanism": self.mechanism, **self.history()}

    def reads(self, tag: str) -> bool:
        """May this accountant read a history written under `tag`?"""
        return tag == self.mechanism

    def load_state_dict(self, state: dict[str, Any]) -> None:
        tag = state.get("mechanism", self.mechanism)  # checkpoints from before the tag hold none
        if not self.reads(tag):
            raise MechanismMismatch(
                f"the checkpoint's privacy ledger is of mechanism {tag!r}; this policy accounts with {self.mechanism!r}"
            )
        self.load_history({k: v for k, v in state.items() if k != "mechanism"})


class RdpAccountant(Accountant):
    """Sample-level DP-SGD: each client's (q, sigma, steps) history, read by dp.accountant (RDP by
    default, converted by dp.conversion; PRV; PLD; a user's: emulator.privacy.epsilon). Ledgers are
    kept for the clients that trained: every other client's is empty (epsilon 0), so per round the
    work is the charged clients', whatever clients.n.

    What the runtime asks every round of every client is kept per client and re-read from its ledger
    only when `charge` (or `load_history`) changes it: its epsilon, whether it affords a step, and its
    ledger's plain data for the checkpoint. Clients that spent the same epsilon are one count, so the
    most spent is a maximum over distinct epsilons. Change `ledgers` only through those two methods."""

    def __init__(self, dp: DPConfig, n_clients: int):
        super().__init__(dp.epsilon, dp.accountant)
        self.dp, self.n = dp, n_clients
        self.ledgers: dict[int, PrivacyLedger] = {}  # by client id, only clients that trained
        self._spent: dict[int, float] = {}  # each ledger's epsilon
        self._spent_count: Counter[float] = Counter()  # how many ledgers have spent each epsilon
        self._asked_at: float | None = None  # the target `eligible_clients` last asked at
        self._unasked: set[int] = set()  # charged since
        self._exhausted: set[int] = set()  # the others that cannot afford a step at that target
        self._documents: dict[str, dict[str, Any]] = {}  # each ledger with entries as `history` has it
        self._members: dict[str, str] = {}  # each of those as a member of the checkpoint's JSON map ("id": ledger)

    def reads(self, tag: str) -> bool:
        """DP-SGD's ledgers are tagged with the dp.accountant that read them; any of them reads any other's."""
        return ACCOUNTANTS.admits(tag)

    def _eps(self, history: list[tuple[float, float, int]]) -> float:
        return epsilon(history, self.dp.delta, self.dp.conversion, accountant=self.dp.accountant)

    def _history(self, client: int) -> list[tuple[float, float, int]]:
        ledger = self.ledgers.get(client)
        return ledger.history() if ledger is not None else []

    def epsilon(self, client: int) -> float:
        spent = self._spent.get(client)
        return spent if spent is not None else self._eps([])

    def epsilon_after(self, task: ClientTask) -> float:
        return self._eps(self._history(task.client) + [(task.q, task.sigma, task.steps)])

    def eligible(self, client: int) -> bool:
        return self._affords(self._history(client))

    def _affords(self, history: list[tuple[float, float, int]]) -> bool:
        """Can a client of this history still afford one DP-SGD step at the scenario's (q, sigma)?"""
        if not math.isfinite(self.target):
            return True
        after = history + [(self.dp.q, self.dp.sigma, 1)]
        if theorem(self.dp.accountant).at_most_rdp and epsilon(after, self.dp.delta) <= self.target:
            # RDP's epsilon, far cheaper (python -m bench.accountants), is an upper bound above PRV's and
            # PLD's: a step it affords, they afford; the history one step on is asked of them near the budget only
            return True
        return self._eps(after) <= self.target

    def eligible_clients(self, n: int) -> Sequence[int]:
        """Every client never charged shares the empty history's answer; a charged client's is asked once
        its ledger changed (or the target did), and kept."""
        if not math.isfinite(self.target):
            return range(n)
        if self._asked_at != self.target:
            self._asked_at, self._unasked, self._exhausted = self.target, set(self._spent), set()
        self._exhausted.update(c for c in self._unasked if not self._affords(self._history(c)))
        self._unasked = set()
        exhausted = sorted(c for c in self._exhausted if c < n)
        if self._affords([]):
            return Excluding(n, exhausted)
        return [c for c in sorted(self._spent) if c < n and c not in self._exhausted]

    def max_epsilon(self, n: int) -> float:
        """The largest of the distinct epsilons the charged clients spent, and 0 if some client never was."""
        if n >= self.n:
            spent, charged = list(self._spent_count), len(self._spent)
        else:
            spent = [e for c, e in self._spent.items() if c < n]
            charged = len(spent)
        never = [self._eps([])] if charged < n else []
        return max(spent + never)

    def charge(self, trained: Sequence[ClientTask]) -> None:
        for t in trained:
            self.ledgers.setdefault(t.client, PrivacyLedger()).record(t.q, t.sigma, t.steps)
        self._reread({t.client for t in trained})

    def _reread(self, clients: Iterable[int]) -> None:
        """Keep what is asked of these clients' ledgers, which have changed, as their ledgers now say."""
        for c in clients:
            ledger = self.ledgers[c]
            old = self._spent.get(c)
            if old is not None:
                self._spent_count[old] -= 1
                if not self._spent_count[old]:
                    del self._spent_count[old]
            self._spent[c] = spent = self._eps(ledger.history())
            self._spent_count[spent] += 1
            self._unasked.add(c)
            self._exhausted.discard(c)
            if ledger.entries:
                key, document = str(c), ledger.to_dict()
                self._documents[key] = document
                self._members[key] = encoded_json.member(key, document)

    def client_rows(self) -> Iterator[dict[str, Any]]:
        """The clients that trained: their (q, sigma, steps) runs."""
        for i in sorted(self.ledgers):
            yield privacy_row(i, self.epsilon(i), self.ledgers[i].to_dict())

    def history(self) -> dict[str, Any]:
        """The ledgers of the clients that trained, keyed by id as text (JSON's keys), as plain data kept
        since each was last charged (read-only), with their JSON text: the checkpoint, taken as every round
        ends, encodes only the ledgers charged since it was last taken (emulator.formats.encoded_json)."""
        return {"ledgers": encoded_json.EncodedMap(self._documents, encoded_json.joined(self._members.values()))}

    def load_history(self, history: dict[str, Any]) -> None:
        ledgers = by_client("ledgers", history["ledgers"], self.n)
        self.ledgers = {c: PrivacyLedger.from_dict(d) for c, d in ledgers.items()}
        self._spent, self._spent_count, self._asked_at = {}, Counter(), None
        self._documents, self._members = {}, {}
        self._reread(sorted(self.ledgers))


class Excluding(Without):
    """The ids 0..n-1 but a sorted few, in order, without a list of n: what `eligible_clients` offers
    the policy when nearly every client is eligible (indexing by bisection over the excluded)."""

    def __init__(self, n: int, excluded: list[int]):
        super().__init__(range(n), excluded)
        self.n, self.excluded, self.excluded_set = n, excluded, set(excluded)

    def __iter__(self) -> Iterator[int]:
        return (c for c in range(self.n) if c not in self.excluded_set)

    def __contains__(self, c: object) -> bool:
        return isinstance(c, int) and 0 <= c < self.n and c not in self.excluded_set


class ReleaseAccountant(Accountant):
    """Client-level output perturbation: `epsilon_of(client, scales)` is the mechanism's
    composition theorem over the noise scales of the client's releases so far, 0 for none.

    It keeps the releases of the clients that released only (`released`, by id): every other client has
    spent nothing and is eligible, and `eligible_clients` / `max_epsilon` answer for them all at once."""

    def __init__(
        self, target: float, n_clients: int, epsilon_of: Callable[[int, Sequence[float]], float], mechanism: str
    ):
        super().__init__(target, mechanism)
        self.n, self.epsilon_of = n_clients, epsilon_of
        self.released: dict[int, list[float]] = {}  # the noise scales of each client's releases, by id

    def scales(self, client: int) -> list[float]:
        """The noise scales of the client's releases so far."""
        return self.released.get(client, [])

    def epsilon(self, client: int) -> float:
        return self.epsilon_of(client, self.scales(client))

    def epsilon_after(self, task: ClientTask) -> float:
        return self.epsilon_of(task.client, self.scales(task.client) + [task.output_noise_scale])

    def eligible_clients(self, n: int) -> Sequence[int]:
        """A client that never released has spent 0, below any target: only those that released are asked."""
        if not math.isfinite(self.target):
            return range(n)
        return Excluding(n, sorted(c for c in self.released if c < n and not self.eligible(c)))

    def max_epsilon(self, n: int) -> float:
        spent = [self.epsilon(c) for c in self.released if c < n]
        return max(spent + ([0.0] if len(spent) < n else []))

    def eligible(self, client: int) -> bool:
        return not math.isfinite(self.target) or self.epsilon(client) < self.target * (1 - REL_TOL)

    def allows(self, task: ClientTask) -> bool:
        return not math.isfinite(self.target) or self.epsilon_after(task) <= self.target * (1 + REL_TOL)

    def charge(self, trained: Sequence[ClientTask]) -> None:
        for t in trained:
            self.released.setdefault(t.client, []).append(t.output_noise_scale)

    def client_rows(self) -> Iterator[dict[str, Any]]:
        """The clients that released: the noise scales of their releases."""
        for i in sorted(self.released):
            yield privacy_row(i, self.epsilon(i), {"released_noise_scales": self.released[i]})

    def history(self) -> dict[str, Any]:
        """The releases of the clients that released, keyed by id as text (JSON's keys)."""
        return {"released": {str(c): scales for c, scales in sorted(self.released.items())}}

    def load_history(self, history: dict[str, Any]) -> None:
        released = by_client("released", history["released"], self.n)
        self.released = {c: [float(s) for s in scales] for c, scales in released.items()}


def by_client(key: str, histories: Any, n_clients: int) -> dict[int, Any]:
    """A checkpoint's map of client id (as text, below clients.n) to its history, by int id: another id would
    fail a later round, or charge a client the run lacks."""
    if not (
        isinstance(histories, dict)
        and all(isinstance(k, str) and k.isdigit() and int(k) < n_clients for k in histories)
    ):
        raise ValueError(f"accountant.{key}: expected a map of client id (below {n_clients}, clients.n) to history")
    return {int(k): v for k, v in histories.items()}

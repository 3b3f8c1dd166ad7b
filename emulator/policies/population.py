"""Client-level DP of a sampled population (DP-FedAvg, McMahan et al. 2018): one ledger for everyone.

Each round the server releases the sum of the sampled clients' clipped updates plus Gaussian noise of
z times the clip: the subsampled Gaussian mechanism over clients, composed over rounds (McMahan et al.
Thm 1, by the moments accountant). Every client is in every round's population, selected or not, so
every client's epsilon is the population's (user-level DP holds for every user), read by the
scenario's dp.accountant:

* Poisson sampling (each client independently with q): add-or-remove-one neighbours, the ledger's
  (q, z, rounds) runs read as DP-SGD's are (emulator.privacy.epsilon: rdp, prv, pld or a user's);
* fixed-size sampling (K of N without replacement): replace-one neighbours (N is public), dp_accounting's
  RDP of SampledWithoutReplacementDpEvent (Wang, Balle & Kasiviswanathan 2019, Thm 27). Replacing one
  client's update moves the clipped sum by up to 2S, so the Gaussian's multiplier for that
  sensitivity is z / 2.

Amplification by sampling holds only if the server's random draw alone decided who took part. Beside
the amplified figure, each client's epsilon without it is kept: q = 1 in every round the client
trained in, nothing for the others, which holds whatever availability, deadlines and losses did.
Why the amplified figure does not hold (`amplification_invalid`, from `participation_caveat`), and
the rounds whose aggregate lacked some of its noise (`short_rounds`: local noise from clients that
did not arrive), are kept with the ledger and written to run.json. `calibrated_noise_multiplier`
is the z that spends a budget in a number of rounds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from emulator.policies.accounting import Accountant, by_client, privacy_row
from emulator.privacy import PrivacyLedger, check_delta, epsilon
from emulator.privacy.rdp import DEFAULT_ORDERS
from nodes.contracts.plugins import is_user_class
from nodes.contracts.schema import MAX_PARAMETER, AvailabilityModel, Choice, DPConfig

if TYPE_CHECKING:
    from nodes.contracts.schema import AvailabilityConfig, BudgetConfig, ComputeConfig, LinksConfig, RoundConfig
    from nodes.contracts.tasks import ClientTask

# Calibrated z: the bisection stops when its bracket is this narrow, relative to z.
Z_REL_TOL = 1e-3
# The largest z calibration tries: dp_fedavg.noise_multiplier's range. A budget no z up to it reaches is
# refused at start (`calibration_problem`): each accountant has a floor that no noise gets below (RDP's
# conversion over Opacus's orders, about 0.1 at delta = 1e-5; PRV's eps_error, 0.01), and past it the
# bisection's doubling z would overflow (z^2 past 1e308).
Z_MAX = MAX_PARAMETER


class Sampling(Choice):
    POISSON = "poisson"  # each client independently with probability q
    FIXED = "fixed"  # K of N uniformly without replacement


@lru_cache(maxsize=1024)
def without_replacement_epsilon(n: int, k: int, z: float, rounds: int, delta: float) -> float:
    """(eps, delta) of `rounds` releases of K = k of N = n clients drawn without replacement, Gaussian
    noise z times the clip: dp_accounting's RdpAccountant (Opacus's orders, replace-one neighbours) of
    SelfComposed(SampledWithoutReplacement(n, k, Gaussian(z / 2)), rounds)."""
    delta = check_delta(delta)
    if rounds == 0:
        return 0.0
    if z == 0.0:
        return math.inf
    import dp_accounting  # the [pld] extra: DpFedAvg.check refuses sampling=fixed without it

    accountant = dp_accounting.rdp.RdpAccountant(
        orders=DEFAULT_ORDERS, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    one = dp_accounting.SampledWithoutReplacementDpEvent(n, k, dp_accounting.GaussianDpEvent(z / 2))
    accountant.compose(dp_accounting.SelfComposedDpEvent(one, rounds))
    return float(accountant.get_epsilon(delta))


class PopulationAccountant(Accountant):
    """The population's ledger of released rounds (q, z, rounds) and each client's count of rounds
    trained in. `epsilon` is the amplified figure (the rounds table's max_epsilon, the budget's);
    `unamplified` the other."""

    def __init__(
        self, dp: DPConfig, n_clients: int, sampling: str, q: float, k: int, z: float, amplification_invalid: str = ""
    ):
        super().__init__(dp.epsilon, f"dp_fedavg_{sampling}")
        self.dp, self.n, self.sampling, self.q, self.k, self.z = dp, n_clients, sampling, q, k, z
        self.ledger = PrivacyLedger()
        self.trained: Counter[int] = Counter()  # rounds each client trained in, by id: those that did only
        self.amplification_invalid = amplification_invalid  # why the amplified figure does not hold ("" = it does)
        self.short_rounds: list[int] = []  # rounds whose aggregate carried less noise than z's

    def population_epsilon(self, rounds: int) -> float:
        if self.sampling == Sampling.FIXED:
            return without_replacement_epsilon(self.n, self.k, self.z, rounds, self.dp.delta)
        return self._gaussian([(self.q, self.z, rounds)])

    def _gaussian(self, history: list[tuple[float, float, int]]) -> float:
        return epsilon(history, self.dp.delta, self.dp.conversion, accountant=self.dp.accountant)

    def epsilon(self, client: int) -> float:
        return self.population_epsilon(self.ledger.steps())

    def epsilon_after(self, task: ClientTask) -> float:
        return self.population_epsilon(self.ledger.steps() + 1)

    def eligible(self, client: int) -> bool:
        """Everyone or no one: one more round spends the same for every client."""
        return not math.isfinite(self.target) or self.population_epsilon(self.ledger.steps() + 1) <= self.target

    def eligible_clients(self, n: int) -> Sequence[int]:
        return range(n) if self.eligible(0) else []

    def max_epsilon(self, n: int) -> float:
        """Every client's is the population's."""
        return self.epsilon(0)

    def charge(self, trained: Sequence[ClientTask]) -> None:
        """A released round: one more for the population, and one trained in for each of `trained`."""
        self.ledger.record(self.q, self.z, 1)
        for t in trained:
            self.trained[t.client] += 1

    def unamplified(self, client: int) -> float:
        return self.unamplified_of(self.trained[client])

    def unamplified_of(self, rounds_trained: int) -> float:
        """Epsilon without amplification by sampling: the Gaussian mechanism (q = 1) in each round the
        client trained in; a late or lost update reached no aggregate, so counting it errs on the safe side."""
        z = self.z / 2 if self.sampling == Sampling.FIXED else self.z  # the same neighbours as the ledger's
        return self._gaussian([(1.0, z, rounds_trained)])

    def unamplified_max(self) -> float:
        """The largest over clients: that of the most rounds trained in (epsilon grows with them)."""
        return self.unamplified_of(max(self.trained.values(), default=0))

    def valid(self) -> bool:
        """Does the amplified figure hold (and every round carry the noise it is accounted with)?"""
        return not self.amplification_invalid and not self.short_rounds

    def summary(self) -> dict[str, Any]:
        """run.json's privacy.population: both figures and whether each holds."""
        short = (
            f"local noise: {len(self.short_rounds)} rounds lacked the noise of clients that did not arrive "
            f"(the first: {self.short_rounds[0]}), so neither figure holds for them"
            if self.short_rounds
            else ""
        )
        return {
            "sampling": self.sampling,
            "q": self.q,
            "noise_multiplier": self.z,
            "rounds": self.ledger.steps(),
            "delta": self.dp.delta,
            "accountant": self.dp.accountant,
            "epsilon_amplified": self.epsilon(0),
            "amplification_valid": not self.amplification_invalid,
            "amplification_invalid_reason": self.amplification_invalid,
            "epsilon_unamplified_max": self.unamplified_max(),
            "noise_complete": not self.short_rounds,
            "noise_short_reason": short,
        }

    def client_rows(self) -> Iterator[dict[str, Any]]:
        """The clients that trained: the rounds they trained in, and both epsilons (every client, trained or
        not, has the amplified one: run_privacy's population figures)."""
        amplified = self.epsilon(0)
        for i in sorted(self.trained):
            yield privacy_row(i, amplified, {"rounds_trained": self.trained[i]}, self.unamplified(i))

    def run_privacy(self) -> dict[str, Any]:
        """The population's figures."""
        return {"population": self.summary()}

    def history(self) -> dict[str, Any]:
        return {
            "ledger": self.ledger.to_dict(),
            "trained": {str(c): k for c, k in sorted(self.trained.items())},
            "amplification_invalid": self.amplification_invalid,
            "short_rounds": list(self.short_rounds),
        }

    def load_history(self, history: dict[str, Any]) -> None:
        trained = by_client("trained", history["trained"], self.n)
        self.ledger = PrivacyLedger.from_dict(history["ledger"])
        self.trained = Counter({c: int(k) for c, k in trained.items()})
        self.amplification_invalid = str(history["amplification_invalid"])
        self.short_rounds = [int(r) for r in history["short_rounds"]]


def calibrated_noise_multiplier(dp: DPConfig, n: int, sampling: str, q: float, k: int, rounds: int) -> float:
    """The smallest z (within Z_REL_TOL) at which `rounds` released rounds spend at most dp.epsilon under
    dp.accountant, as McMahan et al. choose z for a budget; 0 (no noise) for an unlimited budget. A budget
    no z up to Z_MAX reaches is a ValueError saying so (`calibration_problem`, which validation asks first)."""
    return _calibrated(dp.epsilon, dp.delta, dp.accountant, dp.conversion, n, sampling, q, k, rounds)


def calibration_problem(dp: DPConfig, n: int, sampling: str, q: float, k: int, rounds: int) -> str:
    """Why no noise multiplier up to Z_MAX spends at most dp.epsilon in `rounds` rounds ('' when one does),
    as the end of a line `dp.epsilon = ...: ...`."""
    if not math.isfinite(dp.epsilon):
        return ""
    z = 1.0  # the z's `_calibrated` doubles through, so that its answers are the accountant's kept ones
    while (least := PopulationAccountant(dp, n, sampling, q, k, z).population_epsilon(rounds)) > dp.epsilon:
        if z >= Z_MAX:
            break
        z = min(2 * z, Z_MAX)
    else:
        return ""
    return (
        f"a budget dp_fedavg can calibrate noise to: it needs a noise multiplier above {Z_MAX:g}, as {rounds} "
        f"rounds at q = {q:g} spend {least:.3g} even at z = {Z_MAX:g} under dp.accountant={dp.accountant} "
        f"(its floor at dp.delta = {dp.delta:g}); raise dp.epsilon"
        + (", or use dp.accountant=pld" if dp.accountant != "pld" else "")
    )


@lru_cache(maxsize=64)
def _calibrated(
    target: float, delta: float, accountant: str, conversion: str, n: int, sampling: str, q: float, k: int, rounds: int
) -> float:
    if not math.isfinite(target):
        return 0.0
    dp = DPConfig(epsilon=target, delta=delta, accountant=accountant, conversion=conversion)
    problem = calibration_problem(dp, n, sampling, q, k, rounds)
    if problem:
        raise ValueError(f"dp.epsilon = {target!r}: expected {problem}")

    def spends(z: float) -> float:
        return PopulationAccountant(dp, n, sampling, q, k, z).population_epsilon(rounds)

    lo, hi = 0.0, 1.0  # epsilon falls as z grows: spends(lo) > target >= spends(hi) throughout
    while spends(hi) > target:  # spends(Z_MAX) <= target: ends by hi = Z_MAX
        lo, hi = hi, min(2 * hi, Z_MAX)
    while hi - lo > Z_REL_TOL * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if spends(mid) > target else (lo, mid)
    return hi


def participation_caveat(
    availability: AvailabilityConfig,
    links: LinksConfig,
    compute: ComputeConfig,
    round_: RoundConfig,
    budget: BudgetConfig,
) -> str:
    """Why the scenario breaks what amplification by sampling assumes ('' when it does not): that the
    server's random draw alone decided whose update reached the aggregate, each drawn client's kept or
    lost independently of who else was drawn. Availability decides who can be drawn; a deadline decides
    which updates count, and where an update's time depends on the other clients drawn (a shared server
    link) or on the virtual time that earlier draws left (rates that vary in time, scheduled outages, a
    user's loss model, which sees each transfer's times), so does the draw of the others."""
    if availability.model != AvailabilityModel.ALWAYS:
        return (
            f"availability.model={availability.model}: who could be selected depended on availability, "
            "not only on the server's random draw"
        )
    if links.dropout.outages:
        return (
            "links.dropout.outages: whether an update was lost depended on the virtual time, which the "
            "earlier rounds' draws moved"
        )
    if is_user_class(links.dropout.model):
        return (
            f"links.dropout.model={links.dropout.model}: a user's loss model sees each transfer's virtual time, "
            "which the earlier rounds' draws moved"
        )
    deadline = "round.deadline_s" if math.isfinite(round_.deadline_s) else "budget.time_s"
    if not (math.isfinite(round_.deadline_s) or math.isfinite(budget.time_s)):
        return ""
    if links.server_down_bps or links.server_up_bps:
        return (
            f"{deadline} with a shared server link (links.server_down_bps / server_up_bps): whether an update "
            "beat the deadline depended on the other clients drawn"
        )
    varying = [
        key
        for key, on in (
            ("links.schedule", links.schedule),
            ("links.trace", links.trace.down or links.trace.up),
            ("compute.schedule", compute.schedule),
            ("compute.trace", compute.trace.files),
        )
        if on
    ]
    if varying:
        return (
            f"{deadline} with {', '.join(varying)}: whether an update beat the deadline depended on the "
            "virtual time, which the earlier rounds' draws moved"
        )
    return ""

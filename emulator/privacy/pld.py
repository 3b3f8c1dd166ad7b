"""The pld accountant: Google's dp_accounting `PLDAccountant` (Koskela et al. 2020; Meiser & Mohammadi
2018; Doroshenko et al. 2022's connect-the-dots), a pessimistic privacy loss distribution at the
library's default discretisation 1e-4, add-or-remove-one neighbours (as Opacus's). It keeps each
history's composed PLD, so that one a run longer (a client's next round) composes only that run.
"""

from __future__ import annotations

import importlib.util
import math
from collections import OrderedDict
from functools import cache, lru_cache
from types import ModuleType
from typing import Any

import numpy as np

from emulator.privacy.base import Runs
from emulator.privacy.numerical import NumericalTheorem


def pld_installed() -> bool:
    """Is Google's dp_accounting importable (dp.accountant=pld)? Validation asks before a run."""
    return importlib.util.find_spec("dp_accounting") is not None


@cache
def _dp_accounting() -> ModuleType:
    if not pld_installed():
        raise ImportError(f"dp.accountant=pld needs Google's dp-accounting package ({PLD_INSTALL})")
    import dp_accounting  # optional: the [pld] extra

    mod: ModuleType = dp_accounting
    return mod


# PLD (dp_accounting PLDAccountant's default): the privacy loss's discretisation interval.
PLD_VALUE_DISCRETIZATION = 1e-4
PLD_INSTALL = "pip install 'dpfl-emulator[pld]'"


@lru_cache(maxsize=64)
def _pld_one_step(q: float, sigma: float) -> Any:
    # One step's discretised loss: dp_accounting's from_gaussian_mechanism, with the connect-the-dots
    # deltas computed over the grid at once (`_vector_gaussian_loss`: the same operations, so the same
    # bits; a test holds them equal) instead of one Python call per grid point. Kept per (q, sigma).
    dpa = _dp_accounting()
    pld = dpa.pld.privacy_loss_distribution
    loss = _vector_gaussian_loss()
    build = getattr(pld, "_create_pld_pmf_from_monotone_privacy_loss", None)
    subsampled = getattr(pld, "_pld_for_subsampled_mechanism", None)
    loss_adjacency = getattr(dpa.pld.privacy_loss_mechanism, "AdjacencyType", None)
    if loss is None or build is None or subsampled is None or loss_adjacency is None:  # another layout: its call
        return pld.from_gaussian_mechanism(
            standard_deviation=sigma,
            value_discretization_interval=PLD_VALUE_DISCRETIZATION,
            sampling_prob=q,
            neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
        )

    def single(adjacency: Any) -> Any:
        mechanism = loss(sigma, sampling_prob=q, adjacency_type=adjacency)
        dense = _connect_dots_pmf(mechanism)
        if dense is not None:
            return dense
        return build(mechanism, value_discretization_interval=PLD_VALUE_DISCRETIZATION, use_connect_dots=True)

    adjacencies = [loss_adjacency.REMOVE] if q == 1.0 else [loss_adjacency.REMOVE, loss_adjacency.ADD]
    pmfs = {adjacency: single(adjacency) for adjacency in adjacencies}
    return subsampled(pmfs.__getitem__, q)


def _connect_dots_pmf(mechanism: Any) -> Any:
    """The library's pessimistic connect-the-dots PMF of a continuous loss (_create_pld_pmf_from_monotone_privacy_loss
    with use_connect_dots, then create_pmf_pessimistic_connect_dots_fixed_gap), built from its array of probabilities:
    the library passes each grid point through a dict and back to a list (common.dictionary_to_list's loop), most of a
    one-step PLD's time at a small sigma; the same floats. None where the library's own call answers: a PMF it keeps
    sparse, deltas it refuses, or a layout of it not known."""
    pld_pmf = _dp_accounting().pld.pld_pmf
    dense, sparse_size = getattr(pld_pmf, "DensePLDPmf", None), getattr(pld_pmf, "_MAX_PMF_SPARSE_SIZE", None)
    tolerance = getattr(pld_pmf, "_DELTA_DIFF_TOLERANCE", None)
    if dense is None or sparse_size is None or tolerance is None or mechanism.is_discrete:
        return None
    d = PLD_VALUE_DISCRETIZATION
    bounds = mechanism.connect_dots_bounds()
    lower, upper = math.floor(bounds.epsilon_lower / d), math.ceil(bounds.epsilon_upper / d)
    if upper - lower + 1 <= sparse_size:
        return None
    deltas = np.asarray(mechanism.get_delta_for_epsilon(np.arange(lower, upper + 1) * d), dtype=np.float64)
    if np.any(deltas < 0) or np.any(deltas > 1) or np.any(np.diff(deltas) > tolerance):
        return None
    deltas = np.minimum.accumulate(deltas)
    diffs = np.diff(deltas)
    probs = np.zeros_like(deltas)
    probs[0] = 1 - deltas[0] + diffs[0] / math.expm1(d)
    probs[1:-1] = (diffs[1:] - diffs[:-1] * math.exp(d)) / math.expm1(d)
    probs[-1] = diffs[-1] / math.expm1(-d)
    return dense(d, lower, np.maximum(0.0, probs), deltas[-1], True)


@cache
def _vector_gaussian_loss() -> Any:
    """dp_accounting's GaussianPrivacyLoss whose get_delta_for_epsilon inverts the privacy loss of a
    whole array of epsilons at once: the library's scalar inverse_privacy_loss (and log_a_times_exp_b_plus_c)
    element for element, the same float operations. None if the library's layout is not the one known."""
    mech = _dp_accounting().pld.privacy_loss_mechanism
    base: Any = getattr(mech, "GaussianPrivacyLoss", None)
    adjacency: Any = getattr(mech, "AdjacencyType", None)
    if base is None or adjacency is None or not hasattr(base, "mu_lower_log_cdf"):
        return None

    class VectorGaussianLoss(base):  # type: ignore[misc]
        def _inverse(self, losses: np.ndarray) -> np.ndarray:
            q, remove = self.sampling_prob, self.adjacency_type == adjacency.REMOVE
            wo = losses  # the loss without subsampling
            if q != 1.0:
                bound = math.log(1 - q) if remove else -math.log(1 - q)
                close = np.abs(losses - bound) <= 1e-9 * np.maximum(np.abs(losses), abs(bound))  # math.isclose
                a, c = 1 / q, 1 - 1 / q
                b = losses if remove else -losses
                with np.errstate(all="ignore"):  # the masked-out branches
                    d = b + np.log(a)
                    wo = np.where(b == 0, np.log(a + c), d + np.log1p(-np.exp(np.log(-c) - d)))
                wo = np.where(close, -math.inf if remove else math.inf, wo if remove else -wo)
            x = -0.5 * self.sensitivity - wo * (self._standard_deviation**2) / self.sensitivity
            out: np.ndarray = x if remove else self.sensitivity + x
            return out

        def get_delta_for_epsilon(self, epsilon: Any) -> Any:
            scalar = np.ndim(epsilon) == 0
            epsilons = np.atleast_1d(np.asarray(epsilon, dtype=float))
            deltas = np.zeros_like(epsilons)
            if self.sampling_prob == 1.0:
                inverted = np.full(epsilons.shape, True)
            elif self.adjacency_type == adjacency.ADD:
                inverted = epsilons < -math.log1p(-self.sampling_prob)
            else:
                inverted = epsilons > math.log1p(-self.sampling_prob)
                deltas[~inverted] = -np.expm1(epsilons[~inverted])
            x = self._inverse(epsilons[inverted])
            deltas[inverted] = self.mu_upper_cdf(x) - np.exp(epsilons[inverted] + self.mu_lower_log_cdf(x))
            deltas = np.clip(deltas, 0, 1)
            return float(deltas[0]) if scalar else deltas

    return VectorGaussianLoss


class _Kept:
    """An LRU map bounded by the probabilities its PLDs hold (PLD_KEPT_POINTS), not by their count: a
    long history's PLD holds 10^5-10^6 of them."""

    def __init__(self, points: int):
        self.points, self.held = points, 0
        self.items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: Any) -> Any:
        got = self.items.get(key)
        if got is None:
            self.misses += 1
            return None
        self.hits += 1
        self.items.move_to_end(key)
        return got[0]

    def put(self, key: Any, value: Any) -> None:
        size = _pld_points(value)
        if key in self.items or size > self.points:
            return
        self.items[key] = (value, size)
        self.held += size
        while self.held > self.points:
            _, (_, gone) = self.items.popitem(last=False)
            self.held -= gone

    def clear(self) -> None:
        self.items.clear()
        self.held = self.hits = self.misses = 0


def _pld_points(pld: Any) -> int:
    pmfs = [getattr(pld, "_pmf_remove", None), getattr(pld, "_pmf_add", None)]
    return sum(len(getattr(p, "_probs", ())) or 1 for p in pmfs if p is not None) or 1


# Composed PLDs kept (8 bytes a probability, PLD_KEPT_POINTS of them at most): each (q, sigma, steps) self-
# composition, and each history's composition, so that the history one run longer (a client's next round) composes
# that run onto its own, and the clients that share a (q, sigma, steps) run build it once.
PLD_KEPT_POINTS = 2**24
_PLD_SELF_COMPOSED = _Kept(PLD_KEPT_POINTS // 4)
_PLD_COMPOSED = _Kept(PLD_KEPT_POINTS)
PLD_COUNTS = {"compositions": 0}  # the PLD compositions made (a test bounds them for a history grown run by run)


def _pld_self_composed(q: float, sigma: float, n: int) -> Any:
    got = _PLD_SELF_COMPOSED.get((q, sigma, n))
    if got is None:
        one = _pld_one_step(q, sigma)
        pmfs = [one._pmf_remove] if one._symmetric else [one._pmf_remove, one._pmf_add]
        if n > 64 and not all(_dense(p) for p in pmfs):
            # A sparse PMF (sigma so large that one step's loss spans a few grid points): the library sizes its
            # result as size ** n, an integer of n digits (10^9 steps: hours), and then goes dense; straight to
            # its dense self-composition instead, the same PMFs.
            pmfs = [p.to_dense_pmf() for p in pmfs]
        if n > 1 and all(_dense(p) for p in pmfs):
            build = _dp_accounting().pld.privacy_loss_distribution.PrivacyLossDistribution
            got = build(*[_pmf_self_compose(p, n) for p in pmfs])
        else:
            got = one.self_compose(n)
        PLD_COUNTS["compositions"] += 1
        _PLD_SELF_COMPOSED.put((q, sigma, n), got)
    return got


def _pld_base(entries: tuple[tuple[float, float, int], ...]) -> tuple[Any, tuple[tuple[float, float, int], ...]]:
    """The kept composition of the most steps whose runs are each within `entries`' (a run of as many
    steps or fewer, at the same (q, sigma)), and what remains to compose onto it; (None, entries) if none."""
    want = {(q, sigma): n for q, sigma, n in entries}
    best, best_steps = None, 0
    for key in reversed(_PLD_COMPOSED.items):  # the most recent first: a client's last history
        steps = sum(n for _, _, n in key)
        if steps > best_steps and all(want.get((q, sigma), 0) >= n for q, sigma, n in key):
            best, best_steps = key, steps
    if best is None:
        return None, entries
    have = {(q, sigma): n for q, sigma, n in best}
    rest = tuple((q, sigma, n - have.get((q, sigma), 0)) for q, sigma, n in entries if n > have.get((q, sigma), 0))
    return _PLD_COMPOSED.get(best), rest


def _pld_epsilon(entries: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """dp_accounting PLDAccountant(value_discretization_interval=1e-4) composed with each run's
    SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), steps), then
    get_epsilon(delta) (Koskela et al. 2020; the library's connect-the-dots PLD, Doroshenko et al.
    2022): the library's own calls in its accountant's order, with each (q, sigma)'s one-step PLD
    kept. A test holds the result to PLDAccountant's own.

    A history asked before, or one that extends a kept one (the same runs, some with more steps, and
    others), is composed from it: only what it adds is composed, in the order it adds it. Composition
    commutes, and each of the library's compositions is a pessimistic (upper-bound) PLD, so the order
    changes only what the tails truncated (below 1e-15 of mass): within 1e-9 of epsilon (a test holds it)."""
    pld = _dp_accounting().pld.privacy_loss_distribution
    composed, rest = _pld_base(entries)
    if composed is None:
        composed = pld.identity(value_discretization_interval=PLD_VALUE_DISCRETIZATION)
    for q, sigma, n in rest:
        composed = _pld_compose(composed, _pld_self_composed(q, sigma, n))
        PLD_COUNTS["compositions"] += 1
    _PLD_COMPOSED.put(entries, composed)
    pmfs = [composed._pmf_remove] if composed._symmetric else [composed._pmf_remove, composed._pmf_add]
    if all(_dense(p) for p in pmfs):
        return max(_pmf_epsilon(p, delta) for p in pmfs)
    eps: float = composed.get_epsilon_for_delta(delta)
    return eps


# dp_accounting's DensePLDPmf.compose and get_epsilon_for_delta walk their arrays in Python loops (the tails'
# truncation, the hockey-stick sums), most of a long history's time; here the same sums as cumulative sums
# (sequential, as the loops add), so the same floats, and compose's convolution over the window that holds its
# mass (`_convolved`), not the whole: a round's compositions in about half the time (python -m bench.accountants).
# Tests hold each to the library's.
PLD_TAIL_MASS_TRUNCATION = 1e-15  # PrivacyLossDistribution.compose's default


def _dense(pmf: Any) -> bool:
    return hasattr(pmf, "_probs") and hasattr(pmf, "_lower_loss") and hasattr(pmf, "_infinity_mass")


def _pld_compose(a: Any, b: Any) -> Any:
    """a.compose(b) (PrivacyLossDistribution.compose at its default truncation) for dense PMFs, over its window: its
    epsilon within 1e-9 of the library's at the deltas runs ask, a grid cell at 1e-12 (FFT rounding; tested)."""
    pairs = [(a._pmf_remove, b._pmf_remove)]
    if not (a._symmetric and b._symmetric):
        pairs.append((a._pmf_add, b._pmf_add))
    if not all(_dense(x) and _dense(y) for x, y in pairs):
        return a.compose(b)
    mod = _dp_accounting().pld
    pmfs = [_pmf_compose(mod.pld_pmf, x, y) for x, y in pairs]
    return mod.privacy_loss_distribution.PrivacyLossDistribution(*pmfs)


def _pmf_compose(pld_pmf: Any, x: Any, y: Any) -> Any:
    """DensePLDPmf.compose(y, PLD_TAIL_MASS_TRUNCATION), pessimistic: _truncate_tails's prefixes by cumsum, and the
    convolution over the window that holds all of it but WINDOW_TAIL (`_convolved`)."""
    x.validate_composable(y)
    offset, probs, aliased = _convolved(x._probs, y._probs)
    infinity_mass = x._infinity_mass + y._infinity_mass - x._infinity_mass * y._infinity_mass + aliased
    half = PLD_TAIL_MASS_TRUNCATION / 2

    def prefix(arr: np.ndarray) -> int:  # the longest prefix whose sum is at most `half`
        over = np.flatnonzero(np.cumsum(arr) > half)
        return int(over[0]) if len(over) else len(arr)

    left = prefix(probs)
    right = max(len(probs) - prefix(np.flip(probs)), left + 1)
    left_mass, right_mass = np.sum(probs[:left]), np.sum(probs[right:])
    kept = probs[left:right]
    kept[0] += left_mass  # pessimistic: the left tail onto the lowest loss, the right one to infinity
    lower_loss = x._lower_loss + y._lower_loss + offset + left
    return pld_pmf.DensePLDPmf(x._discretization, lower_loss, kept, infinity_mass + right_mass, True)


# A composition's window (`_window`) is bounded over blocks of this many grid points: each pair of blocks' mass at
# its nearest and farthest sum, so a window at most two blocks wider than the exact one.
WINDOW_BLOCK = 512
# The mass a circular convolution over the window may wrap into it, counted at infinity: a thousandth of the
# truncation's, so that it moves epsilon at dp.delta = 1e-12 a thousandth as far as the truncation does.
WINDOW_TAIL = PLD_TAIL_MASS_TRUNCATION / 1000
# The transforms of a composition's second PMF last computed, kept by the array itself and the length: a round's
# clients compose their histories with the same run's PMF, over lengths of a few sizes (`_transform_length`).
_TRANSFORMS: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = OrderedDict()


def _window(x: np.ndarray, y: np.ndarray) -> tuple[int, int]:
    """[lo, hi]: indices of x's and y's convolution outside of which it holds at most WINDOW_TAIL / 2 of absolute mass
    on each side: the direct convolution of their blocks' absolute masses (float64 sums, no FFT's rounding), each
    pair of blocks i, j between sums (i + j) * WINDOW_BLOCK and (i + j + 2) * WINDOW_BLOCK - 2."""
    width = len(x) + len(y) - 1
    bx, by = (np.add.reduceat(np.abs(a), np.arange(0, len(a), WINDOW_BLOCK)) for a in (x, y))
    pairs = np.convolve(bx, by)  # by i + j
    half = WINDOW_TAIL / 2
    below = np.cumsum(pairs)  # below[k]: the mass of pairs with i + j <= k
    above = np.cumsum(pairs[::-1])[::-1]  # above[k]: with i + j >= k
    first = int(np.searchsorted(below, half, side="right"))  # pairs below it hold at most `half`
    last = max(int(np.count_nonzero(above > half)) - 1, first)  # above falls with k: its True ones lead
    return min(first * WINDOW_BLOCK, width - 1), min((last + 2) * WINDOW_BLOCK - 2, width - 1)


def _transform_length(n: int) -> int:
    """The least length m * 2^k >= n, m in TRANSFORM_FACTORS: fast for pocketfft (5-smooth) and few, so that the
    windows of a round's compositions (within a few percent of each other) share one, and the transform of their
    second PMF, for at most 1/8 more points than n."""
    k = max(0, (n - 1).bit_length() - 6)
    return min(m << j for j in (k, k + 1) for m in TRANSFORM_FACTORS if m << j >= n)


TRANSFORM_FACTORS = (32, 36, 40, 45, 48, 50, 54, 60)  # each within 1/8 of the next (64: the next power's 32)


def _convolved(x: np.ndarray, y: np.ndarray) -> tuple[int, np.ndarray, float]:
    """x and y's convolution over `_window`: (its first index, the probabilities, the mass it may have moved). Where the
    window is shorter than the whole (the losses' sums concentrate: a long history's tails are far below WINDOW_TAIL),
    a circular convolution of the window's length, as the library's self_compose does within its bounds, the mass
    outside it (at most WINDOW_TAIL) wrapped into it and also counted at infinity (pessimistic); otherwise
    scipy.signal.fftconvolve, as the library's compose, and 0."""
    lo, hi = _window(x, y)
    fft = _dp_accounting().pld.common.fft  # scipy.fft, as the library calls it
    size = _transform_length(max(hi - lo + 1, len(x), len(y)))
    if size >= len(x) + len(y) - 1:
        return 0, _dp_accounting().pld.pld_pmf.signal.fftconvolve(x, y), 0.0
    key = (id(y), size)
    kept = _TRANSFORMS.get(key)
    if kept is None or kept[0] is not y:
        kept = (y, fft.rfft(y, size))
        _TRANSFORMS[key] = kept
        while len(_TRANSFORMS) > 4:
            _TRANSFORMS.popitem(last=False)
    circular = fft.irfft(fft.rfft(x, size) * kept[1], size)
    return lo, np.roll(circular, -lo)[: hi - lo + 1], WINDOW_TAIL


def _pmf_self_compose(pmf: Any, n: int) -> Any:
    """DensePLDPmf.self_compose(n) at its default truncation (PLD_TAIL_MASS_TRUNCATION): common.self_convolve, with
    compute_self_convolve_bounds' Chernoff bounds at its orders +-k / size (k = 1..20), each moment generating function
    a dot product with the k-th power of exp(+-i / size) instead of a call of scipy's logsumexp (the library's 40, most
    of a self-composition's time). The same integer bounds but where a bound's quotient is within a few ulps of an
    integer, and then the same floats (a test holds both to the library's)."""
    probs, tail = pmf._probs, PLD_TAIL_MASS_TRUNCATION
    size = len(probs)
    lower, upper = 0, (size - 1) * n
    log_tail = math.log(2 / tail)
    for sign in (1, -1):
        step = np.exp(np.arange(size) * (sign / size))
        power = np.ones(size)
        for k in range(1, 21):
            power *= step
            mgf = float(np.dot(probs, power))
            if not 0 < mgf < math.inf:  # log(0): no finite bound, as the library skips it
                continue
            bound = (n * math.log(mgf) + log_tail) / (sign * k / size)
            if not math.isfinite(bound):
                continue
            if sign > 0:
                upper = min(upper, math.ceil(bound))
            else:
                lower = max(lower, math.floor(bound))
    fft = _dp_accounting().pld.common.fft  # scipy.fft, as the library calls it
    length = upper - lower + 1
    composed = np.real(fft.ifft(fft.fft(probs, fft.next_fast_len(max(length, size))) ** n))
    out = np.array(np.roll(composed, -lower)[:length])
    infinity_mass = tail - math.expm1(n * math.log1p(-pmf._infinity_mass))
    return _dp_accounting().pld.pld_pmf.DensePLDPmf(
        pmf._discretization, pmf._lower_loss * n + lower, out, infinity_mass, pmf._pessimistic_estimate
    )


def _pmf_epsilon(pmf: Any, delta: float) -> float:
    """DensePLDPmf.get_epsilon_for_delta(delta): the library's walk from the largest loss down, its running
    masses as cumulative sums and its stopping tests over all of them at once."""
    infinity_mass, probs, d = pmf._infinity_mass, np.flip(pmf._probs), pmf._discretization
    if infinity_mass > delta:
        return math.inf
    upper_loss = (pmf._lower_loss + len(probs) - 1) * d
    losses = np.cumsum(np.concatenate(([upper_loss], np.full(len(probs) - 1, -d))))  # itertools.count's adds
    upper = np.cumsum(np.concatenate(([infinity_mass], probs)))  # before each loss, and after the last
    lower = np.cumsum(np.concatenate(([0.0], np.exp(-losses) * probs)))
    with np.errstate(divide="ignore", invalid="ignore"):
        stop = (upper[:-1] > delta) & (lower[:-1] > 0) & (np.log((upper[:-1] - delta) / lower[:-1]) >= losses)
    done = (upper[1:] >= delta) & (lower[1:] == 0)  # after adding a loss so large that exp(-loss) is 0
    k_stop = int(np.argmax(stop)) if stop.any() else len(probs)
    k_done = int(np.argmax(done)) if done.any() else len(probs)
    if k_done < k_stop:
        return max(0.0, float(losses[k_done]))
    mass_upper, mass_lower = float(upper[k_stop]), float(lower[k_stop])
    if mass_upper <= mass_lower + delta:
        return 0.0
    return math.log((mass_upper - delta) / mass_lower)


# PLD composes a question's new run onto its history's kept PLD, so a question costs about the same whatever the runs
# before it: the seconds of one, with RDP's bound of it, as python -m bench.accountants --histories measures them on a
# 2-core machine (bench/README.md).
PLD_SECONDS_PER_QUESTION = 0.08


class PldTheorem(NumericalTheorem):
    """dp.accountant=pld: dp_accounting's PLDAccountant(value_discretization_interval=1e-4).get_epsilon(delta)."""

    name = "pld"
    max_runs = 1000

    @staticmethod
    def question_seconds(runs: int) -> float:
        return PLD_SECONDS_PER_QUESTION

    @staticmethod
    def grid_epsilon(runs: Runs, delta: float) -> float | None:
        return _pld_epsilon(runs, delta)

    @classmethod
    def missing(cls) -> str:
        return "" if pld_installed() else f"needs Google's dp-accounting package, not installed ({PLD_INSTALL})"

    @classmethod
    def clear_caches(cls) -> None:
        super().clear_caches()
        _pld_one_step.cache_clear()
        _PLD_SELF_COMPOSED.clear()
        _PLD_COMPOSED.clear()
        _TRANSFORMS.clear()

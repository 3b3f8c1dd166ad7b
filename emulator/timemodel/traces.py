"""Time-varying rates read from trace files, integrated exactly in virtual time.

Two representations, both O(log n) per query (numpy searchsorted), never a Python loop over
the samples of a trace:

* `PiecewiseRate`: a piecewise-constant rate, optionally repeating with a period. Its
  cumulative amount is piecewise linear; the time to deliver an amount inverts it by a binary
  search over the cumulative amounts at the breakpoints. CSV traces of (t_s, bps) and of
  (t_s, step_s), and `links.schedule`-style factor schedules, are this.
* `PacketTrace`: a Mahimahi packet-delivery trace, as mm-link plays it (ravinet/mahimahi,
  src/packet/link_queue.cc): each line is a millisecond timestamp at which up to 1500 bytes
  of the queue leave (byte-granular: one opportunity can finish one message and start the
  next); repeated timestamps are several opportunities in that millisecond; the trace
  repeats with period = its last timestamp. A message of n bytes queued at t0 is delivered
  at the ceil(n/1500)-th opportunity at or after t0: an index into the cumulative count.

A link shared max-min fairly (`network._SharedLink`) needs a rate at every instant, which a
packet trace does not have. There a `PacketTrace` acts as its fluid equivalent
(`PacketTrace.fluid`): the bytes of each distinct timestamp are spread evenly over the time
since the previous one (the first period's opportunities at 0 ms count at the period's end,
where the repetition puts them). Fluid and packets agree at every opportunity instant, but a
transfer's end moves: the fluid grants only part of the packets of the timestamp after the
start, and spreads the last packets over the gap before them: by little as a rule, by up to
seconds where a trace has seconds without an opportunity (bench/README.md, Traces).
Piecewise-constant traces are exact on a shared link too.

`TracedBandwidth` is one client's direction following a trace from an offset into it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

MAHIMAHI_MTU = 1500  # bytes per delivery opportunity (mm-link's PACKET_SIZE)
MAX_TRACE_BYTES = 64 * 2**20  # a trace file larger than this is refused, not read


class TraceError(ValueError):
    """A trace file that cannot be read or parsed; the message says where and why."""


# --- piecewise-constant rates ---------------------------------------------------------------


class PiecewiseRate:
    """rates[k] units/s on [starts[k], starts[k+1]), starts[0] = 0; with a finite `period` the
    pattern repeats (the last rate holds until the period), else the last rate holds forever.
    Times are the rate's own (trace) time; rates may be 0 where the cumulative still grows
    over a period."""

    def __init__(self, starts: ArrayLike, rates: ArrayLike, period: float = math.inf):
        starts, rates = np.asarray(starts, dtype=float), np.asarray(rates, dtype=float)
        if starts.ndim != 1 or len(starts) == 0 or starts.shape != rates.shape or starts[0] != 0:
            raise ValueError("expected matching non-empty starts and rates, starts[0] = 0")
        if np.any(np.diff(starts) <= 0) or not starts[-1] < period:
            raise ValueError("expected strictly increasing starts below the period")
        if np.any(rates < 0) or not np.all(np.isfinite(rates)):
            raise ValueError("expected finite rates >= 0")
        keep = np.r_[True, rates[1:] != rates[:-1]]  # a start that changes nothing is no change
        self.starts, self.rates, self.period = starts[keep], rates[keep], float(period)
        repeats = math.isfinite(self.period)
        ends = np.r_[self.starts[1:], self.period] if repeats else self.starts[1:]
        delivered = np.cumsum(self.rates[: len(ends)] * (ends - self.starts[: len(ends)]))
        self.cumulative = np.r_[0.0, delivered]  # units delivered by each start (and by the period)
        self.per_period = float(delivered[-1]) if repeats else math.inf
        if not (self.per_period > 0 if repeats else self.rates[-1] > 0):
            raise ValueError("expected a rate that delivers something (every period, or in the end)")
        self._ends = np.r_[self.starts, self.period] if repeats else self.starts  # the times of `cumulative`

    def _split(self, x: float) -> tuple[float, float]:
        """(start of x's period, x's time within it); (0, x) when nothing repeats."""
        if not math.isfinite(self.period):
            return 0.0, x
        n = math.floor(x / self.period)
        return n * self.period, x - n * self.period

    def _segment(self, r: float) -> int:
        return int(np.searchsorted(self.starts, r, side="right")) - 1

    def rate(self, x: float) -> float:
        return float(self.rates[max(self._segment(self._split(x)[1]), 0)])

    def next_change(self, x: float) -> float:
        """The first breakpoint > x (inf when the rate never changes again)."""
        if len(self.starts) == 1:
            return math.inf
        base, r = self._split(x)
        k = self._segment(r) + 1
        while True:  # at most twice: float rounding may put x a hair before a breakpoint
            if k < len(self.starts):
                t = base + self.starts[k]
            elif math.isfinite(self.period):
                t, base, k = base + self.period, base + self.period, 0
            else:
                return math.inf
            if t > x:
                return float(t)
            k += 1

    def amount(self, x: float) -> float:
        """Units delivered on [0, x]."""
        base, r = self._split(x)
        k = max(self._segment(r), 0)
        done = round(base / self.period) * self.per_period if base else 0.0  # whole periods before x
        return done + float(self.cumulative[k]) + float(self.rates[k]) * (r - float(self.starts[k]))

    def time_of(self, amount: float) -> float:
        """The earliest time by which `amount` (> 0) units have been delivered."""
        base, rem = 0.0, amount
        if math.isfinite(self.period):
            n = math.ceil(amount / self.per_period) - 1  # rem in (0, per_period]: a flat end counts
            if not 0 < amount - n * self.per_period <= self.per_period:  # float rounding of the division
                n += 1 if amount - n * self.per_period > self.per_period else -1
            base, rem = n * self.period, amount - n * self.per_period
        k = int(np.searchsorted(self.cumulative, rem, side="left"))
        if k < len(self.cumulative) and self.cumulative[k] == rem:
            return base + float(self._ends[k])
        k -= 1  # cumulative[k] < rem < cumulative[k + 1] (or k is the last, endless segment): rates[k] > 0
        return base + float(self.starts[k]) + (rem - float(self.cumulative[k])) / float(self.rates[k])

    def seconds(self, amount: float, x0: float) -> float:
        """Time to deliver `amount` units starting at x0 (exact integral, wrapping around the period)."""
        if amount <= 0:
            return 0.0
        return max(float(self.time_of(self.amount(x0) + amount)) - x0, 0.0)


# --- Mahimahi packet-delivery traces --------------------------------------------------------


class PacketTrace:
    """Delivery opportunities of MAHIMAHI_MTU bytes at `times` (seconds, sorted), repeated with `period`."""

    def __init__(self, times_ms: np.ndarray, name: str = ""):
        times_ms = np.asarray(times_ms, dtype=np.int64)
        if len(times_ms) == 0 or times_ms[0] < 0 or np.any(np.diff(times_ms) < 0) or times_ms[-1] <= 0:
            raise ValueError("expected non-decreasing millisecond timestamps >= 0 ending after 0")
        self.name = name
        self.times = times_ms / 1000.0
        self.period = float(times_ms[-1]) / 1000.0
        self.count = len(times_ms)
        self.bps = self.count * MAHIMAHI_MTU * 8 / self.period  # the trace's mean rate
        self.fluid = _fluid(times_ms)

    def delivery_seconds(self, nbytes: int, x0: float) -> float:
        """Time from x0 until the last of nbytes leaves: the ceil(nbytes/MTU)-th opportunity at or after x0."""
        packets = -(-nbytes // MAHIMAHI_MTU)
        if packets <= 0:
            return 0.0
        # Opportunity i is times[i % count] + (i // count) * period, non-decreasing in i. Those before x0,
        # with x0 = n * period + r: all of repetitions 0..n-2, of repetition n-1 the ones before period + r
        # (its stamps equal to the period fall at n * period), of repetition n the ones before r.
        n = math.floor(x0 / self.period)
        r = x0 - n * self.period
        before = int(np.searchsorted(self.times, r, side="left"))
        if n >= 1:
            before += (n - 1) * self.count + int(np.searchsorted(self.times, self.period + r, side="left"))
        cycle, k = divmod(before + packets - 1, self.count)
        return max(cycle * self.period + float(self.times[k]) - x0, 0.0)


def _fluid(times_ms: np.ndarray) -> PiecewiseRate:
    """Bits/s of each distinct timestamp's packets spread over the time since the previous one.
    Timestamp 0 belongs to the period's end (the repetition puts it at `period`)."""
    period = int(times_ms[-1])
    folded = np.where(times_ms == 0, period, times_ms)
    ends, counts = np.unique(folded, return_counts=True)
    starts = np.r_[0, ends[:-1]]
    rates = counts * MAHIMAHI_MTU * 8 / ((ends - starts) / 1000.0)
    return PiecewiseRate(starts / 1000.0, rates, period / 1000.0)


class Shifted:
    """`rate` entered `offset_s` into it: virtual time t is time t + offset_s of the rate."""

    def __init__(self, rate: PiecewiseRate, offset_s: float):
        self.rate, self.offset_s = rate, float(offset_s)

    def seconds(self, amount: float, t0: float) -> float:
        return self.rate.seconds(amount, t0 + self.offset_s)


# --- one client's direction -------------------------------------------------------------------


class TracedBandwidth:
    """A client link following `trace` (a PacketTrace, or a PiecewiseRate of bits/s), starting
    `offset_s` into it at virtual time 0. Same interface as links.Bandwidth; `bps` is the
    trace's mean rate (its nominal bandwidth)."""

    def __init__(self, trace: PacketTrace | PiecewiseRate, offset_s: float = 0.0, name: str = ""):
        self.trace, self.offset_s, self.name = trace, float(offset_s), name
        self._fluid = trace.fluid if isinstance(trace, PacketTrace) else trace
        self.bps = trace.bps if isinstance(trace, PacketTrace) else trace.per_period / trace.period

    def rate(self, t: float) -> float:
        return self._fluid.rate(t + self.offset_s)

    def next_change(self, t: float) -> float:
        x = t + self.offset_s
        while True:  # strictly after t, also where float rounding of the offset would say otherwise
            x = self._fluid.next_change(x)
            if x - self.offset_s > t:
                return x - self.offset_s

    def mean_rate(self, t0: float, t1: float) -> float:
        """Bits/s delivered on average over [t0, t1] (t0 < t1), the trace's fluid rate integrated."""
        x0, x1 = t0 + self.offset_s, t1 + self.offset_s
        return (self._fluid.amount(x1) - self._fluid.amount(x0)) / (t1 - t0)

    def transfer_seconds(self, nbytes: int, t0: float) -> float:
        if nbytes < 0:
            raise ValueError(f"nbytes = {nbytes!r}: expected a byte count >= 0")
        if isinstance(self.trace, PacketTrace):
            return self.trace.delivery_seconds(nbytes, t0 + self.offset_s)
        return self.trace.seconds(8.0 * nbytes, t0 + self.offset_s)

    def __repr__(self) -> str:
        return f"TracedBandwidth({self.name!r}, offset {self.offset_s:g} s, mean {self.bps:g} bps)"


# --- reading files ----------------------------------------------------------------------------


def is_csv(path: str | Path) -> bool:
    return str(path).lower().endswith(".csv")


@lru_cache(maxsize=64)
def read_link_trace(path: str) -> PacketTrace | PiecewiseRate:
    """A link trace: `.csv` = rows (t_s, bps); anything else = Mahimahi packet-delivery timestamps."""
    if is_csv(path):
        return _rate_steps(path, "bps", lambda v: v)
    text = _read(path)
    try:
        stamps = np.array(text.split(), dtype=np.int64)
    except (ValueError, OverflowError):
        bad, line = next((i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip() and not _is_int(line))
        raise TraceError(
            f"line {bad}: {line.strip()[:60]!r} is not an integer millisecond timestamp "
            f"(a Mahimahi trace has one per line)"
        ) from None
    if len(stamps) == 0:
        raise TraceError("empty: expected one integer millisecond timestamp per line (Mahimahi)")
    if stamps[0] < 0 or np.any(np.diff(stamps) < 0):
        k = 0 if stamps[0] < 0 else int(np.argmax(np.diff(stamps) < 0)) + 1
        raise TraceError(f"timestamp {int(stamps[k])} (entry {k + 1}): expected non-decreasing milliseconds >= 0")
    if stamps[-1] <= 0:
        raise TraceError("the last timestamp (the period) is 0: expected it > 0 ms")
    return PacketTrace(stamps, name=Path(path).name)


@lru_cache(maxsize=64)
def read_step_trace(path: str) -> PiecewiseRate:
    """A compute trace, rows (t_s, step_s), as steps per second."""
    return _rate_steps(path, "step_s", lambda v: 1.0 / v, positive=True)


def _rate_steps(
    path: str, what: str, to_rate: Callable[[np.ndarray], np.ndarray], positive: bool = False
) -> PiecewiseRate:
    """Rows `t_s,<what>`: each value holds from its t_s to the next row's; the first row is at t_s = 0;
    the last row closes the trace (its t_s is the period after which it repeats; its value is unused).
    A header line is allowed."""
    rows = csv_rows(path, 2)
    t, v = rows[:, 0], rows[:, 1]
    if len(rows) < 2:
        raise TraceError(f"expected at least 2 rows t_s,{what} (the last row marks the end of the trace)")
    if t[0] != 0:
        raise TraceError(f"first row t_s = {t[0]:g}: expected 0")
    if np.any(np.diff(t) <= 0):
        k = int(np.argmax(np.diff(t) <= 0)) + 1
        raise TraceError(f"row {k + 1}: t_s = {t[k]:g}: expected times strictly increasing")
    low_ok = v > 0 if positive else v >= 0
    if not np.all(low_ok & np.isfinite(v)):
        k = int(np.argmin(low_ok & np.isfinite(v)))
        raise TraceError(f"row {k + 1}: {what} = {v[k]:g}: expected a finite number {'>' if positive else '>='} 0")
    try:
        return PiecewiseRate(t[:-1], to_rate(v[:-1]), period=float(t[-1]))
    except ValueError as e:
        raise TraceError(f"{e}") from None


def csv_rows(path: str, columns: int) -> np.ndarray:
    """Rows of `columns` finite numbers; the first line may be a header."""
    lines = [(i, line) for i, line in enumerate(_read(path).splitlines(), 1) if line.strip()]
    if lines and not _numbers(lines[0][1]):
        lines = lines[1:]
    rows = []
    for i, line in lines:
        values = _numbers(line)
        if values is None or len(values) != columns or not all(map(math.isfinite, values)):
            raise TraceError(f"line {i}: {line.strip()[:60]!r}: expected {columns} comma-separated finite numbers")
        rows.append(values)
    return np.array(rows, dtype=float).reshape(-1, columns)


def _numbers(line: str) -> list[float] | None:
    try:
        return [float(x) for x in line.split(",")]
    except ValueError:
        return None


def _is_int(line: str) -> bool:
    try:
        int(line)
    except ValueError:
        return False
    return True


def _read(path: str) -> str:
    try:
        size = Path(path).stat().st_size
        if size > MAX_TRACE_BYTES:
            raise TraceError(f"{size} bytes: expected a trace of at most {MAX_TRACE_BYTES // 2**20} MiB")
        return Path(path).read_bytes().decode("utf-8")
    except OSError as e:
        raise TraceError(f"cannot read the file: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise TraceError("not UTF-8 text") from None


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()

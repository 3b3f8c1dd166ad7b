"""The figures of a report, one function each; every one writes a titled PNG and returns its path.

Curves per configuration are the mean over seeds with a min-max band. The impact-factor
heatmap and the Gantt timeline show one run. `with style("paper"):` drops the headline titles
(a paper's caption says that), enlarges the fonts and writes a PDF and an SVG beside each PNG.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyarrow.compute as pc
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from analysis.labels import label
from analysis.load import Run
from analysis.summary import PRIVACY_KINDS, column, mean, run_numbers, std
from emulator.output.summary import privacy_delta, privacy_kind, privacy_label

TIME_GRID_POINTS = 300
PHASE_COLOURS = {"download": "tab:blue", "compute": "tab:gray", "upload": "tab:green"}
OUTCOME_COLOURS = {"arrived": "tab:green", "late": "tab:orange", "lost": "tab:red", "failed": "black"}
OUTCOME_LABELS = {"arrived": "on time", "late": "late", "lost": "lost", "failed": "failed"}


@dataclass(frozen=True)
class Style:
    headlines: bool  # titles that say what a figure shows (in a paper, its caption does)
    formats: tuple[str, ...] = ()  # written beside each PNG
    rc: dict = field(default_factory=dict)


STYLES = {
    "default": Style(headlines=True),
    "paper": Style(
        headlines=False,
        formats=("pdf", "svg"),
        rc={
            "font.size": 13,
            "axes.labelsize": 14,
            "axes.titlesize": 13,
            "legend.fontsize": 11,
            "xtick.labelsize": 12,
            "ytick.labelsize": 12,
            "lines.linewidth": 2.0,
        },
    ),
}
_style = STYLES["default"]


@contextmanager
def style(name: str) -> Iterator[None]:
    """Draw the figures of the block in STYLES[name]."""
    global _style
    previous, _style = _style, STYLES[name]
    try:
        with matplotlib.rc_context(_style.rc):
            yield
    finally:
        _style = previous


def _headline(target, text: str, **kwargs) -> None:
    """A figure's (or a one-panel figure's) descriptive title; none in the paper style."""
    if _style.headlines:
        (target.suptitle if isinstance(target, Figure) else target.set_title)(text, **kwargs)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    for extension in _style.formats:
        fig.savefig(path.with_suffix(f".{extension}"))
    plt.close(fig)
    return path


def _rounds_on_x(ax) -> None:
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def _band(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, min and max over seeds (rows), ignoring the seeds a column has no value for."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns stay NaN
        return np.nanmean(matrix, axis=0), np.nanmin(matrix, axis=0), np.nanmax(matrix, axis=0)


def _panels(n: int, width: float = 5, height: float = 3.6, **kwargs):
    """A grid of n panels, at most 3 a row; the unused ones are switched off."""
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, **kwargs)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return fig, list(axes.flat)[:n]


def _by_round(runs: list[Run], values) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, seeds x rounds matrix) of a per-round quantity `values(run)`, NaN where a seed lacks the round."""
    per_run = [(column(r, "rounds", "round").astype(int), values(r)) for r in runs]
    rounds = np.unique(np.concatenate([rnd for rnd, _ in per_run]))
    matrix = np.full((len(runs), len(rounds)), np.nan)
    for i, (rnd, v) in enumerate(per_run):
        matrix[i, np.searchsorted(rounds, rnd)] = v
    return rounds, matrix


def _plot_band(ax, x, matrix, label, colour) -> None:
    m, lo, hi = _band(matrix)
    # Points no seed has (rounds left unevaluated by eval.every > 1) are left out, so the line joins
    # the points either side instead of breaking at every gap.
    has = ~np.isnan(m)
    x, m, lo, hi = np.asarray(x)[has], m[has], lo[has], hi[has]
    ax.plot(x, m, marker="o" if len(x) <= 30 else None, ms=3, color=colour, label=label)
    if len(matrix) > 1:
        ax.fill_between(x, lo, hi, color=colour, alpha=0.2, linewidth=0)


def _colours(n: int) -> list[tuple[float, float, float, float]]:
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _scenarios(groups: dict[str, list[Run]]) -> str:
    names = sorted({str(r.manifest.get("scenario", {}).get("name", "?")) for runs in groups.values() for r in runs})
    return f"scenario{'s' if len(names) > 1 else ''} {', '.join(names)}"


def _seeds_note(groups: dict[str, list[Run]]) -> str:
    """Which scenario the curves come from, and how seeds are combined."""
    n = sorted({len(r) for r in groups.values()})
    return f"{_scenarios(groups)}; mean over seeds (n = {', '.join(map(str, n))}), band = min-max"


def accuracy_vs_round(groups: dict[str, list[Run]], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5))
    for (config, runs), colour in zip(groups.items(), _colours(len(groups)), strict=True):
        rounds, acc = _by_round(runs, lambda r: column(r, "rounds", "test_accuracy"))
        _plot_band(ax, rounds, acc, config, colour)
    _headline(ax, f"Test accuracy per round\n{_seeds_note(groups)}")
    ax.set(ylabel="test accuracy")
    _rounds_on_x(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, out / "accuracy_vs_round.png")


def _accuracy_along(runs: list[Run], x_of) -> tuple[np.ndarray, np.ndarray]:
    """(grid, seeds x grid matrix): each seed's accuracy drawn between its evaluated rounds (linear) against
    `x_of(run)`, a per-round quantity that never decreases, sampled on one grid; NaN outside a seed's span."""
    xs = [np.asarray(x_of(r), dtype=float) for r in runs]
    grid = np.unique(np.concatenate([np.linspace(0.0, max(x[-1] for x in xs), TIME_GRID_POINTS), *xs]))
    matrix = np.full((len(runs), len(grid)), np.nan)
    for i, (r, x) in enumerate(zip(runs, xs, strict=True)):
        acc = column(r, "rounds", "test_accuracy")
        x, acc = x[~np.isnan(acc)], acc[~np.isnan(acc)]
        if not x.size:
            continue
        inside = (grid >= x[0]) & (grid <= x[-1])
        matrix[i, inside] = np.interp(grid[inside], x, acc)
    return grid, matrix


def accuracy_vs_time(groups: dict[str, list[Run]], out: Path) -> Path:
    """Each seed's accuracy is drawn between the ends of its evaluated rounds (linear), sampled on one time
    grid per configuration."""
    fig = _accuracy_against(groups, lambda r: column(r, "rounds", "t_end"), "over virtual time", "virtual time (s)")
    return _save(fig, out / "accuracy_vs_time.png")


def _accuracy_against(groups: dict[str, list[Run]], x_of, what: str, xlabel: str) -> Figure:
    """Each configuration's band of test accuracy against `x_of(run)` (`_accuracy_along`)."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for (config, runs), colour in zip(groups.items(), _colours(len(groups)), strict=True):
        grid, matrix = _accuracy_along(runs, x_of)
        _plot_band(ax, grid, matrix, config, colour)
    _headline(ax, f"Test accuracy {what}\n{_seeds_note(groups)}")
    ax.set(xlabel=xlabel, ylabel="test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def accuracy_vs_bytes_up(groups: dict[str, list[Run]], out: Path) -> Path:
    """Bytes per accuracy: test accuracy against the cumulative bytes the clients uploaded (the `bytes_up`
    of the rounds table, as they crossed the links: compressed updates at their compressed size), each seed
    drawn between its evaluated rounds (linear) on one grid per configuration."""
    fig, ax = plt.subplots(figsize=(8, 5))
    smallest = math.inf  # MB: the least positive amount drawn
    for (config, runs), colour in zip(groups.items(), _colours(len(groups)), strict=True):
        grid, matrix = _accuracy_along(runs, lambda r: np.cumsum(column(r, "rounds", "bytes_up")) / 1e6)
        _plot_band(ax, grid, matrix, config, colour)
        drawn = grid[(grid > 0) & ~np.isnan(matrix).all(axis=0)]
        smallest = min(smallest, drawn.min(initial=math.inf))
    _headline(ax, f"Test accuracy vs cumulative bytes uploaded\n{_seeds_note(groups)}")
    ax.set(xlabel="cumulative MB uploaded (bytes_up; downloads not included)", ylabel="test accuracy")
    if math.isfinite(smallest):  # logarithmic: codecs tens of times apart share one axis (linear near 0)
        ax.set_xscale("symlog", linthresh=smallest)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, out / "accuracy_vs_bytes_up.png")


def accuracy_vs_energy(groups: dict[str, list[Run]], out: Path) -> Path | None:
    """Energy per accuracy: test accuracy against the cumulative joules of the clients' tasks (the rounds
    table's `energy_j`: radio, tails and training), each seed drawn between its evaluated rounds on one grid
    per configuration; None when no run models energy (energy.radio = none)."""
    modelled = {c: runs for c, runs in groups.items() if all(_models_energy(r) for r in runs)}
    if not modelled:
        return None
    fig = _accuracy_against(
        modelled,
        lambda r: np.cumsum(column(r, "rounds", "energy_j")) / 1e3,
        "vs cumulative energy",
        "cumulative kJ of the clients' tasks (radio, tails, training)",
    )
    return _save(fig, out / "accuracy_vs_energy.png")


def _models_energy(run: Run) -> bool:
    return str(run.manifest.get("scenario", {}).get("energy", {}).get("radio", "none")) != "none"


def tau_per_round(groups: dict[str, list[Run]], out: Path) -> Path:
    """Local iterations τ chosen each round (ALI-DPFL Fig. 4 style)."""
    fig, ax = plt.subplots(figsize=(8, 5))
    drawn = 0
    for (config, runs), colour in zip(groups.items(), _colours(len(groups)), strict=True):
        rounds, tau = _by_round(runs, lambda r: column(r, "rounds", "tau"))
        if np.isnan(tau).all():
            continue
        _plot_band(ax, rounds, tau, config, colour)
        drawn += 1
    if drawn:
        ax.legend(fontsize="small")
    else:
        _note(ax, "no run recorded τ (rounds.tau is empty)")
    _headline(ax, f"Local iterations τ per round\n{_seeds_note(groups)}")
    ax.set(ylabel="τ (local DP-SGD steps)")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _rounds_on_x(ax)
    ax.grid(alpha=0.3)
    return _save(fig, out / "tau_per_round.png")


LINES_MAX_CLIENTS = 50  # clients beyond which one line each stops being readable (and slow to draw)


def epsilon_per_client(groups: dict[str, list[Run]], out: Path) -> Path:
    """One panel per configuration (its first seed): each client's cumulative ε after each round it took
    part in, at that configuration's own δ, with its ε budget. Panels share a y-axis only with those of
    their own privacy kind: sample-level and client-level ε protect different things."""
    fig, axes = _panels(len(groups))
    same_kind = defaultdict(list)
    for ax, (config, runs) in zip(axes, groups.items(), strict=True):
        run = runs[0]
        cr = run.table("client_rounds")
        clients = np.asarray(cr["client"].to_numpy(zero_copy_only=False))
        rnd = cr["round"].to_numpy(zero_copy_only=False)
        eps = cr["epsilon"].to_numpy(zero_copy_only=False).astype(float)
        ids = np.unique(clients)
        if len(ids) <= LINES_MAX_CLIENTS:
            for c in ids:
                sel = clients == c
                ax.plot(rnd[sel], eps[sel], marker=".", lw=1, label=f"client {c}")
        else:  # one line per client would be unreadable (and slow to draw): each (round, ε) as a dot
            ax.plot(rnd, eps, ".", ms=3, alpha=0.3, color="tab:blue", label=f"{len(ids):,} clients, a dot each round")
        budget = float(run.manifest.get("scenario", {}).get("dp", {}).get("epsilon", math.inf))
        if math.isfinite(budget):
            ax.axhline(budget, ls="--", color="red", lw=1.2, label=f"ε budget {budget:g}")
        if not len(ids):
            _note(ax, "no client rows")
        elif len(ids) <= 10 or len(ids) > LINES_MAX_CLIENTS:
            ax.legend(fontsize="x-small", ncol=2)
        elif math.isfinite(budget):
            ax.legend(handles=ax.get_lines()[-1:], fontsize="x-small")
        kind = privacy_kind(run.manifest)
        same_kind[kind].append(ax)
        ax.set_title(f"{config} (seed {run.seed})\n{kind} ε at δ = {privacy_delta(run.manifest):g}", fontsize="medium")
        ax.set(ylabel="ε (cumulative)")
        _rounds_on_x(ax)
        ax.grid(alpha=0.3)
    for panels in same_kind.values():
        top = max(ax.get_ylim()[1] for ax in panels)
        for ax in panels:
            ax.set_ylim(0, top)
    _headline(fig, "Privacy spent per client over rounds\n(each panel at its own δ; dashed: the ε budget)")
    return _save(fig, out / "epsilon_per_client.png")


def _error(values: list[float]) -> float:
    """Error bar half-width over seeds: one sample std, 0 for a single seed."""
    s = std(values)
    return 0.0 if math.isnan(s) else s


def accuracy_vs_epsilon(groups: dict[str, list[Run]], out: Path) -> Path:
    """Privacy-utility: one point per configuration, its final (filled) and best (hollow) test accuracy
    against its final max ε over clients, means over seeds with one-std error bars. One panel per
    privacy kind present, side by side, since their ε are not comparable; each configuration is labelled
    with its privacy unit and accountant (run_summary.privacy_label)."""
    numbers = {config: [run_numbers(r, math.nan) for r in runs] for config, runs in groups.items()}
    colours = dict(zip(groups, _colours(len(groups)), strict=True))
    kinds = [k for k in PRIVACY_KINDS if any(n[0].privacy_kind == k for n in numbers.values())]
    fig, axes = plt.subplots(1, len(kinds), figsize=(7 * len(kinds), 5), squeeze=False, sharey=True)
    for ax, kind in zip(axes.flat, kinds, strict=True):
        unbounded = []
        for config, runs in numbers.items():
            if runs[0].privacy_kind != kind:
                continue
            eps = [x.final_max_epsilon for x in runs]
            if not all(math.isfinite(e) for e in eps):
                unbounded.append(config)
                continue
            for name, filled in (("final_accuracy", True), ("best_accuracy", False)):
                acc = [getattr(x, name) for x in runs]
                ax.errorbar(
                    mean(eps),
                    mean(acc),
                    xerr=_error(eps),
                    yerr=_error(acc),
                    fmt="o",
                    ms=8,
                    capsize=3,
                    color=colours[config],
                    mfc=colours[config] if filled else "none",
                    label=f"{config} ({privacy_label(groups[config][0].manifest)})" if filled else None,
                )
        if unbounded:
            _note(ax, "ε unbounded (no noise), not shown: " + "; ".join(unbounded))
        handles, _ = ax.get_legend_handles_labels()
        handles += [
            Line2D([], [], marker="o", color="gray", ls="none", label="final accuracy"),
            Line2D([], [], marker="o", color="gray", mfc="none", ls="none", label="best accuracy"),
        ]
        ax.legend(handles=handles, fontsize="small")
        ax.set(xlabel=f"final max ε over clients ({kind})", ylabel="test accuracy")
        ax.grid(alpha=0.3)
    _headline(
        fig,
        f"Privacy-utility: accuracy vs ε, one point per configuration\n"
        f"{_scenarios(groups)}; mean over seeds, error bars = 1 std",
    )
    return _save(fig, out / "accuracy_vs_epsilon.png")


def numeric_swept_keys(groups: dict[str, list[Run]]) -> list[str]:
    """The path keys (seed aside) that take more than one value across configurations, all numbers."""
    values = defaultdict(set)
    for runs in groups.values():
        for k, v in runs[0].keys.items():
            values[k].add(v)
    return [k for k, vs in values.items() if k != "seed" and len(vs) > 1 and all(_is_number(v) for v in vs)]


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def accuracy_vs_swept_key(groups: dict[str, list[Run]], out: Path) -> Path | None:
    """Final test accuracy against each numeric swept key (one panel each), one line per combination
    of the other swept keys; mean over seeds with one-std error bars. None when no key is swept."""
    keys = numeric_swept_keys(groups)
    if not keys:
        return None
    several_roots = len({r.root for runs in groups.values() for r in runs}) > 1
    fig, axes = _panels(len(keys), width=6, height=4.5)
    for ax, key in zip(axes, keys, strict=True):
        lines = defaultdict(list)  # one per configuration of everything but `key`
        for runs in groups.values():
            if key in runs[0].keys:
                lines[label(runs[0], several_roots, leave_out=(key,))].append(
                    (float(runs[0].keys[key]), [run_numbers(r, math.nan).final_accuracy for r in runs])
                )
        for (others, points), colour in zip(sorted(lines.items()), _colours(len(lines)), strict=True):
            points.sort()
            ax.errorbar(
                [x for x, _ in points],
                [mean(acc) for _, acc in points],
                yerr=[_error(acc) for _, acc in points],
                marker="o",
                capsize=3,
                color=colour,
                label=others,
            )
        ax.set(xlabel=key, ylabel="final test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    swept = {config: runs for config, runs in groups.items() if any(k in runs[0].keys for k in keys)}
    _headline(
        fig, f"Final accuracy vs each swept numeric key\n{_scenarios(swept)}; mean over seeds, error bars = 1 std"
    )
    return _save(fig, out / "accuracy_vs_swept_key.png")


def arrivals_per_round(groups: dict[str, list[Run]], out: Path) -> Path:
    """Per configuration, the updates of the selected clients each round by outcome, stacked: on time,
    late, lost, failed (mean over seeds)."""
    fig, axes = _panels(len(groups), sharey=True)
    for ax, (config, runs) in zip(axes, groups.items(), strict=True):
        bottom = None
        for outcome, colour in OUTCOME_COLOURS.items():
            rounds, counts = _by_round(runs, lambda r, o=outcome: column(r, "rounds", o))
            m = _band(counts)[0]
            ax.bar(rounds, m, bottom=bottom, color=colour, width=0.85, label=OUTCOME_LABELS[outcome])
            bottom = m if bottom is None else bottom + m
        ax.set_title(f"{config} ({len(runs)} seed{'s' if len(runs) > 1 else ''})", fontsize="medium")
        ax.set(ylabel="updates")
        _rounds_on_x(ax)
        ax.grid(alpha=0.3, axis="y")
    axes[-1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # off the bars
    _headline(fig, f"Updates per round by outcome (mean over seeds)\n{_scenarios(groups)}")
    return _save(fig, out / "arrivals_per_round.png")


def bytes_vs_budget(groups: dict[str, list[Run]], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5))
    budgets: dict[float, tuple[float, float, float, float]] = {}  # byte budget -> colour of its first run
    for (config, runs), colour in zip(groups.items(), _colours(len(groups)), strict=True):
        rounds, cum = _by_round(runs, lambda r: np.cumsum(column(r, "rounds", "bytes_total")))
        _plot_band(ax, rounds, cum / 1e6, config, colour)
        budgets.setdefault(runs[0].byte_budget, colour)
    finite = {b: c for b, c in budgets.items() if math.isfinite(b)}
    for b, colour in finite.items():
        ax.axhline(b / 1e6, ls="--", color=colour if len(finite) > 1 else "red", label=f"byte budget {b / 1e6:.3g} MB")
    note = "" if finite else "\nno finite byte budget (budget.bytes = inf), so no budget line"
    _headline(ax, f"Cumulative bytes on all links vs the byte budget\n{_seeds_note(groups)}{note}")
    ax.set(ylabel="cumulative MB (down + up)")
    _rounds_on_x(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, out / "bytes_vs_budget.png")


def _mode(run: Run) -> str:
    return str(run.manifest.get("scenario", {}).get("round", {}).get("mode", "sync"))


def staleness(groups: dict[str, list[Run]], out: Path) -> Path | None:
    """Per configuration in round.mode=buffered|async, the share of its applied updates (impact factor
    > 0) by staleness, the versions between a client's start and the version it was applied to, pooled
    over seeds; None when no configuration is in those modes."""
    buffered = {config: runs for config, runs in groups.items() if any(_mode(r) != "sync" for r in runs)}
    if not buffered:
        return None
    fig, axes = _panels(len(buffered), sharey=True)
    for ax, (config, runs) in zip(axes, buffered.items(), strict=True):
        applied = np.concatenate(
            [column(r, "client_rounds", "staleness")[column(r, "client_rounds", "impact_factor") > 0] for r in runs]
        )
        values, counts = np.unique(applied, return_counts=True)
        ax.bar(values, counts / max(1, counts.sum()), width=0.85, color="tab:purple")
        mean = float(applied.mean()) if len(applied) else math.nan
        seeds = f"{len(runs)} seed{'s' if len(runs) > 1 else ''}"
        ax.set_title(
            f"{config} ({_mode(runs[0])}, {seeds})\n{len(applied)} updates, mean staleness {mean:.2f}",
            fontsize="medium",
        )
        ax.set(xlabel="staleness (versions)", ylabel="share of applied updates")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3, axis="y")
    _headline(fig, f"Staleness of the applied updates\n{_scenarios(buffered)}")
    return _save(fig, out / "staleness.png")


def impact_heatmap(run: Run, out: Path) -> Path:
    """Aggregation weight of each client in each round; blank = not selected, 0 = selected but not aggregated.
    One row per client that was selected, in id order: a run of 10^7 registered clients draws the few
    thousand it selected."""
    cr = run.table("client_rounds")
    rnd = cr["round"].to_numpy(zero_copy_only=False)
    clients = cr["client"].to_numpy(zero_copy_only=False)
    factor = cr["impact_factor"].to_numpy(zero_copy_only=False).astype(float)
    fig, ax = plt.subplots(figsize=(9, 5))
    if len(rnd):
        ids, row = np.unique(clients, return_inverse=True)
        r0 = rnd.min()
        grid = np.full((len(ids), rnd.max() - r0 + 1), np.nan)
        grid[row, rnd - r0] = factor
        im = ax.imshow(
            grid,
            aspect="auto",
            origin="lower",
            interpolation="nearest",
            cmap="viridis",
            extent=(r0 - 0.5, rnd.max() + 0.5, -0.5, len(ids) - 0.5),
        )
        fig.colorbar(im, ax=ax, label="impact factor p_i (renormalised over arrived updates)")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{ids[int(y)]}" if 0 <= y < len(ids) else ""))
        ylabel = "client" if ids[-1] - ids[0] + 1 == len(ids) else f"client ({len(ids):,} selected, in id order)"
    else:
        _note(ax, "no client rows")
        ylabel = "client"
    _headline(ax, f"Per-client impact factors over rounds\n{run.name} (blank = not selected)")
    ax.set(ylabel=ylabel)
    _rounds_on_x(ax)
    return _save(fig, out / "impact_factors.png")


def _client_phases(kinds_times: dict[str, float]) -> list[tuple[str, float, float]]:
    """(phase, start, end) bars of one client in one round from its events; a late cut ends the open phase."""
    t = kinds_times
    bars = []
    if "download_start" in t:
        end = t.get("download_end", t.get("download_lost", t.get("late")))
        if end is not None:
            bars.append(("download", t["download_start"], end))
    if "download_end" in t and "failed" not in t:
        end = t.get("upload_start", t.get("late"))
        if end is not None:
            bars.append(("compute", t["download_end"], end))
    if "upload_start" in t:
        end = t.get("upload_end", t.get("upload_lost", t.get("late")))
        if end is not None:
            bars.append(("upload", t["upload_start"], end))
    return bars


MARKS = {
    "download_lost": ("x", "red", "lost transfer"),
    "upload_lost": ("x", "red", "lost transfer"),
    "late": (">", "darkorange", "late (cut at deadline)"),
    "failed": ("X", "black", "failed client"),
}


GANTT_MAX_CLIENTS = 50  # rows beyond which a timeline stops being readable (and slow to draw)


def gantt_clients(
    per_client: dict[tuple[int, int], dict[str, float]], limit: int = GANTT_MAX_CLIENTS
) -> tuple[list[int], str]:
    """The clients a timeline shows, and how they were picked: all of them up to `limit`; beyond
    it, up to half from those with a loss, late cut or failure, the rest from the others, each
    part evenly spaced by client id."""
    clients = sorted({c for _, c in per_client})
    if len(clients) <= limit:
        return clients, f"{len(clients)} clients"
    troubled = sorted({c for (_, c), times in per_client.items() if any(k in times for k in MARKS)})
    calm = sorted(set(clients) - set(troubled))
    n_troubled = min(len(troubled), max(limit // 2, limit - len(calm)))
    shown = sorted(_evenly(troubled, n_troubled) + _evenly(calm, limit - n_troubled))
    return shown, (
        f"{limit} of {len(clients):,} clients: {n_troubled} of the {len(troubled):,} with a loss, "
        f"late cut or failure, {limit - n_troubled} of the other {len(calm):,}, evenly spaced by id"
    )


def _evenly(ids: list[int], k: int) -> list[int]:
    return [ids[i] for i in np.linspace(0, len(ids) - 1, k).round().astype(int)] if k > 0 else []


def gantt(run: Run, first: int, last: int, out: Path) -> Path:
    """Download / compute / upload bars per client for rounds first..last, with losses, late marks and deadlines."""
    events = run.table("events")
    ev = events.filter(pc.and_(pc.greater_equal(events["round"], first), pc.less_equal(events["round"], last)))
    per_client: dict[tuple[int, int], dict[str, float]] = {}
    for rnd, t, client, kind in zip(*(ev[c].to_pylist() for c in ("round", "t", "client", "kind")), strict=True):
        if client >= 0:
            per_client.setdefault((rnd, client), {})[kind] = t
    clients, shown = gantt_clients(per_client)
    row_of = {c: i for i, c in enumerate(clients)}
    bars: dict[str, list[tuple[int, float, float]]] = {phase: [] for phase in PHASE_COLOURS}
    marks: dict[str, list[tuple[float, int]]] = {kind: [] for kind in MARKS}
    for (_, client), times in per_client.items():
        if client not in row_of:
            continue
        for phase, start, end in _client_phases(times):
            bars[phase].append((row_of[client], start, max(end - start, 0.0)))
        for kind in MARKS:
            if kind in times:
                marks[kind].append((times[kind], row_of[client]))
    fig, ax = plt.subplots(figsize=(11, 1.5 + 0.35 * max(len(clients), 4)))
    for phase, rows in bars.items():  # one artist per phase, however many clients
        if rows:
            y, left, width = zip(*rows, strict=True)
            ax.barh(y, width, left=left, height=0.7, color=PHASE_COLOURS[phase])
    for kind, points in marks.items():
        if points:
            marker, colour, _ = MARKS[kind]
            ax.plot(*zip(*points, strict=True), marker=marker, color=colour, ms=9, mew=2, ls="none")
    rounds = run.table("rounds")
    in_range = [
        row
        for row in rounds.select(["round", "t_start", "t_end", "deadline"]).to_pylist()
        if first <= row["round"] <= last
    ]
    for row in in_range:
        ax.axvline(row["t_start"], color="black", lw=0.8, ls=":")
        ax.text(
            row["t_start"],
            1.0,
            f" round {row['round']}",
            transform=ax.get_xaxis_transform(),
            va="bottom",
            fontsize="small",
        )
        if math.isfinite(row["deadline"]):
            ax.axvline(row["deadline"], color="red", lw=1.2, ls="--")
    if not per_client:
        _note(ax, f"no client events in rounds {first}-{last}")
    ax.set_yticks(range(len(clients)), [f"client {c}" for c in clients])
    ax.set(xlabel="virtual time (s)", ylim=(-0.8, max(len(clients), 1) - 0.2))
    _headline(ax, f"Round timeline, rounds {first}-{last} ({shown})\n{run.name}", pad=18)
    handles: list[Artist] = [Patch(color=c, label=p) for p, c in PHASE_COLOURS.items()]
    handles += [
        Line2D([], [], marker=m, color=c, ls="none", mew=2, label=label)
        for m, c, label in dict.fromkeys(MARKS.values())
    ]
    handles += [
        Line2D([], [], color="black", ls=":", label="round start"),
        Line2D([], [], color="red", ls="--", label="deadline"),
    ]
    ax.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, out / "gantt.png")

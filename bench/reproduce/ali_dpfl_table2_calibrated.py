"""ALI-DPFL Table II at a clipping bound fitted to the paper: the five fixed-tau rows and ALI-DPFL
in the authors' code's setting, with C = CLIP instead of their default 0.1. The paper states no C;
CLIP is the C of `ali_dpfl_table2_c_sweep` nearest the paper's tau = 2 row (fitted, not the
paper's). Next to them: the C = 0.1 rows (`ali_dpfl_table2`'s runs, when they exist) and, when
`bench.reproduce.authors_run` has written it into the same --out, the authors' own code at CLIP."""

from __future__ import annotations

import csv
from pathlib import Path

from analysis.load import BadPath
from bench.reproduce.ali_dpfl import rows_report
from bench.reproduce.ali_dpfl_table2 import PAPER, SCENARIO, TAUS
from bench.reproduce.ali_dpfl_table2 import SWEEP as DEFAULT_C_SWEEP
from bench.reproduce.ali_dpfl_table2_c_sweep import SWEEP as C_SWEEP
from bench.reproduce.ali_dpfl_table2_c_sweep import by_clip
from bench.reproduce.common import Options, Point, mean_std, pct, run_points, runs

SWEEP = "ali_dpfl_table2_calibrated"
CLIP = "2"  # fitted: the c_sweep's best and nearest the paper (its report); the paper gives no C
ROWS = [*(f"tau = {t}" for t in TAUS), "ALI-DPFL"]
AUTHORS_TAU, AUTHORS_SEED = 2, 0


def points(opts: Options) -> list[Point]:
    """Seed by seed, so an interrupted reproduction has whole seeds."""
    out = []
    for seed in opts.seeds:
        keys = [{"policy": "fedavg_dp", "dp.tau": str(t)} for t in TAUS] + [{"policy": "ali_dpfl"}]
        out += [Point(SWEEP, SCENARIO, seed, {**k, "dp.clip": CLIP}) for k in keys]
    return out


def row_of(run) -> str:
    return f"tau = {run.keys['dp.tau']}" if run.keys["policy"] == "fedavg_dp" else "ALI-DPFL"


def default_c_rows(out: Path) -> str:
    """The same rows at the authors' default C = 0.1, from `ali_dpfl_table2`'s runs."""
    try:
        found = [r for r in runs(out / DEFAULT_C_SWEEP) if "ali_dpfl.mu_estimate" not in r.keys]
    except BadPath:  # no such sweep yet
        found = []
    if not found:
        return f"\n(The C = 0.1 rows: run `python -m bench.reproduce {DEFAULT_C_SWEEP}` into the same --out.)\n"
    return "\n" + rows_report(
        "The same rows at C = 0.1 (the authors' default)", {r: PAPER[r] for r in ROWS}, found, row_of
    )


def sweep_check(out: Path) -> str:
    """Whether CLIP is still the c_sweep's best C, from its runs."""
    try:
        accs = by_clip(runs(out / C_SWEEP))
    except BadPath:  # no such sweep yet
        return f"\n(Run `python -m bench.reproduce {C_SWEEP}` for the fit this C comes from.)\n"
    best = max(accs, key=lambda c: mean_std(accs[c][0])[0])
    said = "the" if best == float(CLIP) else f"NOT the (that is C = {best:g}, {pct(mean_std(accs[best][0])[0])});"
    return f"\nC = {CLIP} is {said} best of the {len(accs)} C swept at τ = 2 (`{C_SWEEP}`).\n"


def authors_check(out: Path) -> str:
    """The authors' own DPFL server at CLIP, tau = 2, against our tau = 2 row, when its CSV exists."""
    path = out / f"authors_tau{AUTHORS_TAU}_C{float(CLIP):g}_seed{AUTHORS_SEED}.csv"
    if not path.is_file():
        return (
            f"\n(The authors' own code at C = {CLIP}: `python -m bench.reproduce.authors_run --authors PATH "
            f"--tau {AUTHORS_TAU} --clip {CLIP} --seed {AUTHORS_SEED} --out {out}`.)\n"
        )
    with open(path) as f:
        acc = [float(r["test_acc"]) for r in csv.DictReader(f)]
    paper = PAPER[f"tau = {AUTHORS_TAU}"]
    return (
        f"\nThe authors' own DPFL server (`authors_run`, τ = {AUTHORS_TAU}, C = {CLIP}, their seed "
        f"{AUTHORS_SEED}, {len(acc) - 1} aggregations): best {pct(max(acc))}, final {pct(acc[-1])}; "
        f"the paper's row {paper:.2f} ({100 * max(acc) - paper:+.2f} points).\n"
    )


def report(opts: Options) -> str:
    run_points(opts, points(opts))
    title = f"Table II (FashionMNIST, R_s = 1/2 R_c, epsilon = 2) at C = {CLIP}, fitted (the paper states no C)"
    calibrated = rows_report(title, {r: PAPER[r] for r in ROWS}, runs(opts.out / SWEEP), row_of)
    return calibrated + sweep_check(opts.out) + authors_check(opts.out) + default_c_rows(opts.out)

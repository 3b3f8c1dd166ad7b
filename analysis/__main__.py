"""python -m analysis PATH... [--out DIR] [--target-accuracy X] [--query SQL] [--run RUN] [--gantt-rounds A-B]
[--style paper]"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from analysis.load import BadPath, discover


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m analysis",
        description="Summary table, plots and report.md from emulator runs and sweeps (Parquet), "
        "or an ad-hoc SQL query over their tables.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="a run directory, a sweep directory, or several")
    p.add_argument("--out", type=Path, help="output directory (default: <first PATH>/analysis)")
    p.add_argument(
        "--target-accuracy",
        type=float,
        metavar="X",
        help="accuracy for time/rounds-to-target (default: 90%% of the best mean final accuracy)",
    )
    p.add_argument(
        "--query",
        metavar="SQL",
        help="print the result of SQL over tables rounds, client_rounds, events, clients, privacy, runs; no report",
    )
    p.add_argument("--run", metavar="RUN", help="run directory for the impact heatmap and Gantt (default: first run)")
    p.add_argument("--gantt-rounds", default="0-2", metavar="A-B", help="rounds in the Gantt timeline (default 0-2)")
    p.add_argument(
        "--style",
        choices=("default", "paper"),
        default="default",
        help="paper: no titles, larger fonts, PDF and SVG beside each PNG",
    )
    args = p.parse_args(argv)
    if args.target_accuracy is not None and not 0 < args.target_accuracy <= 1:
        p.error(f"--target-accuracy {args.target_accuracy}: expected an accuracy in (0, 1]")
    first, _, last = args.gantt_rounds.partition("-")
    if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
        p.error(f"--gantt-rounds {args.gantt_rounds}: expected A-B with 0 <= A <= B (e.g. 0-2)")
    args.gantt_rounds = (int(first), int(last))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    try:
        ds = discover(args.paths)
    except BadPath as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.query:
        from analysis.query import QueryError, format_table, run_query

        try:
            print(format_table(run_query(ds, args.query)))
        except QueryError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0

    from analysis import plots
    from analysis.report import write_report
    from analysis.summary import (
        analysed_runs,
        default_target,
        summarise,
        write_csv,
        write_markdown,
    )

    focus = next((r for r in ds.runs if args.run and r.dir.resolve() == Path(args.run).resolve()), None)
    if args.run and focus is None:
        print(f"error: --run {args.run}: not one of the runs read", file=sys.stderr)
        return 2
    groups = analysed_runs(ds)
    if not groups:
        print(f"error: {', '.join(args.paths)}: no run has a completed round to analyse", file=sys.stderr)
        return 2
    focus = focus or next(iter(groups.values()))[0]
    out = args.out or Path(args.paths[0]) / "analysis"
    out.mkdir(parents=True, exist_ok=True)

    target = args.target_accuracy if args.target_accuracy is not None else default_target(groups)
    source = "--target-accuracy" if args.target_accuracy is not None else "90% of the best mean final accuracy"
    rows = summarise(groups, target)
    write_csv(rows, out / "summary.csv")
    summary_md = write_markdown(rows, target, source, out / "summary.md").read_text()
    with plots.style(args.style):
        figures = [
            plots.accuracy_vs_round(groups, out),
            plots.accuracy_vs_time(groups, out),
            plots.tau_per_round(groups, out),
            plots.epsilon_per_client(groups, out),
            plots.accuracy_vs_epsilon(groups, out),
            plots.accuracy_vs_swept_key(groups, out),
            plots.arrivals_per_round(groups, out),
            plots.bytes_vs_budget(groups, out),
            plots.accuracy_vs_bytes_up(groups, out),
            plots.accuracy_vs_energy(groups, out),
            plots.staleness(groups, out),
            plots.impact_heatmap(focus, out),
            plots.gantt(focus, args.gantt_rounds[0], args.gantt_rounds[1], out),
        ]
    report = write_report(ds, summary_md, [f for f in figures if f is not None], focus.name, out)
    print(
        f"analysis: {report} ({len(ds.runs)} run(s), {len(groups)} configuration(s), "
        f"{time.monotonic() - started:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

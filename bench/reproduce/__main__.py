"""python -m bench.reproduce TARGET [--seeds 0,1,2] [--jobs 2] [--out runs/reproduce] [--rounds N]

Runs the sweep behind one paper table or claim (resumable: completed runs are reused when their
configuration is unchanged) and writes `<out>/<TARGET>.md`, which it also prints.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from analysis.load import BadPath
from bench.reproduce.common import Options, runs

# target -> module under bench.reproduce exposing `report(opts) -> str`
TARGETS = {
    "ali_dpfl_table2": "ali_dpfl_table2",
    "ali_dpfl_table2_no_stop": "ali_dpfl_table2_no_stop",
    "ali_dpfl_table2_c_sweep": "ali_dpfl_table2_c_sweep",
    "ali_dpfl_table2_calibrated": "ali_dpfl_table2_calibrated",
    "ali_dpfl_table7": "ali_dpfl_table7",
    "ali_dpfl_rc": "ali_dpfl_rc",
    "compressed_bytes": "compressed_bytes",
    "async_cellular": "async_cellular",
    "dp_fedavg_clipping": "dp_fedavg_clipping",
    "fedavg_nonprivate": "fedavg_nonprivate",
    "fedcs_cellular": "fedcs_cellular",
    "fu_tuning_e": "fu_tuning_e",
    "padpfl_scenarios": "padpfl_scenarios",
    "udp_crd_eps": "udp_crd_eps",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.reproduce", description=__doc__.splitlines()[0])
    ap.add_argument("target", choices=sorted(TARGETS))
    ap.add_argument("--seeds", help="comma-separated seeds (default: the target's DEFAULT_SEEDS, else 0,1,2)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (default: 2)")
    ap.add_argument("--out", default="runs/reproduce", help="parent directory of the sweeps and reports")
    ap.add_argument("--no-run", action="store_true", help="only write the report from the runs already complete")
    ap.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="cap every run at this many rounds: a quick smoke run, not the paper's setting",
    )
    args = ap.parse_args(argv)
    module = importlib.import_module(f"bench.reproduce.{TARGETS[args.target]}")
    if args.seeds is None:
        args.seeds = ",".join(map(str, getattr(module, "DEFAULT_SEEDS", (0, 1, 2))))
    opts = Options(
        seeds=[int(s) for s in args.seeds.split(",")],
        jobs=args.jobs,
        out=Path(args.out),
        rounds_cap=args.rounds,
        run=not args.no_run,
    )
    t0, since = time.perf_counter(), datetime.now(UTC)
    try:
        text = module.report(opts)
    except BadPath:
        if not args.no_run:
            raise
        missing = f"no runs of {args.target} under {opts.out}: nothing to report (run it without --no-run)"
        print(missing, file=sys.stderr)
        return 2
    wall = time.perf_counter() - t0
    capped = f" --rounds {args.rounds}" if args.rounds else ""  # not the paper's setting: say so
    how = (
        "from the runs already complete (--no-run)"
        if args.no_run
        else f"by `python -m bench.reproduce {args.target} --seeds {args.seeds}{capped}` in {wall / 60:.1f} min"
        + earlier_work(opts.out, args.target, since)
    )
    text += f"\n_Generated {how}._\n"
    opts.out.mkdir(parents=True, exist_ok=True)
    path = opts.out / f"{args.target}.md"
    path.write_text(text)
    print(text)
    print(f"report: {path}", file=sys.stderr)
    return 0


def earlier_work(out: Path, target: str, since: datetime) -> str:
    """What the time above leaves out: how many of the target's complete runs (its sweeps are
    `<out>/<target>` and `<out>/<target>-*`) were finished, or begun, before this invocation started
    at `since`."""
    reused = resumed = complete = 0
    for sweep in (out / target, *out.glob(f"{target}-*")):
        try:
            found = runs(sweep)  # as the report reads them: runs set aside in .replaced/ are not its
        except BadPath:
            continue
        for run in (r for r in found if r.status == "complete"):
            complete += 1
            if datetime.fromisoformat(run.manifest["finished"]) < since:
                reused += 1
            elif datetime.fromisoformat(run.manifest["started"]) < since:
                resumed += 1
    if not reused + resumed:
        return ""
    return (
        f", this invocation only: of the {complete} complete runs, {reused} were complete before it "
        f"and {resumed} resumed from an earlier one, which that time does not include"
    )


if __name__ == "__main__":
    sys.exit(main())

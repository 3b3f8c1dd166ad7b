"""report.md: what was read, the summary table and the figures, in one page next to them."""

from __future__ import annotations

from pathlib import Path

from analysis.load import Dataset

FIGURES = {  # file name -> what a reader sees in it
    "accuracy_vs_round.png": "Test accuracy per round",
    "accuracy_vs_time.png": "Test accuracy over virtual time",
    "tau_per_round.png": "Local iterations τ per round",
    "epsilon_per_client.png": "Privacy spent (ε) per client over rounds",
    "accuracy_vs_epsilon.png": "Privacy-utility: accuracy vs ε, one point per configuration",
    "arrivals_per_round.png": "Updates per round by outcome: on time, late, lost, failed",
    "bytes_vs_budget.png": "Cumulative bytes vs the byte budget",
    "accuracy_vs_bytes_up.png": "Bytes per accuracy: test accuracy vs cumulative bytes uploaded",
    "impact_factors.png": "Per-client impact factors over rounds (one run)",
    "gantt.png": "Round timeline: download / compute / upload per client (one run)",
}
WHEN_SWEPT = {  # drawn only when the runs read sweep a numeric key
    "accuracy_vs_swept_key.png": "Final accuracy vs each swept numeric key",
}
WHEN_ENERGY = {  # drawn only when some configuration models energy (energy.radio)
    "accuracy_vs_energy.png": "Energy per accuracy: test accuracy vs the clients' cumulative energy",
}
WHEN_BUFFERED = {  # drawn only when some runs read are in round.mode=buffered|async
    "staleness.png": "Staleness of the applied updates (buffered and async modes)",
}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def write_report(ds: Dataset, summary_md: str, figures: list[Path], focus_run: str, out: Path) -> Path:
    lines = [
        "# DP-FL emulator analysis",
        "",
        "Inputs: " + ", ".join(f"`{p}`" for p in ds.paths) + f" — {_count(len(ds.runs), 'run')} in "
        f"{_count(len(ds.configs), 'configuration')}.",
        "",
        "## Summary",
        "",
        summary_md,
        "",
        "Machine-readable: [summary.csv](summary.csv) · [summary.md](summary.md)",
        "",
        "## Figures",
        "",
        f"Single-run figures show `{focus_run}` (choose another with `--run`).",
        "",
    ]
    for f in figures:
        caption = {**FIGURES, **WHEN_SWEPT, **WHEN_ENERGY, **WHEN_BUFFERED}[f.name]
        lines += [f"### {caption}", "", f"![{caption}]({f.name})", ""]
    lines += [
        "## Runs",
        "",
        "| run | configuration | seed | status | stop reason | rounds |",
        "|---|---|---:|---|---|---:|",
    ]
    for r in ds.runs:
        lines.append(
            f"| `{r.name}` | {r.config} | {r.seed} | {r.status} | {r.manifest.get('stop_reason', '')} "
            f"| {r.table('rounds').num_rows} |"
        )
    if ds.warn.messages:
        lines += ["", "## Warnings", ""] + [f"- {m}" for m in ds.warn.messages]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path

"""What the ALI-DPFL targets share: the rows table (paper | ours | difference)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from bench.reproduce.common import (
    best_accuracy,
    column,
    final_accuracy,
    markdown_table,
    mean_std,
    pct,
)

SCENARIO_DIR = "paper"


def rows_report(title: str, paper: dict[str, float], runs: list, row_of: Callable) -> str:
    """One line per paper row: the paper's best accuracy, ours (mean ± sample std over seeds of
    the best test accuracy over rounds, as the authors' result_utils reports), the difference,
    and what the runs did (final accuracy, rounds, mean tau, largest epsilon spent)."""
    by_row = defaultdict(list)
    for r in runs:
        if r.status == "complete":
            by_row[row_of(r)].append(r)
    table = []
    for row, paper_acc in paper.items():
        rs = by_row.get(row, [])
        if not rs:
            table.append([row, f"{paper_acc:.2f}", "not run", "", "", "", "", "", 0])
            continue
        best, best_sd = mean_std([best_accuracy(r) for r in rs])
        final, final_sd = mean_std([final_accuracy(r) for r in rs])
        rounds = mean_std([len(column(r, "rounds", "round")) for r in rs])[0]
        taus = [t for r in rs for t in column(r, "rounds", "tau")]
        eps = max(max(column(r, "rounds", "max_epsilon")) for r in rs)
        spread = len(rs) > 1  # one seed has no spread to show
        table.append(
            [
                row,
                f"{paper_acc:.2f}",
                pct(best, best_sd if spread else None),
                f"{100 * best - paper_acc:+.2f}",
                pct(final, final_sd if spread else None),
                f"{rounds:.0f}",
                f"{sum(taus) / len(taus):.2f}",
                f"{eps:.3f}",
                len(rs),
            ]
        )
    header = [
        "row",
        "paper (best acc. %)",
        "ours: best acc. % (mean ± std)",
        "ours − paper",
        "ours: final acc. %",
        "rounds",
        "mean τ",
        "max ε",
        "seeds",
    ]
    return f"### {title}\n\n" + markdown_table(header, table)

"""Compressed updates under a byte budget that binds (scenarios/compressed.yaml: a
145k-parameter MLP, 20 clients on 1 Mbit/s uplinks, a budget of 10 uncompressed rounds): no
compression against QSGD 8-bit (Alistarh et al. 2017), top-k 1 % with error feedback (Karimireddy
et al. 2019) and signSGD with a scale, each over the seeds. Two claims of issue 37: the measured
upload shrinks by each codec's analytic frame-size ratio (within 5 %), and what the bytes saved buy
in accuracy at the same byte budget. Also draws bytes per accuracy (analysis.plots).
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from analysis import plots
from bench.reproduce.common import Options, Point, column, fmt, markdown_table, mean_std, run_points, runs
from nodes.contracts.codecs import part_bytes
from nodes.contracts.schema import CompressionConfig

SWEEP = "compressed_bytes"
SCENARIO = "compressed.yaml"
# compression.kind (the sweep's hive key) -> its label, its codec and the other compression keys
CODECS = {
    "none": ("none", CompressionConfig(kind="none"), ["compression.error_feedback=false"]),
    "qsgd": (
        "qsgd-8",
        CompressionConfig(kind="qsgd", bits=8),
        ["compression.bits=8", "compression.error_feedback=false"],
    ),
    "topk": (
        "topk-1%+EF",
        CompressionConfig(kind="topk", fraction=0.01, error_feedback=True),
        ["compression.fraction=0.01", "compression.error_feedback=true"],
    ),
    "sign": ("sign", CompressionConfig(kind="sign"), ["compression.error_feedback=false"]),
}
WITHIN = 0.05  # the acceptance: measured ratio within 5 % of the analytic one


def points(opts: Options) -> list[Point]:
    return [
        Point(SWEEP, SCENARIO, seed, {"compression.kind": kind}, overrides)
        for seed in opts.seeds
        for kind, (_, _, overrides) in CODECS.items()
    ]


def tensor_sizes(run) -> list[int]:
    """The model's tensors' sizes, from the run's checkpoint (its final model)."""
    with np.load(run.dir / "checkpoint.npz") as z:
        return [int(np.prod(z[k].shape)) for k in z.files if k != "__state__"]


def analytic_ratio(codec: CompressionConfig, sizes: list[int]) -> float:
    """Uncompressed float32 frames over the codec's frames (nodes.contracts.codecs.part_bytes): headers aside."""
    return sum(4 * n for n in sizes) / sum(part_bytes(codec, n) for n in sizes)


def upload_bytes(run) -> float:
    """Mean bytes of an update that arrived (as it crossed the link, headers included)."""
    rows = run.table("client_rounds").to_pylist()
    return statistics.fmean(r["bytes_up"] for r in rows if r["outcome"] == "arrived")


def _of(rs: list, fn, scale: float = 1.0) -> str:
    return fmt(*mean_std([scale * float(fn(r)) for r in rs]))


def _final_accuracy(run) -> float:
    return [a for a in column(run, "rounds", "test_accuracy") if not math.isnan(a)][-1]


def _stopped_by(rs: list) -> str:
    reasons = sorted({str(r.manifest.get("stop_reason", "")).split(":")[0] for r in rs})
    return "; ".join(reasons)


def table_rows(by_codec: dict[str, list]) -> tuple[list[list], bool]:
    """The table's rows, and whether every codec's measured ratio is within WITHIN of its analytic one."""
    plain = statistics.fmean(upload_bytes(r) for r in by_codec["none"]) if by_codec.get("none") else math.nan
    sizes = tensor_sizes(next(rs[0] for rs in by_codec.values() if rs))
    table, within = [], True
    for kind, rs in by_codec.items():
        if not rs:
            continue
        label, codec, _ = CODECS[kind]
        measured = plain / statistics.fmean(upload_bytes(r) for r in rs)
        analytic = analytic_ratio(codec, sizes)
        off = measured / analytic - 1
        within &= abs(off) <= WITHIN
        table.append(
            [
                label,
                len(rs),
                _of(rs, lambda r: len(column(r, "rounds", "round"))),
                _stopped_by(rs),
                _of(rs, _final_accuracy, 100),
                _of(rs, lambda r: max(a for a in column(r, "rounds", "test_accuracy") if not math.isnan(a)), 100),
                _of(rs, upload_bytes, 1e-3),
                f"{measured:.2f}x",
                f"{analytic:.2f}x",
                f"{100 * off:+.1f} %",
                _of(rs, lambda r: sum(column(r, "rounds", "bytes_total")), 1e-6),
                _of(rs, lambda r: column(r, "rounds", "t_end")[-1]),
                _of(rs, lambda r: column(r, "rounds", "max_epsilon")[-1]),
            ]
        )
    return table, within


HEADER = [
    "compression",
    "seeds",
    "rounds",
    "stopped by",
    "final acc %",
    "best acc %",
    "kB up / client-round",
    "ratio measured",
    "ratio analytic",
    "measured vs analytic",
    "MB on the links",
    "virtual time (s)",
    "final max eps",
]


def report(opts: Options) -> str:
    run_points(opts, points(opts))
    done = [r for r in runs(opts.out / SWEEP) if r.status == "complete"]
    by_codec = {kind: [r for r in done if r.keys.get("compression.kind") == kind] for kind in CODECS}
    if not any(by_codec.values()):
        return f"# Compressed updates under a byte budget ({SCENARIO})\n\nNo complete run under {opts.out / SWEEP}.\n"
    table, within = table_rows(by_codec)
    figures = opts.out / f"{SWEEP}.figures"
    figures.mkdir(parents=True, exist_ok=True)
    plot = plots.accuracy_vs_bytes_up({CODECS[kind][0]: rs for kind, rs in by_codec.items() if rs}, figures)
    budget = next(rs[0] for rs in by_codec.values() if rs).byte_budget
    return (
        f"# Compressed updates under a byte budget ({SCENARIO})\n\n"
        f"Byte budget {budget / 1e6:.0f} MB (down + up); mean ± std over seeds {','.join(map(str, opts.seeds))}. "
        "Ratio: the uncompressed run's mean arrived upload over the codec's (headers included); analytic: the "
        "float32 frames over the codec's frames (nodes.contracts.codecs.part_bytes), headers aside.\n\n"
        + markdown_table(HEADER, table)
        + f"\nEvery codec's measured ratio within {100 * WITHIN:g} % of the analytic one: "
        + ("yes" if within else "no")
        + f".\n\n![bytes per accuracy]({plot.relative_to(opts.out)})\n\n"
        + EXPLAIN
    )


EXPLAIN = """\
### Reading the result

* **The broadcast is not compressed.** The byte budget counts both directions and every client
  downloads the full model, so a codec at most doubles the rounds the budget allows, however small
  its updates; on these uplinks it also shortens every round (virtual time).
* **Error feedback needs a contracting codec.** Top-k and sign with a scale never return an error
  larger than the update; QSGD at few bits on a large tensor can (its variance bound grows as
  sqrt(n) / s), and its residuals then grow round by round: it runs here without error feedback.
* **Compression costs no privacy**: it is post-processing of each client's DP-SGD update, so the
  final epsilon grows only with the extra rounds the saved bytes buy.
"""

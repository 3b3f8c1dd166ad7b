"""`python -m tests.golden.record [NAME ...]`: run every golden case (tests/golden/runs.py), or only those
whose name starts with one of NAME (`udp_crd`, `dropout-seed0`), and write each result to
tests/golden/expected/, replacing what was there. Record only on code whose results are right:
tests/e2e/test_golden_results.py holds later code to them."""

from __future__ import annotations

import math
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.golden.runs import (
    CASES,
    EXPECTED,
    RESUMED,
    Case,
    Result,
    generate_datasets,
    result_of,
    run_case,
    save,
    test_set_size,
)

PARALLEL_RUNS = 2  # each run has its server, workers and evaluator: two at a time keep two cores busy


def rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows as dicts, NaN written as the string 'nan' so that equal tables compare equal."""
    return [
        {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in table.to_pylist()
    ]


def same(a: Result, b: Result) -> bool:
    """Bit for bit: a resumed run is the uninterrupted one."""
    return a.run == b.run and all(rows(a.tables[name]) == rows(b.tables[name]) for name in a.tables)


def main(names: list[str]) -> int:
    chosen = [case for case in CASES if not names or case.name.startswith(tuple(names))]
    if not chosen:
        print(f"error: no golden case is named {' or '.join(names)}*", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dpfl-golden-") as tmp:
        work = Path(tmp)
        datasets, out = work / "datasets", work / "runs"
        generate_datasets(datasets)
        uninterrupted = replace(RESUMED, resumed=False)

        def record(case: Case) -> tuple[Case, Result, int]:
            start = time.monotonic()
            result = result_of(run_case(case, out / "uninterrupted" if case == uninterrupted else out, datasets))
            print(f"{case.name}: {time.monotonic() - start:.1f} s", flush=True)
            return case, result, test_set_size(case, datasets)

        with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
            recorded = list(pool.map(record, chosen + ([uninterrupted] if RESUMED in chosen else [])))
        results = {case: result for case, result, _ in recorded}
        if RESUMED in chosen and not same(results[RESUMED], results[uninterrupted]):
            print(f"error: {RESUMED.name} differs from the same run uninterrupted: not recorded", file=sys.stderr)
            return 1
        if not names:
            shutil.rmtree(EXPECTED, ignore_errors=True)
        for case, result, n_test in recorded:
            if case in chosen:
                shutil.rmtree(EXPECTED / case.name, ignore_errors=True)
                save(result, n_test, EXPECTED / case.name)
    size = sum(f.stat().st_size for f in EXPECTED.rglob("*") if f.is_file())
    print(f"{len(chosen)} runs recorded in {EXPECTED} ({size / 1e6:.2f} MB in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

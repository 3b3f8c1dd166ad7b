"""Every shipped scenario (3 rounds, seeds 0 and 1) and a run resumed after SIGKILL, run again through
the command line, give the results recorded in tests/golden/expected/ (`python -m tests.golden.record`,
tests/golden/runs.py): the same tables less their wall-clock columns, and run.json's result fields.

Integers, strings and booleans must be equal, floats close: another CPU's kernels (AVX2 rather than
AVX-512) sum in another order, which changes the last bits of what training computes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.datasets import FASHION_MNIST, FASHION_MNIST_MISSING
from tests.golden.runs import CASES, EXPECTED, Case, Result, expected, generate_datasets, result_of, run_case

pytestmark = pytest.mark.e2e

# Training's floats (losses, norms, mu, noise scales): a last-bit difference in a kernel grows through
# the rounds of clipped, noisy SGD but stays far below any change of behaviour.
RTOL, ATOL = 1e-3, 1e-5
# An accuracy counts test samples: a sample at a decision boundary may flip either way, so allow two flips.
ACCURACY_FLIPS = 2
# Scenarios whose training amplifies a last-bit difference round by round: cifar10.yaml's DP noise
# swamps its generated data's few samples a step (its losses explode), and fedavg_nonprivate's many
# unclipped steps a round have no clipping to bound them. Their losses, norms and accuracy get several
# times the drift that AVX2 kernels give them; what else they record is held as tightly as any run's.
AMPLIFYING = {"cifar10.yaml", "paper/fedavg_nonprivate_fmnist.yaml"}
AMPLIFYING_RTOL = 0.25
AMPLIFYING_ACCURACY_SHARE = 0.005  # of the test set
# Virtual time and the clients' link and compute draws come from seeded numbers and simulated
# arithmetic, not from training: only a math library's last bits may differ between machines.
TIGHT_RTOL, TIGHT_ATOL = 1e-9, 1e-9
TIGHT_COLUMNS = {
    "rounds": {"t_start", "t_end", "deadline"},
    "client_rounds": {"t_download_start", "t_download_end", "t_compute_end", "t_upload_end"},
    "events": {"t"},
    "clients": {"down_bps", "up_bps", "latency_s", "step_s"},
}
TIGHT_RUN_KEYS = {"virtual_time_s"}
ACCURACY_COLUMNS = {"rounds": {"test_accuracy"}}
JSON_COLUMNS = {"rounds": {"policy_state"}}  # a JSON document: its floats are compared as floats


@dataclass(frozen=True)
class Tolerance:
    """How far a case's training-derived floats may be from the recorded ones."""

    rtol: float
    atol: float
    accuracy_samples: float  # test samples an accuracy may gain or lose
    test_samples: int

    @classmethod
    def of(cls, case: Case, test_samples: int) -> Tolerance:
        if case.scenario in AMPLIFYING:
            return cls(AMPLIFYING_RTOL, ATOL, AMPLIFYING_ACCURACY_SHARE * test_samples, test_samples)
        return cls(RTOL, ATOL, ACCURACY_FLIPS, test_samples)


@pytest.fixture(scope="session")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("golden-datasets")
    generate_datasets(root)
    return root


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_run_gives_its_recorded_results(case: Case, datasets: Path, tmp_path: Path) -> None:
    if case.dataset == "fashion_mnist" and FASHION_MNIST is None:
        pytest.skip(FASHION_MNIST_MISSING)  # the paper scenarios' real data: CI installs it
    assert (EXPECTED / case.name).is_dir(), f"no recorded result for {case.name}: python -m tests.golden.record"
    recorded, test_samples = expected(case)
    problems = differences(recorded, result_of(run_case(case, tmp_path, datasets)), Tolerance.of(case, test_samples))
    resumed = ", resumed after SIGKILL" if case.resumed else ""
    assert not problems, f"{case.scenario} seed {case.seed}{resumed}:\n" + "\n".join(problems)


def differences(recorded: Result, got: Result, tolerance: Tolerance) -> list[str]:
    """One line per column (or run.json key) that differs, naming its first differing row."""
    problems = [
        f"run.json {key}: {problem}"
        for key in recorded.run
        if (
            problem := json_difference(
                recorded.run[key], got.run.get(key), float_tolerance(key in TIGHT_RUN_KEYS, tolerance)
            )
        )
    ]
    for name, want in recorded.tables.items():
        have = got.tables[name]
        if want.column_names != have.column_names:
            problems.append(f"table {name}: columns {have.column_names}, recorded {want.column_names}")
            continue
        if len(want) != len(have):
            problems.append(f"table {name}: {len(have)} rows, recorded {len(want)}")
        rows = min(len(want), len(have))
        for column in want.column_names:
            found = first_difference(name, column, want[column][:rows], have[column][:rows], tolerance)
            if found is not None:
                index, problem = found
                problems.append(f"table {name}, column {column}, row {index}{row_key(want, index)}: {problem}")
    return problems


def float_tolerance(tight: bool, tolerance: Tolerance) -> tuple[float, float]:
    """(rtol, atol) for a virtual-time value, else the case's for training's."""
    return (TIGHT_RTOL, TIGHT_ATOL) if tight else (tolerance.rtol, tolerance.atol)


def first_difference(
    table: str, column: str, want: pa.ChunkedArray, have: pa.ChunkedArray, tolerance: Tolerance
) -> tuple[int, str] | None:
    """(row, what differs) of the column's first difference beyond its tolerance, None if within."""
    expected_values, values = want.to_pylist(), have.to_pylist()
    if pa.types.is_floating(want.type):
        a, b = np.array(expected_values, dtype=float), np.array(values, dtype=float)
        if column in ACCURACY_COLUMNS.get(table, ()):
            # accuracies are counts over the test set: compared as counts, free of the quotients' rounding
            flips = np.rint(np.abs(b - a) * tolerance.test_samples)
            close = (flips <= tolerance.accuracy_samples) | (np.isnan(a) & np.isnan(b))
        else:
            rtol, atol = float_tolerance(column in TIGHT_COLUMNS.get(table, ()), tolerance)
            close = np.isclose(b, a, rtol=rtol, atol=atol, equal_nan=True)
        if close.all():
            return None
        index = int(np.argmin(close))
        return index, f"recorded {expected_values[index]!r}, got {values[index]!r}"
    for index, (x, y) in enumerate(zip(expected_values, values)):
        if column in JSON_COLUMNS.get(table, ()):
            problem = json_difference(json.loads(x), json.loads(y), (tolerance.rtol, tolerance.atol))
        else:
            problem = None if x == y else f"recorded {x!r}, got {y!r}"
        if problem:
            return index, problem
    return None


def json_difference(want: Any, have: Any, tolerance: tuple[float, float], path: str = "") -> str | None:
    """Where two JSON values differ, floats compared within (rtol, atol); None if they do not."""
    where = f" at {path}" if path else ""
    if isinstance(want, dict) and isinstance(have, dict):
        if want.keys() != have.keys():
            return f"keys {sorted(have)}, recorded {sorted(want)}{where}"
        return next(
            (p for k in want if (p := json_difference(want[k], have[k], tolerance, f"{path}.{k}" if path else k))),
            None,
        )
    if isinstance(want, list) and isinstance(have, list):
        if len(want) != len(have):
            return f"{len(have)} items, recorded {len(want)}{where}"
        items = enumerate(zip(want, have))
        return next((p for k, (x, y) in items if (p := json_difference(x, y, tolerance, f"{path}[{k}]"))), None)
    if isinstance(want, float) and isinstance(have, (int, float)) and not isinstance(have, bool):
        rtol, atol = tolerance
        same = np.isclose(have, want, rtol=rtol, atol=atol, equal_nan=True)
        return None if same else f"recorded {want!r}, got {have!r}{where}"
    return None if type(want) is type(have) and want == have else f"recorded {want!r}, got {have!r}{where}"


def row_key(table: pa.Table, index: int) -> str:
    """The round and client of a row, where the table has them."""
    keys = [f"{k} {table[k][index].as_py()}" for k in ("round", "client") if k in table.column_names]
    return f" ({', '.join(keys)})" if keys else ""

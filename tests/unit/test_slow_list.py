"""tests/slow.py names tests that exist, so `make test-fast` leaves out exactly what it says."""

from __future__ import annotations

import ast

from tests.conftest import REPO
from tests.slow import SLOW

# Files whose every test is slow by nature, each with fast tests of the same code elsewhere.
ALL_SLOW_FILES = {
    "tests/e2e/test_bench_rss.py",
    "tests/e2e/test_golden_results.py",
    "tests/e2e/test_packaging.py",
    "tests/e2e/test_ray_multinode.py",  # a Ray cluster of two raylets; test_ray_launcher.py's refusals are fast
    "tests/e2e/test_reproduce_rerun.py",
}


def _tests_of(path: str) -> set[str]:
    tree = ast.parse((REPO / path).read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_slow_entry_names_a_test_function_of_its_file():
    missing = [f"{f}::{t}" for f, tests in SLOW.items() for t in tests if t.split("[")[0] not in _tests_of(f)]
    assert missing == []


def test_the_fast_selection_keeps_a_test_of_every_e2e_file_but_the_named_ones():
    e2e = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tests/e2e").glob("test_*.py"))
    left_out_whole = {f for f in e2e if _tests_of(f) <= set(SLOW.get(f, {}))}
    assert left_out_whole == ALL_SLOW_FILES

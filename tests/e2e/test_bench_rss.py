"""bench.rss_tree: a run's peak memory is the sum over its whole process tree."""

import pytest

from bench.rss_tree import peak_tree_rss
from tests.conftest import FAST


def test_the_peak_counts_the_server_its_evaluator_and_its_workers():
    peak, sizes, wall = peak_tree_rss([*FAST, "workers=1", "budget.rounds=3"])
    assert len(sizes) >= 3  # the server, the evaluator and the worker (and the zygote while it runs)
    # > 10 MB each: what any CPython interpreter holds once started, on any machine
    assert peak == pytest.approx(sum(sizes)) and min(sizes) > 10 and wall > 0

"""bench.rss_tree: a run's peak memory is the sum over its whole process tree."""

import pytest

from bench.rss_tree import peak_tree_rss
from tests.conftest import FAST


def test_the_peak_counts_the_server_its_evaluator_and_its_workers():
    # rounds enough that the readings, 0.1 s apart, land while all three run, on a loaded machine too
    p = peak_tree_rss([*FAST, "workers=1", "budget.rounds=100"])
    assert len(p.at_peak) >= 3  # the server, the evaluator and the worker (and the zygote while it runs)
    # > 10 MB each: what any CPython interpreter holds once started, on any machine
    assert p.total == pytest.approx(sum(p.at_peak)) and min(p.at_peak) > 10 and p.wall > 0
    assert len(p.others) >= 2 and p.server <= p.total and max(p.others) <= p.total

"""round.mode=buffered|async: what the configuration refuses, in one line naming the key; what a policy sees."""

from __future__ import annotations

import pytest

from emulator.config import ConfigError, load

BUFFERED = ["round.mode=buffered", "clients.select=uniform", "clients.n=8", "buffered.concurrency=4", "buffered.k=2"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["round.mode=sometimes"], r"round\.mode = 'sometimes': expected sync \| buffered \| async"),
        (["buffered.staleness=linear"], r"buffered\.staleness = 'linear': expected constant \| polynomial \| hinge"),
        ([*BUFFERED, "policy=oort"], r"round\.mode = 'buffered': expected sync with policy=oort: .* to fedavg_dp"),
        ([*BUFFERED, "policy=fedcs"], r"round\.mode = 'buffered': expected sync with policy=fedcs"),
        ([*BUFFERED, "policy=dp_fedavg"], r"round\.mode = 'buffered': expected sync with policy=dp_fedavg"),
        (["round.mode=async", "clients.select=uniform", "policy=ali_dpfl"], r"expected sync with policy=ali_dpfl"),
        ([*BUFFERED, "clients.select=all"], r"clients\.select = 'all': expected uniform \| round_robin"),
        ([*BUFFERED, "buffered.concurrency=9"], r"buffered\.concurrency = 9: expected an integer in \[1, clients\.n=8"),
        ([*BUFFERED, "buffered.k=9"], r"buffered\.k = 9: expected an integer in \[1, clients\.n=8\]"),
        ([*BUFFERED, "buffered.alpha=0"], r"buffered\.alpha = 0"),
        ([*BUFFERED, "links.server_up_bps=8e6"], r"links\.server_up_bps = 8000000\.0: expected 0 \(unlimited\)"),
        ([*BUFFERED, "availability.on_unavailable=drop"], r"availability\.on_unavailable = 'drop': expected exclude"),
        ([*BUFFERED, "round.deadline_s=2", "round.partial_work=true"], r"round\.partial_work = True: expected false"),
        ([*BUFFERED, "impact.kind=uniform"], r"impact\.kind = 'uniform': expected data_size"),
    ],
)
def test_buffered_modes_refuse_in_one_line(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as e:
        load(None, overrides)
    assert "\n" not in str(e.value)


def test_sync_is_the_default_and_fedavg_dp_takes_buffered_and_async() -> None:
    assert load(None, []).round.mode == "sync"
    assert load(None, BUFFERED).buffered.k == 2
    assert load(None, [*BUFFERED, "round.mode=async"]).round.mode == "async"

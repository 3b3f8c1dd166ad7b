"""`python -m bench.accountants`: a timed row per dp.accountant, each of them run."""

import pytest

from bench import accountants


@pytest.mark.parametrize("varying", [[], ["--varying-tau"], ["--population"]])
def test_table_has_a_timed_row_per_accountant(capsys, varying):
    pytest.importorskip("dp_accounting", reason="dp.accountant=pld: pip install 'dpfl-emulator[pld]'")
    argv = ["--clients", "40", "--per-round", "8", "--rounds", "3", "--repeats", "2", *varying]
    assert accountants.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ("(in turn)" in lines[2]) == (varying == ["--varying-tau"])
    assert ("dp_fedavg's population ledger, Poisson q = 0.2" in lines[2]) == (varying == ["--population"])
    rows = [line.split() for line in lines if line.split()[:1] in (["rdp"], ["prv"], ["pld"])]
    assert [r[0] for r in rows] == ["rdp", "prv", "pld"]
    assert all(len(r) == 10 and all(float(x) >= 0 for x in r[1:]) for r in rows)


def test_histories_have_a_timed_row_per_accountant_and_size(capsys):
    pytest.importorskip("dp_accounting", reason="dp.accountant=pld: pip install 'dpfl-emulator[pld]'")
    argv = ["--clients", "10", "--per-round", "2", "--rounds", "1", "--repeats", "1", "--histories", "2,3"]
    assert accountants.main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out[out.index("histories of distinct runs") :].splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [(a, n) for n in ("2", "3") for a in ("rdp", "prv", "pld")]
    assert all(len(r) == 7 and all(float(x) >= 0 for x in r[2:]) for r in rows)

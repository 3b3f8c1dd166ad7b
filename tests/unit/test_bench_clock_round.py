"""`python -m bench.clock_round`: a timed row per engine, the queue's and SimPy's."""

from bench import clock_round


def test_table_has_a_timed_row_per_engine(capsys):
    assert clock_round.main(["--clients", "30", "--per-round", "5", "--rounds", "3", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("clock: 30 clients, 5 a round, 3 rounds")
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == ["queue", "simpy"]
    assert all(len(r) == 4 and all(float(x) >= 0 for x in r[1:]) for r in rows)
    assert float(rows[1][3]) == 1.0  # SimPy against itself

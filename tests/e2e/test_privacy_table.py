"""The privacy each client spent is a Parquet table of the clients charged (privacy.parquet, issue 52), which
`python -m analysis` reads; run.json keeps what is not per client."""

import json
import subprocess
import sys

import pytest

from emulator.output.results import PRIVACY_FILE, read_privacy, read_table
from emulator.privacy import epsilon
from tests.cli import REPO


def test_only_the_charged_clients_have_a_row_with_their_ledger_and_epsilon(emulate):
    d = emulate("clients.n=40", "clients.select=uniform", "clients.per_round=3", "budget.rounds=2")
    m = json.loads((d / "run.json").read_text())
    trained = {r["client"] for r in read_table(d, "client_rounds").to_pylist() if r["local_steps"] > 0}
    table = read_privacy(d).to_pylist()
    assert [r["client"] for r in table] == sorted(trained) and 3 <= len(trained) <= 6
    assert m["privacy"] == {"clients_charged": len(trained), "table": PRIVACY_FILE}  # nothing per client
    dp = m["scenario"]["dp"]
    for r in table:
        ledger = json.loads(r["ledger"])
        history = [(e["q"], e["sigma"], e["steps"]) for e in ledger["entries"]]
        assert r["epsilon"] == epsilon(history, dp["delta"], dp["conversion"], accountant=dp["accountant"])
        assert r["epsilon_unamplified"] is None


def test_a_client_level_run_lists_the_population_in_run_json_and_the_clients_in_the_table(emulate):
    d = emulate("policy=dp_fedavg", "clients.n=30", "clients.per_round=3", "dp_fedavg.noise_multiplier=1.0")
    m = json.loads((d / "run.json").read_text())
    table = read_privacy(d).to_pylist()
    rounds = {r["client"]: json.loads(r["ledger"])["rounds_trained"] for r in table}
    assert m["privacy"]["clients_charged"] == len(table) and all(k > 0 for k in rounds.values())
    assert {r["epsilon"] for r in table} == {m["privacy"]["population"]["epsilon_amplified"]}
    assert all(0 < r["epsilon_unamplified"] for r in table)


def test_python_m_analysis_queries_the_privacy_table(emulate):
    d = emulate("clients.n=12", "clients.select=uniform", "clients.per_round=2", "budget.rounds=2")
    sql = "SELECT client FROM privacy ORDER BY client"
    command = [sys.executable, "-m", "analysis", str(d), "--query", sql]
    r = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    charged = [row["client"] for row in read_privacy(d).to_pylist()]
    assert lines[0].split() == ["client"] and lines[-1] == f"({len(charged)} rows)"
    assert [int(line) for line in lines[2:-1]] == charged


def test_a_table_that_cannot_be_written_fails_the_run_and_run_json_says_why(emulate, monkeypatch, tmp_path):
    from emulator.output.results import ResultsWriteError, RunWriter

    def full(self, rows):
        raise ResultsWriteError(f"cannot write {self.dir / PRIVACY_FILE}: No space left on device")

    monkeypatch.setattr(RunWriter, "write_privacy", full)
    with pytest.raises(ResultsWriteError, match=r"privacy\.parquet: No space left on device"):
        emulate()
    (d,) = tmp_path.iterdir()
    m = json.loads((d / "run.json").read_text())
    assert m["status"] == "failed" and m["error"].startswith("ResultsWriteError: cannot write ")
    assert m["privacy"]["table"].startswith("not written: cannot write ") and not (d / PRIVACY_FILE).exists()

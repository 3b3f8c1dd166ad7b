"""A kill between a table's write and its rename leaves a temporary that no reader of the table sees."""

from __future__ import annotations

import pyarrow.dataset as ds
import pytest

from emulator.output import results


def events(rnd: int) -> dict[str, list[dict]]:
    return {"events": [{"round": rnd, "t": float(rnd), "client": 0, "kind": "download_start", "nbytes": 10}]}


def test_a_table_killed_mid_write_reads_as_the_rounds_before_until_discarded(tmp_path, monkeypatch):
    writer = results.RunWriter(tmp_path)
    writer.write_round(0, events(0))

    def killed(src, dst):  # the process dies after the temporary is written, before its rename
        raise SystemExit("SIGKILL")

    monkeypatch.setattr(results.os, "replace", killed)
    with pytest.raises(SystemExit):
        writer.write_round(1, events(1))
    monkeypatch.undo()
    assert len(list((tmp_path / "events").iterdir())) == 2  # round 0 and round 1's temporary
    assert results.read_table(tmp_path, "events")["round"].to_pylist() == [0]
    assert ds.dataset(tmp_path / "events").to_table()["round"].to_pylist() == [0]  # what pandas and polars read
    writer.discard_from(1)
    assert [f.name for f in (tmp_path / "events").iterdir()] == ["round-000000.parquet"]

"""The end-of-run summary against the run's own Parquet, and what hand-started workers say."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from emulator.__main__ import main
from emulator.output.summary import summarise_run
from nodes.worker import WAITING_NOTICE_S
from tests.conftest import FAST

ROOT = Path(__file__).resolve().parents[2]


def fields(summary: str) -> dict[str, str]:
    """label -> text of each summary line."""
    return dict(line.split(None, 1) for line in summary.splitlines())


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, str]:
    """A real short run through the CLI, and what it printed."""
    out = tmp_path_factory.mktemp("summary")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([*FAST, "scenario=dropout.yaml", "clients.n=6", f"output.dir={out}", "output.name=r"]) == 0
    return out / "r", printed.getvalue()


def test_the_cli_prints_the_summary_of_what_the_run_wrote(finished):
    run_dir, printed = finished
    assert summarise_run(run_dir) in printed
    got = fields(summarise_run(run_dir))
    rounds = pq.read_table(run_dir / "rounds").sort_by("round").to_pydict()
    manifest = json.loads((run_dir / "run.json").read_text())
    acc = rounds["test_accuracy"]
    assert got["status"] == f"complete: {manifest['stop_reason']}"
    assert got["rounds"] == f"{len(acc)} completed, {manifest['virtual_time_s']:.2f} s of virtual time"
    assert got["accuracy"] == f"final {acc[-1]:.4f}, best {max(acc):.4f} (round {int(np.argmax(acc))})"
    assert got["privacy"].startswith(
        f"sample-level (DP-SGD, rdp): max ε over clients = {max(rounds['max_epsilon']):.4g} at δ = 1e-05 (budget ε = 8)"
    )
    total = sum(rounds["bytes_down"]) + sum(rounds["bytes_up"])
    assert got["traffic"].startswith(f"{total / 1e6:.2f} MB")
    assert got["updates"] == (
        f"{sum(rounds['arrived'])} on time, {sum(rounds['late'])} late, {sum(rounds['lost'])} "
        f"lost, {sum(rounds['failed'])} failed, of {sum(rounds['selected'])} sent"
    )
    assert got["workers"] == "2 started here"
    assert got["next"] == f"python -m analysis {run_dir}"
    assert manifest["privacy_mechanism"] == "rdp" and manifest["remote_workers"] == {}


def test_a_run_that_did_not_complete_ends_with_the_resume_command(finished, tmp_path):
    run_dir = shutil.copytree(finished[0], tmp_path / "run with space")
    manifest = json.loads((run_dir / "run.json").read_text())
    manifest.update(status="interrupted", stop_reason=None)
    (run_dir / "run.json").write_text(json.dumps(manifest))
    got = fields(summarise_run(run_dir))
    assert got["status"] == "interrupted" and "next" not in got
    assert got["resume"] == f"python -m emulator resume '{run_dir}'"


def test_client_level_output_noise_is_labelled_so_with_its_delta(emulate):
    got = fields(summarise_run(emulate("fu_tuning.mechanism=laplace", "dp.epsilon=4", scenario="fu_tuning")))
    assert got["privacy"].startswith("client-level (output noise, fu_laplace): max ε over clients = ")
    assert " at δ = 0 (budget ε = 4)" in got["privacy"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_hand_started_worker_says_what_it_does_and_run_json_lists_it(emulate, tmp_path):
    from nodes.contracts.keys import keygen

    address, keys = f"tcp://127.0.0.1:{free_port()}", tmp_path / "keys"
    keygen(keys)
    hand = subprocess.Popen(
        [sys.executable, "-m", "nodes.worker", "--connect", address, "--id", "by-hand", "--keys", str(keys)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run = emulate(
            f"transport.address={address}", f"transport.keys_dir={keys}", "workers=1", "transport.min_workers=2"
        )
        assert hand.wait(timeout=30) == 0
        said = hand.stderr.read().splitlines()
    finally:
        hand.kill()
    states = [line.split(": ", 2)[1].split()[0] for line in said]
    assert states == ["connected", "serving", "done"], said
    assert said[-1].endswith("tasks trained)")
    manifest = json.loads((run / "run.json").read_text())
    assert list(manifest["remote_workers"]) == ["by-hand"] and list(manifest["workers"]) == ["local-0.0"]
    assert fields(summarise_run(run))["workers"] == "1 started here, 1 joined: by-hand"


def test_a_worker_waiting_for_a_server_that_is_not_there_says_so_periodically(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"  # nobody listens there
    worker = subprocess.Popen(
        [sys.executable, "-m", "nodes.worker", "--connect", address, "--id", "w"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [worker.stderr.readline() for _ in range(2)]
    finally:
        worker.kill()
        worker.wait()
    for n, line in enumerate(lines, 1):
        assert line.startswith(
            f"worker w: waiting for the server at {address} (no answer for {n * WAITING_NOTICE_S:.0f} s"
        ), line


@pytest.mark.parametrize(
    "address", ["127.0.0.1:5555", "tcp://127.0.0.1", "tcp://127.0.0.1:70000", "ipc://", "tcp://::1:5555"]
)
def test_a_malformed_connect_address_is_one_line_and_exit_2(address):
    r = subprocess.run(
        [sys.executable, "-m", "nodes.worker", "--connect", address],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: --connect {address}: expected tcp://HOST:PORT")
    if address == "127.0.0.1:5555":
        assert "did you mean tcp://127.0.0.1:5555?" in r.stderr

"""Key files are secrets (OpenSSH's rules): keygen never loosens or takes over a directory it did not
create, the server and the workers refuse keys others could read or replace, and a worker whose
handshake cannot succeed ends in one line, exit 3, in bounded time."""

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.__main__ import main as cli
from emulator.config import ConfigError, load
from nodes.contracts.keys import AUTHORIZED, CLIENT_PUBLIC, CLIENT_SECRET, SERVER_PUBLIC, SERVER_SECRET, keygen
from nodes.transport.pool import WorkerPool
from nodes.worker import HANDSHAKE_S, REFUSED_EXIT

ROOT = Path(__file__).resolve().parents[2]
SECRETS = (SERVER_SECRET, CLIENT_SECRET)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def worker(address: str, keys: Path, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "nodes.worker", "--connect", address, "--id", "w", "--keys", str(keys)]
    with open(log, "w") as f:
        return subprocess.Popen(cmd, cwd=ROOT, stderr=f)


def one_line(log: Path) -> str:
    lines = log.read_text().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# --- keygen ---------------------------------------------------------------------------------


def test_keygen_refuses_a_non_empty_directory_in_one_line_and_leaves_it_as_it_was(tmp_path, capsys):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)  # like /tmp: chmod 0700 would lock every other user out
    (d / "notes.txt").write_text("theirs")
    assert cli(["keygen", str(d)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"{d} is not empty (notes.txt)" in err[0], err
    assert mode(d) == 0o1777 and [p.name for p in d.iterdir()] == ["notes.txt"]


def test_keygen_creates_a_new_directory_0700_with_secret_files_0600(tmp_path):
    d = tmp_path / "new" / "keys"
    assert cli(["keygen", str(d)]) == 0
    assert mode(d) == 0o700 and mode(d / AUTHORIZED) == 0o700
    assert all(mode(d / n) == 0o600 for n in SECRETS)
    assert all(not mode(p) & 0o022 for p in [d / SERVER_PUBLIC, d / CLIENT_PUBLIC, d / AUTHORIZED / CLIENT_PUBLIC])
    load(None, ["transport.address=tcp://0.0.0.0:5555", f"transport.keys_dir={d}"])  # what it wrote is accepted


def test_keygen_uses_an_empty_directory_without_changing_its_mode(tmp_path):
    d = tmp_path / "keys"
    d.mkdir()
    d.chmod(0o755)
    assert cli(["keygen", str(d)]) == 0
    assert mode(d) == 0o755  # others may list it, never read a secret key in it
    assert all(mode(d / n) == 0o600 for n in SECRETS) and mode(d / AUTHORIZED) == 0o700
    load(None, ["transport.address=tcp://0.0.0.0:5555", f"transport.keys_dir={d}"])


def test_keygen_refuses_an_empty_directory_others_may_write(tmp_path, capsys):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o1777)
    assert cli(["keygen", str(d)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"permissions 1777 for {d} are too open" in err[0], err
    assert mode(d) == 0o1777 and not list(d.iterdir())


def test_keygen_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert cli(["keygen", str(tmp_path / "file" / "keys")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: keygen {tmp_path}/file/keys: ") and "Not a directory" in err[0]


# --- the server and the workers refuse unprotected keys -------------------------------------


def loosen(keys: Path, case: str) -> str:
    """Make one of keygen's files or directories unsafe; what the refusal must say."""
    if case == "owned_by_another_user":
        os.chown(keys / SERVER_SECRET, 65534, 65534)
        return rf"{keys / SERVER_SECRET} is owned by uid 65534: expected one of this user's"
    path, m = {
        "server_secret_0644": (keys / SERVER_SECRET, 0o644),
        "client_secret_0640": (keys / CLIENT_SECRET, 0o640),
        "authorized_0777": (keys / AUTHORIZED, 0o777),
        "keys_dir_0775": (keys, 0o775),
        "authorized_key_0666": (keys / AUTHORIZED / CLIENT_PUBLIC, 0o666),
        "server_public_0664": (keys / SERVER_PUBLIC, 0o664),
    }[case]
    path.chmod(m)
    if path.name.endswith("_secret"):
        return rf"UNPROTECTED PRIVATE KEY FILE: permissions {m:04o} for {path} are too open: expected 0600"
    return rf"permissions {m:04o} for {path} are too open: .* expected no write for group and others"


SERVER_CASES = [
    "server_secret_0644",
    "client_secret_0640",
    "authorized_0777",
    "keys_dir_0775",
    "authorized_key_0666",
    "server_public_0664",
    pytest.param(
        "owned_by_another_user",
        marks=pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user takes root"),
    ),
]


@pytest.mark.parametrize("case", SERVER_CASES)
def test_the_server_refuses_keys_others_could_read_or_replace(tmp_path, case):
    keys = tmp_path / "keys"
    keygen(keys)
    expected = loosen(keys, case)
    with pytest.raises(ConfigError, match=rf"^transport\.keys_dir = '{keys}': {expected}"):
        load(None, ["transport.address=tcp://0.0.0.0:5555", f"transport.keys_dir={keys}"])


def test_the_cli_refuses_a_world_readable_server_secret_in_one_line_before_any_run_dir(tmp_path):
    keys, out = tmp_path / "keys", tmp_path / "runs"
    keygen(keys)
    (keys / SERVER_SECRET).chmod(0o644)
    out.mkdir()
    p = subprocess.run(
        [sys.executable, "-m", "emulator", f"transport.address={free_address()}", f"transport.keys_dir={keys}"]
        + [f"output.dir={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.splitlines()) == 1, p.stderr
    assert f"permissions 0644 for {keys / SERVER_SECRET} are too open: expected 0600" in p.stderr
    assert not list(out.iterdir())


@pytest.mark.parametrize("case", ["client_secret_0640", "keys_dir_0775", "server_public_0664"])
def test_a_worker_refuses_keys_others_could_read_or_replace_in_one_line_exit_3(tmp_path, case):
    keys = tmp_path / "keys"
    keygen(keys)
    expected = loosen(keys, case)
    log = tmp_path / "w.log"
    p = worker("tcp://127.0.0.1:1", keys, log)  # refused before it connects anywhere
    try:
        assert p.wait(timeout=60) == REFUSED_EXIT
    finally:
        p.kill()
        p.wait()
    err = one_line(log)
    assert err.startswith(f"error: --keys {keys}: ") and re.search(expected, err), err


# --- a handshake that cannot succeed ends, one that has not started yet waits ----------------


def test_a_worker_with_an_authorized_key_but_another_servers_key_exits_3_at_once(tmp_path):
    keys, other, held = tmp_path / "keys", tmp_path / "other", tmp_path / "held"
    keygen(keys)
    keygen(other)
    shutil.copytree(keys, held)  # the authorized client key pair ...
    (held / SERVER_SECRET).unlink()
    shutil.copy(other / SERVER_PUBLIC, held / SERVER_PUBLIC)  # ... with another server's public key
    address = free_address()
    pool = WorkerPool(address, load(None, [f"transport.keys_dir={keys}"]).transport)
    try:
        started = time.monotonic()
        p = worker(address, held, tmp_path / "w.log")
        try:
            assert p.wait(timeout=30) == REFUSED_EXIT
        finally:
            p.kill()
            p.wait()
        assert time.monotonic() - started < 30
        assert not pool.workers
    finally:
        pool.close()
    assert "holds another server's public key" in one_line(tmp_path / "w.log")


def test_a_worker_whose_peer_accepts_but_never_shakes_hands_exits_3_in_bounded_time(tmp_path):
    keys = tmp_path / "keys"
    keygen(keys)
    with socket.socket() as silent:  # the kernel accepts for it: a stopped server, or another service
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        p = worker(address, keys, tmp_path / "w.log")
        try:
            assert p.wait(timeout=30) == REFUSED_EXIT
        finally:
            p.kill()
            p.wait()
        assert time.monotonic() - started < 30
    err = one_line(tmp_path / "w.log")
    assert err == (
        f"worker w: the server at {address} accepted the connection but did not complete the handshake "
        f"within {HANDSHAKE_S:.0f} s (is a dpfl server listening there, and is it running?)"
    )


def test_a_worker_started_before_its_server_waits_for_it_past_the_handshake_bound(tmp_path):
    keys = tmp_path / "keys"
    keygen(keys)
    address = free_address()
    p = worker(address, keys, tmp_path / "w.log")
    try:
        time.sleep(HANDSHAKE_S * 1.5)  # nothing listens yet: connection refused, retried
        assert p.poll() is None
        pool = WorkerPool(address, load(None, [f"transport.keys_dir={keys}"]).transport)
        try:
            deadline = time.monotonic() + 30
            while "w" not in pool.joined:
                assert time.monotonic() < deadline and p.poll() is None
                pool._poll(0.1)
        finally:
            pool.close()
    finally:
        p.kill()
        p.wait()

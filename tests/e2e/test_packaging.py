"""The installed package, not the checkout: a wheel built from the tracked files, installed into a
bare target directory, runs a shipped scenario by name from another working directory."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {
    "dpfl-emulator": "emulator.__main__:cli",
    "dpfl-analysis": "analysis.__main__:main",
    "dpfl-worker": "nodes.worker:cli",
}

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("setuptools") is None, reason="building the wheel offline needs setuptools installed"
    ),
]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of the tracked files (a copy: building in place would leave build/ and egg-info behind)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():  # a file deleted in the work tree but not yet in git
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    # no build isolation: setuptools is here already, and the test must not need the network
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp / "dist"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = (tmp / "dist").glob("dpfl_emulator-*.whl")
    return built


def tracked(*patterns: str) -> list[str]:
    return subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True).stdout.split()


def test_the_wheel_ships_every_package_scenario_trace_and_the_console_scripts(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    # the top-level scenarios/ as the package data of emulator.scenarios, each file once
    shipped = {f"emulator/{name}" for name in tracked("scenarios")}
    assert len(shipped) > 30 and shipped <= names
    assert not any(n.startswith("scenarios/") for n in names)
    modules = {n for n in tracked("emulator", "nodes", "analysis") if n.endswith(".py")}
    assert modules <= names, f"left out of pyproject.toml's packages: {sorted(modules - names)}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    for script, target in SCRIPTS.items():
        assert f"{script} = {target}" in text


def test_an_installed_wheel_runs_a_shipped_scenario_by_name_from_another_directory(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}  # the installed copy only, not the checkout
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "emulator",
            "scenario=dropout.yaml",
            "budget.rounds=1",
            "clients.n=4",
            "workers=1",
            "output.progress=false",
            f"output.dir={tmp_path / 'runs'}",
            "output.name=w",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "runs" / "w" / "run.json").read_text())
    assert manifest["status"] == "complete" and manifest["scenario"]["name"] == "dropout"
    r = subprocess.run(
        [sys.executable, "-c", "import emulator; print(emulator.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert Path(r.stdout.strip()).is_relative_to(site)
    paper = subprocess.run(
        [sys.executable, "-c", "from emulator.config import load; print(load('paper/udp_crd_fmnist.yaml').policy)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert paper.stdout.strip() == "udp_crd", paper.stderr

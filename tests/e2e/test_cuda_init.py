"""No process that forks workers initialises CUDA: a CUDA driver initialised before fork() cannot be
used in the child (torch: "Cannot re-initialize CUDA in forked subprocess"). Every process of a run
here loads a spy (a sitecustomize on its Python path) that, wherever torch is imported, logs the import
and every call of torch.cuda's functions that initialise CUDA or need it, with the process's command
line, and what torch.cuda.is_initialized() says before each fork(); the log then says who imported
torch and who called what. The `gpu` test is skipped without a CUDA GPU (python -m bench.gpu_check runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from emulator.run.devices import nvidia_driver
from tests.conftest import needs_gpu

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote needs Linux's subreaper")

SPY = """
import importlib.abc, importlib.machinery, os, sys

LOG = os.environ["DPFL_CUDA_SPY_LOG"]
CALLS = ("is_available", "device_count", "init", "_lazy_init", "set_device", "current_device", "mem_get_info",
         "get_device_name", "synchronize")


def note(what):
    with open(LOG, "a") as f:
        f.write(f"{os.getpid()}\\t{what}\\t{sys.argv[0]}\\n")


def spy(torch):
    os.register_at_fork(before=lambda: note(f"fork: cuda initialised {torch.cuda.is_initialized()}"))
    for owner, names in ((torch.cuda, CALLS), (torch._C, ("_cuda_init", "_cuda_getDeviceCount"))):
        for name in names:
            real = getattr(owner, name, None)
            if real is not None:
                def spied(*args, _real=real, _name=name, **kwargs):
                    note(_name)
                    return _real(*args, **kwargs)
                setattr(owner, name, spied)


class TorchSpy(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            note("import torch")
            spy(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, TorchSpy())
"""


def spied_run(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, list[tuple[str, str, str]]]:
    """`python -m emulator overrides` with the spy in every process: its result, and the log's (pid, what,
    sys.argv[0]) lines."""
    spy_dir, log = tmp_path / "spy", tmp_path / "cuda.log"
    spy_dir.mkdir()
    (spy_dir / "sitecustomize.py").write_text(SPY)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(spy_dir), str(REPO), os.environ.get("PYTHONPATH", "")]),
        "DPFL_CUDA_SPY_LOG": str(log),
    }
    args = ["workers=2", "clients.n=4", "budget.rounds=1", "dp.tau=1", "output.progress=false"]
    result = subprocess.run(
        [sys.executable, "-m", "emulator", *args, f"output.dir={tmp_path / 'runs'}", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = log.read_text().splitlines() if log.exists() else []
    return result, [tuple(line.split("\t")) for line in lines]  # type: ignore[misc]


def zygote_pid(log: list[tuple[str, str, str]]) -> str:
    """The zygote's pid: the one process that imported torch as zygote.py (its forks inherit the import)."""
    (pid,) = {pid for pid, what, argv0 in log if what == "import torch" and Path(argv0).name == "zygote.py"}
    return pid


def cuda_calls(log: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    return [line for line in log if line[1] != "import torch" and not line[1].startswith("fork")]


def forks(log: list[tuple[str, str, str]], pid: str) -> list[str]:
    """What torch.cuda.is_initialized() said in process `pid` before each of its fork()s."""
    return [what for p, what, _ in log if p == pid and what.startswith("fork")]


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_a_run_on_the_cpu_initialises_cuda_nowhere_and_the_server_imports_no_torch(tmp_path, device):
    if device == "auto" and nvidia_driver():
        pytest.skip("device=auto is cuda on a machine with an NVIDIA driver (the gpu test below)")
    result, log = spied_run(tmp_path, f"device={device}")
    assert result.returncode == 0, result.stderr[-2000:]
    imports = [argv0 for _, what, argv0 in log if what == "import torch"]
    # the zygote imported torch, and with it the spy, for every worker and the evaluator it forked
    assert [Path(a).name for a in imports] == ["zygote.py"], log
    assert cuda_calls(log) == []
    assert forks(log, zygote_pid(log)) == ["fork: cuda initialised False"] * 3  # 2 workers, the evaluator


def test_only_a_throwaway_process_asks_cuda_for_the_gpus(tmp_path):
    """device=cuda: the server asks about the GPUs in a process of its own (`python -c`), never in the
    zygote; here, without a GPU, that answer refuses the run in one line."""
    result, log = spied_run(tmp_path, "device=cuda")
    if "sees no CUDA GPU" not in result.stderr:
        pytest.skip("this machine has a GPU")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    callers = {argv0 for _, _, argv0 in cuda_calls(log)}
    assert callers == {"-c"}, log  # the query alone
    assert not any(Path(argv0).name == "__main__.py" for _, _, argv0 in log)  # the server imported no torch


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_gpu())])
def test_on_a_gpu_each_forked_process_starts_cuda_itself_after_the_fork(tmp_path, device):
    """On a GPU: the zygote forks with CUDA uninitialised and calls none of it; each worker and the
    evaluator then sets up its own GPU (set_device); the server imports no torch."""
    result, log = spied_run(tmp_path, f"device={device}")
    assert result.returncode == 0, result.stderr[-2000:]
    zygote = zygote_pid(log)
    assert forks(log, zygote) == ["fork: cuda initialised False"] * 3
    calls = cuda_calls(log)
    assert [line for line in calls if line[0] == zygote] == [], log
    assert {Path(argv0).name for _, _, argv0 in calls} == {"-c", "zygote.py"}, log  # the query, the forks
    assert len({pid for pid, what, _ in calls if what == "set_device"}) == 3, log

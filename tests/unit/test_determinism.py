"""How a worker or the evaluator sets torch up on its device (nodes.training.determinism), with torch.cuda's
functions replaced by recorders: on a GPU, cuBLAS's workspace and the deterministic mode are set before
the process's first CUDA call; on a CPU there is no CUDA call at all. No test here needs a GPU."""

from __future__ import annotations

import os

import pytest
import torch

from emulator.config import load
from nodes import worker
from nodes.contracts.schema import to_dict
from nodes.training.determinism import CUBLAS_WORKSPACE
from nodes.transport.zygote import worker_env

# torch.cuda's functions that initialise CUDA or need it, any of which could be a process's first CUDA call
CUDA_CALLS = ("set_device", "init", "_lazy_init", "is_available", "device_count", "current_device", "synchronize")


@pytest.fixture
def cuda_calls(monkeypatch, torch_settings):
    """Each call of a torch.cuda function (CUDA_CALLS), with the process's state as it was made."""
    calls: list[dict] = []

    def recorder(name):
        def record(*args, **kwargs):
            calls.append(
                {
                    "call": name,
                    "args": args,
                    "cublas": os.environ.get(CUBLAS_WORKSPACE[0]),
                    "deterministic": torch.get_deterministic_debug_mode(),
                    "cudnn_benchmark": torch.backends.cudnn.benchmark,
                    "tf32": (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32),
                }
            )

        return record

    for name in CUDA_CALLS:
        monkeypatch.setattr(torch.cuda, name, recorder(name))
    monkeypatch.delenv(CUBLAS_WORKSPACE[0], raising=False)  # as in a worker started by hand
    return calls


def test_a_gpu_worker_is_deterministic_before_its_first_cuda_call(cuda_calls):
    cfg, device = worker._configured(to_dict(load(None, ["device=cuda"])), "cuda:1")
    assert device == torch.device("cuda", 1) and cfg.device == "cuda"
    assert cuda_calls == [
        {
            "call": "set_device",
            "args": (torch.device("cuda", 1),),
            "cublas": ":4096:8",
            "deterministic": 2,  # error: an op without a deterministic CUDA kernel raises
            "cudnn_benchmark": False,
            "tf32": (False, False),
        }
    ]


def test_a_workspace_setting_of_the_users_own_is_kept(cuda_calls, monkeypatch):
    monkeypatch.setenv(CUBLAS_WORKSPACE[0], ":16:8")
    worker._configured(to_dict(load(None, ["device=cuda"])), "cuda:0")
    assert cuda_calls[0]["cublas"] == ":16:8"


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_a_cpu_worker_placed_by_the_server_makes_no_cuda_call(cuda_calls, device):
    """The server tells its local workers their device: even device=auto asks nothing of CUDA there."""
    _, placed = worker._configured(to_dict(load(None, [f"device={device}"])), "cpu")
    assert placed == torch.device("cpu")
    assert cuda_calls == []
    assert torch.get_deterministic_debug_mode() == 1 and torch.get_num_threads() == 1


def test_local_workers_start_with_cublass_deterministic_workspace(monkeypatch):
    monkeypatch.delenv(CUBLAS_WORKSPACE[0], raising=False)
    assert worker_env()[CUBLAS_WORKSPACE[0]] == ":4096:8"
    monkeypatch.setenv(CUBLAS_WORKSPACE[0], ":16:8")
    assert worker_env()[CUBLAS_WORKSPACE[0]] == ":16:8"


@pytest.mark.parametrize("device", ["mps", "cuda:x", "gpu"])
def test_a_device_the_worker_has_no_rules_for_is_one_line_exit_2(capsys, device):
    assert worker.main(["--connect", "ipc:///tmp/nowhere.sock", "--device", device]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --device {device}: expected cpu, cuda or cuda:N"


def test_cuda_without_an_index_is_gpu_0_which_set_device_takes(cuda_calls):
    """torch.cuda.set_device refuses a device without an index: a worker started by hand with device=cuda
    (or on Ray, which shows it its one GPU as GPU 0) trains on GPU 0."""
    _, device = worker._configured(to_dict(load(None, ["device=cuda"])), "")
    assert device == torch.device("cuda", 0)
    assert [(c["call"], c["args"]) for c in cuda_calls] == [("set_device", (torch.device("cuda", 0),))]

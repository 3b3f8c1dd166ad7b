"""How a process that trains or evaluates sets torch up: the same results from the same inputs on its
device, whichever process runs a task.

On a CPU: one thread (one core per worker; CPU float reductions then sum in one order), and
deterministic algorithms wherever torch has a choice. On a GPU (the CUDA rules of torch's
reproducibility notes), before the process first uses it: cuBLAS's fixed workspace
(CUBLAS_WORKSPACE_CONFIG, which local workers have in their environment from the start:
nodes.transport.zygote.worker_env), every op deterministic or an error, cuDNN's convolution kernels chosen
without timing them, float32 without TF32, and the process's GPU the current device. Identical
results then hold on one GPU model with one torch and CUDA build; the noise that DP-SGD draws on a
GPU is not the CPU's (nodes/training/trainer.py), nor is it promised across GPU models.

This module imports no torch: the server reads CUBLAS_WORKSPACE from it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# cuBLAS's deterministic workspace setting (torch's reproducibility notes); a value already in the
# environment is kept
CUBLAS_WORKSPACE = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def set_up_torch(device: torch.device) -> None:
    """Deterministic torch on `device` in this process (see the module's doc)."""
    import torch

    if device.type == "cuda":
        os.environ.setdefault(*CUBLAS_WORKSPACE)  # read when the process first uses cuBLAS
        # = torch.use_deterministic_algorithms(True) without that function's import of torch._inductor
        # (see below): an op without a deterministic CUDA kernel raises, failing its task, rather than vary
        torch.set_deterministic_debug_mode("error")
        torch.backends.cudnn.benchmark = False  # a timed choice of kernels could differ from run to run
        torch.backends.cudnn.allow_tf32 = False  # float32 convolutions and products as a CPU computes them
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.cuda.set_device(device)  # the context, cuBLAS's handles and allocations on this GPU alone
        return
    torch.set_num_threads(1)  # one core per worker; also keeps CPU float reductions identical
    # = torch.use_deterministic_algorithms(True, warn_only=True), which in torch 2.13 also imports
    # torch._inductor to set its flag: start-up CPU in every worker for a compiler we never run
    # (python -m bench --only startup)
    torch.set_deterministic_debug_mode("warn")

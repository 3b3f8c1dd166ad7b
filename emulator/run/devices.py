"""Which device each local worker and the server's evaluator train on, decided by the server before
it starts them, and whether they fit the GPUs' memory.

    placement(cfg) -> Placement      (refuses a run that cannot fit with a one-line ResourceError)

`device=cpu` places everything on the CPU. `device=cuda` places worker k on GPU devices[k mod n],
devices being gpu.devices or every GPU torch sees, `workers=0` starting gpu.workers_per_gpu workers
per GPU, and the evaluator on gpu.evaluator (-1: the last of the devices, which k mod n leaves the
fewest workers). `device=auto` is cuda when the machine has an NVIDIA driver and torch sees a GPU,
else cpu. Each local process is told its device (`python -m nodes.worker --device cuda:1`); workers
started elsewhere (by hand, Ray) resolve the scenario's device on their own machine.

The server imports no torch, and no process that forks workers may initialise CUDA (a CUDA driver
initialised before fork() cannot be used in the child: torch refuses with "Cannot re-initialize CUDA
in forked subprocess", and torch.cuda.is_available() initialises it). So the GPUs are asked of a
process of their own (`query_gpus`: `python -c PROBE`, in the workers' environment, so that it sees
the GPUs they will), which initialises CUDA, reads each GPU's name and free memory, and exits.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from emulator.run.guards import GIB, ResourceError, memory_estimate, model_size, worker_cache_bytes
from nodes.contracts.schema import Device, Launcher, Scenario
from nodes.transport.zygote import PROJECT_ROOT, worker_env

log = logging.getLogger("dpfl")

# Per process on a GPU: its CUDA context, cuBLAS's and cuDNN's kernels and workspaces. An allowance,
# not a measurement of this project's: `python -m bench.gpu_check` measures it on the machine at hand.
CUDA_CONTEXT_BYTES = 500 * 2**20
QUERY_TIMEOUT_S = 120.0  # torch's import and one CUDA context per GPU asked about, on a loaded machine
# What the query process runs: argv[1] is the JSON list of GPU indices to read (null: all of them).
PROBE = """
import json, sys
import torch
asked = json.loads(sys.argv[1])
count = torch.cuda.device_count() if torch.cuda.is_available() else 0
gpus = []
for i in range(count) if asked is None else [i for i in asked if i < count]:
    free, total = torch.cuda.mem_get_info(i)
    gpus.append({"index": i, "name": torch.cuda.get_device_name(i), "free": free, "total": total})
print(json.dumps({"torch": torch.__version__, "count": count, "gpus": gpus}))
"""


@dataclass(frozen=True)
class Gpu:
    index: int  # torch's numbering, under the workers' CUDA_VISIBLE_DEVICES
    name: str
    free: int  # bytes free when asked
    total: int


@dataclass(frozen=True)
class GpuQuery:
    torch: str  # the workers' torch version
    count: int  # GPUs that torch sees
    gpus: list[Gpu]  # those asked about that exist


@dataclass
class Placement:
    """The device of each local worker slot (`workers[k]`, a torch device string) and of the evaluator;
    `workers` is empty where the launcher's workers resolve the scenario's device themselves (Ray)."""

    device: str  # cpu | cuda: what device=auto resolved to
    workers: list[str]
    evaluator: str
    local_workers: int  # the workers the server starts, by whatever launcher
    gpus: list[Gpu] = field(default_factory=list)  # the GPUs used, as the query found them
    torch: str = ""  # the workers' torch version, where it was asked
    gpu_bytes: dict[int, int] = field(default_factory=dict)  # the estimate checked against each GPU's free memory

    @property
    def mixed_models(self) -> str:
        """'' where the GPUs used are of one model, else why the run's tables depend on its workers."""
        models = sorted({g.name for g in self.gpus})
        if len(models) < 2:
            return ""
        return f"GPUs of {len(models)} models ({', '.join(models)}): a client's update depends on which trained it"

    def record(self) -> dict[str, Any]:
        """run.json's `devices`."""
        return {
            "device": self.device,
            "workers": self.workers,
            "evaluator": self.evaluator,
            **({"torch": self.torch} if self.torch else {}),
            **({"gpus": [asdict(g) for g in self.gpus]} if self.gpus else {}),
            **({"gpu_estimate_bytes": {str(i): b for i, b in self.gpu_bytes.items()}} if self.gpu_bytes else {}),
            **({"not_deterministic": self.mixed_models} if self.mixed_models else {}),
        }


def placement(cfg: Scenario) -> Placement:
    """Where the run's local workers and its evaluator train; a ResourceError (one line) when
    device=cuda finds no GPU, gpu.* names one torch does not see, or the GPUs lack the memory."""
    ray = cfg.transport.launcher == Launcher.RAY
    if cfg.device == Device.CPU or (cfg.device == Device.AUTO and not nvidia_driver()):
        return _on_cpu(cfg, ray)
    g = cfg.gpu
    asked = sorted({*g.devices, *([g.evaluator] if g.evaluator >= 0 else [])}) if g.devices else None
    found = query_gpus(asked, worker_env())
    if found.count == 0:
        if cfg.device == Device.AUTO:
            return _on_cpu(cfg, ray)
        raise ResourceError(
            f"device = 'cuda': torch {found.torch} sees no CUDA GPU on this machine; use device=auto or device=cpu"
        )
    devices, evaluator = _gpu_indices(cfg, found.count)
    if ray:  # Ray places its workers on its nodes' GPUs: only the evaluator is ours
        n, workers = cfg.workers or os.cpu_count() or 1, []
    else:
        n = cfg.workers or len(devices) * g.workers_per_gpu
        workers = gpu_slots(n, devices)
    used = {*workers, evaluator}
    placed = Placement(
        "cuda",
        [f"cuda:{i}" for i in workers],
        f"cuda:{evaluator}",
        n,
        [gpu for gpu in found.gpus if gpu.index in used],
        found.torch,
        gpu_memory_needed(cfg, workers, evaluator),
    )
    check_gpu_memory(cfg, placed)
    if placed.mixed_models:
        log.warning("%s; the tables are not those of another worker count (run.json: devices)", placed.mixed_models)
    return placed


def _on_cpu(cfg: Scenario, ray: bool) -> Placement:
    n = cfg.workers or os.cpu_count() or 1
    return Placement("cpu", [] if ray else ["cpu"] * n, "cpu", n)


def _gpu_indices(cfg: Scenario, count: int) -> tuple[list[int], int]:
    """gpu.devices (or every GPU) and the evaluator's GPU, each checked against the `count` torch sees."""
    seen = f"torch sees {count} GPUs (0-{count - 1})" if count > 1 else "torch sees 1 GPU (0)"
    devices = cfg.gpu.devices or list(range(count))
    if max(devices) >= count:
        raise ResourceError(f"gpu.devices = {devices}: {seen} on this machine")
    evaluator = devices[-1] if cfg.gpu.evaluator < 0 else cfg.gpu.evaluator
    if evaluator >= count:
        raise ResourceError(f"gpu.evaluator = {evaluator}: {seen} on this machine")
    return devices, evaluator


def gpu_slots(workers: int, devices: list[int]) -> list[int]:
    """The GPU of each local worker slot: slot k on devices[k mod len(devices)]."""
    return [devices[k % len(devices)] for k in range(workers)]


def nvidia_driver() -> bool:
    """Whether this machine has an NVIDIA driver: without one torch sees no GPU, and device=auto need
    not start a process to ask (Linux's /proc/driver/nvidia; nvidia-smi where that is absent, as on WSL)."""
    return Path("/proc/driver/nvidia").exists() or shutil.which("nvidia-smi") is not None


class GpuQueryError(ResourceError):
    """The process that asks torch about the GPUs failed; the message is its last line of error."""


def query_gpus(indices: list[int] | None, env: dict[str, str]) -> GpuQuery:
    """torch's version, how many GPUs it sees, and the name and memory of those in `indices` (None:
    all), asked of a process of its own (see the module's doc) in environment `env`."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, json.dumps(indices)],
            env=env,
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=QUERY_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise GpuQueryError(f"asking torch about the GPUs took over {QUERY_TIMEOUT_S:.0f} s") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        raise GpuQueryError(f"asking torch about the GPUs failed: {last}")
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    return GpuQuery(answer["torch"], answer["count"], [Gpu(**g) for g in answer["gpus"]])


def worker_gpu_bytes(cfg: Scenario) -> int:
    """What one worker holds on its GPU: its CUDA context, the clients' data it keeps built, and its
    model copies, per-sample gradients and activations (emulator.run.guards.memory_estimate)."""
    return CUDA_CONTEXT_BYTES + worker_cache_bytes(cfg) + memory_estimate(cfg, 1).worker_model


def gpu_memory_needed(cfg: Scenario, workers: list[int], evaluator: int) -> dict[int, int]:
    """Bytes each GPU holds: its workers' (`workers`: each one's GPU), and the evaluator's context,
    model and evaluation batch on GPU `evaluator`."""
    need: dict[int, int] = {}
    for gpu in workers:
        need[gpu] = need.get(gpu, 0) + worker_gpu_bytes(cfg)
    need[evaluator] = need.get(evaluator, 0) + CUDA_CONTEXT_BYTES + memory_estimate(cfg, 1).evaluator_model
    return need


def check_gpu_memory(cfg: Scenario, placed: Placement) -> None:
    """Each GPU's estimate against its free memory, as the query found it."""
    for gpu in placed.gpus:
        need = placed.gpu_bytes[gpu.index]
        if need <= gpu.free:
            continue
        here = sum(w == f"cuda:{gpu.index}" for w in placed.workers)
        evaluator = " and the evaluator" if placed.evaluator == f"cuda:{gpu.index}" else ""
        raise ResourceError(
            f"GPU {gpu.index} ({gpu.name}): estimated {need / GIB:.1f} GiB for {here} workers{evaluator} exceeds "
            f"its {gpu.free / GIB:.1f} GiB free (a worker {worker_gpu_bytes(cfg) / GIB:.2f} GiB: CUDA context "
            f"{CUDA_CONTEXT_BYTES / GIB:.2f}, {model_size(cfg).parameters:,} parameters with the per-sample "
            f"gradients of a batch of {memory_estimate(cfg, 1).batch}); lower gpu.workers_per_gpu or workers, "
            f"spread them over gpu.devices, or lower the model size or dp.q"
        )

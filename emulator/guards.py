"""Checks against the machine before a run starts, so a run that cannot fit fails up front."""
from __future__ import annotations

import os

from emulator.config import Scenario

# Measured: a worker with torch and Opacus imported and synthetic data loaded holds ~380 MB;
# with FashionMNIST ~620 MB, i.e. the raw float32 samples plus ~10% (per-client copies, labels).
PROCESS_BYTES = 400 * 2**20
DATA_OVERHEAD = 1.25
SAMPLE_FLOATS = {"fashion_mnist": 28 * 28, "mnist": 28 * 28, "cifar10": 3 * 32 * 32}
DATASET_SAMPLES = {"fashion_mnist": 70_000, "mnist": 70_000, "cifar10": 60_000}


class ResourceError(RuntimeError):
    """The run would not fit on this machine; the message says why, with the estimate."""


def data_bytes(cfg: Scenario) -> int:
    d = cfg.data
    if d.dataset == "synthetic":
        samples = cfg.clients.n * d.samples_per_client
        return int(samples * d.dim * 4 * DATA_OVERHEAD)
    samples = (d.max_train or DATASET_SAMPLES[d.dataset]) + (d.max_test or 10_000)
    return int(samples * SAMPLE_FLOATS[d.dataset] * 4 * DATA_OVERHEAD)


def memory_estimate(cfg: Scenario, workers: int) -> int:
    """Bytes for the server and `workers` local workers: each holds the runtime and all the data."""
    return (1 + workers) * (PROCESS_BYTES + data_bytes(cfg))


def available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_memory(cfg: Scenario, workers: int) -> None:
    need, have = memory_estimate(cfg, workers), available_memory()
    if need > have:
        gib = 2**30
        raise ResourceError(
            f"estimated memory {need / gib:.1f} GiB exceeds the {have / gib:.1f} GiB available: server + {workers} "
            f"workers x ({PROCESS_BYTES / gib:.2f} GiB runtime + {data_bytes(cfg) / gib:.2f} GiB data); "
            f"lower workers, clients.n or data.samples_per_client, or set data.max_train")

"""A training process keeps the memory it frees for its next step (glibc's malloc only).

By default glibc serves blocks over 128 KB (a threshold it raises up to 32 MB as such blocks are
freed) with fresh pages from the kernel and returns free memory above twice that threshold at the
heap's top at once, so every step of training faults its temporaries in again: page faults took
much of a DP-SGD step's time, and none with the thresholds below (python -m bench.dp_step).
PyTorch's CPU tuning guide gives the same cause for preferring jemalloc or tcmalloc; mallopt needs
neither.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
MMAP_THRESHOLD = 32 * 2**20  # the ceiling of glibc's own dynamic threshold: larger blocks still map
TRIM_THRESHOLD = 64 * 2**20  # free memory a process may keep at its heap's top


def keep_freed_memory() -> bool:
    """Set this process's malloc thresholds; False where the C library is not glibc."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)  # the C library this process already runs on
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

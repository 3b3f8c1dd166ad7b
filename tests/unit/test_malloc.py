"""A trainer's and the evaluator's processes keep the memory they free (nodes/training/malloc.py): a large
block is served from the heap, not mapped afresh, and stays there once freed, so the next step's
temporaries are not faulted in again. Read from glibc's own accounting (mallinfo2) in fresh
processes, as malloc's state is per process: what the thresholds decide, not how many page faults
a machine's kernel happens to take (that cost is `python -m bench.dp_step`'s)."""

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")

BLOCK = 8 * 2**20  # above glibc's default mmap threshold, below nodes.training.malloc's

# Builds what argv[1] names, then allocates, touches and frees one BLOCK: prints the bytes glibc mapped
# for it and the free bytes its heap holds afterwards.
SCRIPT = """
import ctypes, sys

if sys.argv[1] != "bare":
    import torch
    from emulator.config import load
    from nodes.data import load_federated
    from nodes.training.trainer import GlobalEvaluation
    from nodes.training.trainer import build_trainer

    cfg = load(None, ["clients.n=2"])
    data, device = load_federated(cfg.data, 2, cfg.seed), torch.device("cpu")
    if sys.argv[1] == "trainer":
        build_trainer(cfg, data, device)
    else:
        GlobalEvaluation(data, device, model=cfg.model, seed=cfg.seed, batch_eval=cfg.dp.batch_eval)


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
mapped = libc.mallinfo2().hblkhd
block = libc.malloc(BLOCK)
ctypes.memset(block, 1, BLOCK)
mapped = libc.mallinfo2().hblkhd - mapped
libc.free(block)
print(mapped, libc.mallinfo2().fordblks)
""".replace("BLOCK", str(BLOCK))


def mapped_and_kept(process: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, process], capture_output=True, text=True, check=True)
    mapped, kept = out.stdout.split()
    return int(mapped), int(kept)


def test_glibcs_defaults_map_a_large_block_and_give_it_back():
    """The case the setting changes: a fresh process maps the block and unmaps it when freed."""
    mapped, kept = mapped_and_kept("bare")
    assert mapped >= BLOCK and kept < BLOCK


@pytest.mark.parametrize("process", ["trainer", "evaluator"])
def test_a_trainer_and_the_evaluator_serve_large_blocks_from_the_heap_and_keep_them(process):
    mapped, kept = mapped_and_kept(process)
    assert mapped == 0 and kept >= BLOCK

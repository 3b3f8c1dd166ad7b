"""Runs on a CUDA GPU: they complete, name their GPU in run.json and the summary, and their tables do
not depend on how many workers share it. Skipped without a CUDA GPU (python -m bench.gpu_check runs them)."""

from __future__ import annotations

import json

import pytest

from emulator.output.summary import summarise_run
from tests.conftest import needs_gpu, rows

pytestmark = [pytest.mark.e2e, *needs_gpu()]


def test_a_run_on_cuda_names_its_gpu_and_its_tables_are_the_same_whatever_the_workers(emulate):
    import torch

    one = emulate("device=cuda", "workers=1", "model.name=mlp")
    three = emulate("device=cuda", "workers=3", "model.name=mlp")
    for name in ("rounds", "client_rounds", "events"):
        assert rows(one, name) == rows(three, name), name
    devices = json.loads((three / "run.json").read_text())["devices"]
    assert devices["workers"] == [f"cuda:{k % torch.cuda.device_count()}" for k in range(3)]
    assert devices["gpus"][0]["name"] == torch.cuda.get_device_name(0)
    assert f"GPU 0 ({devices['gpus'][0]['name']}): " in summarise_run(three)

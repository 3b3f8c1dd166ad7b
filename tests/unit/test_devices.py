"""Where local workers and the evaluator train (emulator.run.devices): placement on the GPUs torch sees, the
GPU memory check, and the query that asks a process of its own about the GPUs. The GPUs are mocked:
no test here needs one."""

from __future__ import annotations

import json

import pytest

from emulator.config import load
from emulator.run import devices
from emulator.run.devices import CUDA_CONTEXT_BYTES, Gpu, GpuQuery, GpuQueryError, gpu_slots, placement, query_gpus
from emulator.run.guards import GIB, ResourceError
from nodes.transport.evaluator import EvaluatorProcess
from nodes.transport.zygote import worker_env
from tests.conftest import bare_pool

H100 = "NVIDIA H100 80GB HBM3"


def gpus(count: int, free: float = 79 * GIB, name: str = H100) -> GpuQuery:
    return GpuQuery("2.11.0+cu130", count, [Gpu(i, name, int(free), 80 * GIB) for i in range(count)])


@pytest.fixture
def machine(monkeypatch):
    """machine(query) makes query_gpus answer `query` (None: fail the test if it is asked) and the NVIDIA
    driver present; the indices each query asked about are recorded in machine.asked."""

    class Machine:
        def __init__(self) -> None:
            self.asked: list[list[int] | None] = []

        def __call__(self, query: GpuQuery | None, driver: bool = True) -> None:
            def answer(indices, env):
                assert query is not None, "query_gpus asked where it must not be"
                self.asked.append(indices)
                found = [g for g in query.gpus if indices is None or g.index in indices]
                return GpuQuery(query.torch, query.count, found)

            monkeypatch.setattr(devices, "query_gpus", answer)
            monkeypatch.setattr(devices, "nvidia_driver", lambda: driver)

    return Machine()


def test_slot_k_goes_to_gpu_k_mod_n_of_the_devices():
    assert gpu_slots(5, [0, 1]) == [0, 1, 0, 1, 0]
    assert gpu_slots(3, [2, 5, 7]) == [2, 5, 7]
    assert gpu_slots(4, [3]) == [3, 3, 3, 3]


def test_cpu_asks_nothing_of_the_gpus(machine):
    machine(None)
    placed = placement(load(None, ["device=cpu", "workers=3"]))
    assert (placed.device, placed.workers, placed.evaluator, placed.local_workers) == ("cpu", ["cpu"] * 3, "cpu", 3)
    assert placed.record() == {"device": "cpu", "workers": ["cpu"] * 3, "evaluator": "cpu"}


def test_auto_without_an_nvidia_driver_is_the_cpu_without_asking(machine):
    machine(None, driver=False)
    assert placement(load(None, ["workers=2"])).workers == ["cpu", "cpu"]


def test_auto_is_the_cpu_where_torch_sees_no_gpu(machine):
    machine(gpus(0))
    assert placement(load(None, ["workers=2"])).device == "cpu"


def test_auto_takes_the_gpus_torch_sees(machine):
    machine(gpus(2))
    placed = placement(load(None, ["workers=3"]))
    assert (placed.workers, placed.evaluator) == (["cuda:0", "cuda:1", "cuda:0"], "cuda:1")


def test_cuda_without_a_gpu_is_refused_in_one_line_naming_torch(machine):
    machine(GpuQuery("2.13.0+cpu", 0, []))
    with pytest.raises(ResourceError) as e:
        placement(load(None, ["device=cuda"]))
    assert str(e.value) == (
        "device = 'cuda': torch 2.13.0+cpu sees no CUDA GPU on this machine; use device=auto or device=cpu"
    )


def test_workers_0_starts_workers_per_gpu_on_each_gpu_and_the_evaluator_on_the_last(machine):
    machine(gpus(2))
    placed = placement(load(None, ["device=cuda", "workers=0", "gpu.workers_per_gpu=3"]))
    assert placed.local_workers == 6
    assert placed.workers == ["cuda:0", "cuda:1"] * 3
    assert placed.evaluator == "cuda:1"
    assert [g.index for g in placed.gpus] == [0, 1]
    assert machine.asked == [None]  # every GPU, in one query


def test_gpu_devices_and_the_evaluators_gpu_are_the_only_ones_asked_about_and_used(machine):
    machine(gpus(4))
    placed = placement(load(None, ["device=cuda", "workers=3", "gpu.devices=[2,3]", "gpu.evaluator=0"]))
    assert (placed.workers, placed.evaluator) == (["cuda:2", "cuda:3", "cuda:2"], "cuda:0")
    assert machine.asked == [[0, 2, 3]]
    record = placed.record()
    assert [g["index"] for g in record["gpus"]] == [0, 2, 3]
    assert record["gpus"][0]["name"] == H100 and record["torch"] == "2.11.0+cu130"
    worker = devices.worker_gpu_bytes(load(None, ["device=cuda"]))
    assert record["gpu_estimate_bytes"]["2"] == 2 * worker and record["gpu_estimate_bytes"]["3"] == worker
    assert record["gpu_estimate_bytes"]["0"] > CUDA_CONTEXT_BYTES  # the evaluator alone


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["gpu.devices=[0,2]"], "gpu.devices = [0, 2]: torch sees 2 GPUs (0-1) on this machine"),
        (["gpu.evaluator=5"], "gpu.evaluator = 5: torch sees 2 GPUs (0-1) on this machine"),
    ],
)
def test_a_gpu_torch_does_not_see_is_refused_in_one_line(machine, overrides, error):
    machine(gpus(2))
    with pytest.raises(ResourceError) as e:
        placement(load(None, ["device=cuda", *overrides]))
    assert str(e.value) == error


def test_a_gpu_listed_twice_is_refused_with_the_scenario():
    from emulator.config import ConfigError

    with pytest.raises(ConfigError, match=r"gpu\.devices = \[0, 0\]: expected each GPU index once"):
        load(None, ["gpu.devices=[0,0]"])


def test_ray_places_its_own_workers_and_only_the_evaluator_is_checked(machine):
    machine(gpus(1))
    cfg = load(None, ["device=cuda", "workers=4"])
    cfg.transport.launcher = "ray"  # set after loading: the scenario's own checks want Ray installed
    placed = placement(cfg)
    assert (placed.workers, placed.evaluator, placed.local_workers) == ([], "cuda:0", 4)
    assert set(placed.gpu_bytes) == {0}


def test_gpus_of_two_models_are_marked_not_deterministic_in_run_json_and_the_summary(machine, caplog):
    from emulator.output.summary import _gpu_line

    a100 = "NVIDIA A100-SXM4-80GB"
    machine(GpuQuery("2.11.0+cu130", 2, [Gpu(0, H100, 79 * GIB, 80 * GIB), Gpu(1, a100, 79 * GIB, 80 * GIB)]))
    record = placement(load(None, ["device=cuda", "workers=3"])).record()
    why = f"GPUs of 2 models ({a100}, {H100}): a client's update depends on which trained it"
    assert record["not_deterministic"] == why
    assert _gpu_line(record) == (
        f"GPU 0 ({H100}): 2 workers; GPU 1 ({a100}): 1 worker and the evaluator (not deterministic: {why})"
    )
    assert why in caplog.text
    machine(gpus(2))
    record = placement(load(None, ["device=cuda", "workers=3"])).record()
    assert "not_deterministic" not in record and "not deterministic" not in _gpu_line(record)


# --- the memory check ------------------------------------------------------------------------------
BIG = ["model.name=cnn_fedavg", "data.dataset=fashion_mnist", "dp.q=0.2"]  # per-sample gradients of ~2,400 samples


def test_the_workers_on_one_gpu_are_summed_against_its_free_memory(machine):
    cfg = load(None, ["device=cuda", *BIG])
    worker = devices.worker_gpu_bytes(cfg)
    evaluator = devices.gpu_memory_needed(cfg, [], 0)[0]
    machine(gpus(1, free=3 * worker + evaluator))
    assert placement(load(None, ["device=cuda", "workers=3", *BIG])).local_workers == 3
    with pytest.raises(ResourceError) as e:
        placement(load(None, ["device=cuda", "workers=4", *BIG]))
    message = str(e.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"GPU 0 ({H100}): estimated ")
    assert " for 4 workers and the evaluator exceeds its " in message
    assert "582,026 parameters" in message and "lower gpu.workers_per_gpu or workers" in message


def test_each_gpu_is_checked_for_what_is_placed_on_it(machine):
    cfg = load(None, ["device=cuda", *BIG])
    worker, evaluator = devices.worker_gpu_bytes(cfg), devices.gpu_memory_needed(cfg, [], 0)[0]
    machine(gpus(2, free=2 * worker + evaluator - 1))  # two workers fit on a GPU, or one and the evaluator
    with pytest.raises(ResourceError, match=r"^GPU 1 .* for 2 workers and the evaluator exceeds"):
        placement(load(None, ["device=cuda", "workers=4", *BIG]))
    assert placement(load(None, ["device=cuda", "workers=3", *BIG])).workers == ["cuda:0", "cuda:1", "cuda:0"]


def test_a_worker_holds_its_context_its_cached_data_and_its_model_on_the_gpu():
    from emulator.run.guards import memory_estimate, worker_cache_bytes

    cfg = load(None, ["device=cuda", *BIG])
    model = memory_estimate(cfg, 1).worker_model
    assert devices.worker_gpu_bytes(cfg) == CUDA_CONTEXT_BYTES + worker_cache_bytes(cfg) + model
    assert model > 2400 * 582_026 * 4  # the per-sample gradients of the expected batch, at least once


# --- the query -------------------------------------------------------------------------------------


def test_the_query_asks_a_process_of_its_own_which_answers_for_this_torch():
    import torch

    found = query_gpus(None, worker_env())
    assert found.torch == torch.__version__
    if not torch.cuda.is_available():
        assert (found.count, found.gpus) == (0, [])


def test_a_failed_query_is_one_line_of_its_error(monkeypatch):
    monkeypatch.setattr(devices, "PROBE", "import sys; sys.exit('no driver loaded')")
    with pytest.raises(GpuQueryError) as e:
        query_gpus(None, worker_env())
    assert str(e.value) == "asking torch about the GPUs failed: no driver loaded"


def test_the_probe_reads_only_the_gpus_asked_about():
    """PROBE run here with a fake torch.cuda of 3 GPUs: it reads the memory of those asked about only."""
    import subprocess
    import sys

    fake = (
        "import sys, types, torch; cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 3,"
        " mem_get_info=lambda i: (i, 10 + i), get_device_name=lambda i: f'gpu{i}'); torch.cuda = cuda;"
    )
    out = subprocess.run(
        [sys.executable, "-c", fake + devices.PROBE, json.dumps([2, 7])], capture_output=True, text=True, check=True
    )
    answer = json.loads(out.stdout)
    assert answer["count"] == 3 and answer["gpus"] == [{"index": 2, "name": "gpu2", "free": 2, "total": 12}]


# --- telling each process its device ---------------------------------------------------------------


def test_each_local_slot_and_the_evaluator_are_told_their_device(tmp_path):
    pool = bare_pool(tmp_path)
    try:
        pool.supervisor.devices = ["cuda:0", "cuda:1"]
        args = pool.supervisor._worker_args(b"local-1.0", 1)
        assert args[args.index("--device") + 1] == "cuda:1"
    finally:
        pool.close()
    evaluator = EvaluatorProcess(f"ipc://{tmp_path}/e.sock", 2**20, device="cuda:3")
    try:
        assert evaluator.args()[-2:] == ["--device", "cuda:3"]
    finally:
        evaluator.close()
    plain = EvaluatorProcess(f"ipc://{tmp_path}/f.sock", 2**20)
    try:
        assert "--device" not in plain.args()
    finally:
        plain.close()

"""transport.launcher=ray: a run's workers as Ray actors give the tables of local workers (issue 14, item 2).

The Ray tests share one Ray cluster of this machine (a head node with 2 CPUs, in its own temporary
directory), which the emulator connects to through transport.ray.address as it would to a real
cluster: the job ships the nodes package, and each run connects and disconnects.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from emulator.aggregate.compression import task_frame
from emulator.config import ConfigError, load
from nodes.contracts.schema import to_dict
from nodes.contracts.tasks import ClientTask
from nodes.data import load_federated
from nodes.training.models import build_model
from nodes.training.trainer import state_to_numpy
from nodes.transport.pool import WorkerPool
from tests.conftest import FAST, rows
from tests.e2e.test_faults import running, wait_until
from tests.e2e.test_input_validation import refused
from tests.e2e.test_runtime import GE
from tests.e2e.test_security import free_address
from tests.e2e.test_signals import rounds_on_disk, start

NEEDS_RAY = "transport.launcher=ray needs Ray: pip install 'dpfl-emulator[ray]'"
# One local Ray instance at a time (make test: --dist loadgroup): the Ray sweep test starts its own.
pytestmark = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="module")
def ray_cluster():
    """The address of a Ray head node of this machine, shut down (processes and files) after the module."""
    pytest.importorskip("ray", reason=NEEDS_RAY)
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's unix sockets live below it
    Path("/tmp/ray").mkdir(exist_ok=True)  # whatever temp_dir, Cluster records its address in /tmp/ray
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False, "temp_dir": temp}
    )
    try:
        yield cluster.address
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def on_ray(cluster: str) -> list[str]:
    port = free_address().rsplit(":", 1)[1]
    return [
        "transport.launcher=ray",
        f"transport.ray.address={cluster}",
        f"transport.address=tcp://0.0.0.0:{port}",  # a wildcard: the workers are given this node's address
    ]


def free_cpus(cluster: str) -> float:
    import ray

    ray.init(address=cluster, logging_level="WARNING")
    try:
        return float(ray.available_resources().get("CPU", 0))
    finally:
        ray.shutdown()


def cpus_given_back(cluster: str) -> None:
    """Both CPUs free again. Ray frees a dead actor's resources a little after its process has
    exited (available_resources "can grow stale"; CI once read 1.0 there), so this waits, briefly."""
    wait_until(lambda: free_cpus(cluster) == 2, 20, "the Ray actors to give their CPUs back")


def test_workers_started_by_ray_give_the_tables_of_local_workers(emulate, ray_cluster):
    local = emulate(*GE)
    started = time.monotonic()
    remote = emulate(*GE, *on_ray(ray_cluster))
    print(f"run with Ray workers: {time.monotonic() - started:.1f} s")
    for name in ("rounds", "client_rounds", "events"):
        assert rows(remote, name) == rows(local, name), name
    m = json.loads((remote / "run.json").read_text())
    assert m["status"] == "complete" and m["workers"] == {}  # none started here
    placed = m["ray_workers"]
    assert sorted(placed) == ["ray-0.0", "ray-1.0"] and all(w["node"] and w["pid"] > 0 for w in placed.values())
    # shut down at the end: the workers are gone and the actors gave their CPUs back
    wait_until(lambda: not any(running(w["pid"]) for w in placed.values()), 10, "the Ray workers to exit")
    cpus_given_back(ray_cluster)


def test_a_dead_ray_actor_costs_its_task_and_its_slot_is_restarted(ray_cluster):
    import ray

    from nodes.transport.ray_workers import RayLauncher

    cfg = load(None, [*FAST, *on_ray(ray_cluster), "transport.worker_timeout_s=60"])
    data = load_federated(cfg.data, cfg.clients.n, cfg.seed)
    weights = state_to_numpy(build_model(cfg.model, data.input_shape, data.num_classes, cfg.seed))
    # client 0 goes to ray-0.0 (idle workers are offered tasks in name order) and would train for
    # minutes: its actor is killed under it; the other clients' tasks are short
    tasks = [(c, task_frame(0, ClientTask(c, 10**6 if c == 0 else 2, 0.1, 0.0, 0.0, 0.5), weights)) for c in range(6)]
    pool = WorkerPool(cfg.transport.address, cfg.transport)
    try:
        pool.launcher = RayLauncher(cfg.transport)
        pool.start(2)
        pool.set_up(to_dict(cfg))
        pool.wait_ready()
        victim = pool.workers[b"ray-0.0"].proc

        def kill_when_busy() -> None:
            wait_until(lambda: pool.workers[b"ray-0.0"].task is not None, 60, "ray-0.0 to take a task")
            ray.kill(victim.actor)  # type: ignore[union-attr]  # victim is a RayWorker

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        replies = pool.run_tasks(0, tasks)
        killer.join()
        # the restarted slot's actor is placed before the pool closes (close kills one not yet started)
        wait_until(lambda: "ray-0.1" in pool.launcher.placements(), 60, "ray-0.1 to start")  # type: ignore[union-attr]
    finally:
        pool.close()
    assert "worker ray-0.0 died" in replies[0].failure
    assert all(not replies[c].failure for c in range(1, 6))  # the others' tasks went to the live workers
    c = pool.counters
    assert c.worker_deaths == 1 and c.death_causes == {"died": 1} and c.restarts == 1
    placed = pool.launcher.placements()
    assert set(placed) == {"ray-0.0", "ray-1.0", "ray-0.1"}  # the slot restarted under a new name
    wait_until(lambda: not any(running(w["pid"]) for w in placed.values()), 10, "the Ray workers to exit")


def test_sigterm_stops_the_run_and_kills_the_ray_workers(ray_cluster, tmp_path):
    # to the server's process group, as a batch scheduler sends it; ray.init would make it a SystemExit
    proc = start(tmp_path, *on_ray(ray_cluster), "budget.rounds=10000")
    run = tmp_path / "run"
    try:
        wait_until(lambda: (run / "rounds").is_dir() and rounds_on_disk(run) >= 2, 240, "two completed rounds")
        placed = json.loads((run / "run.json").read_text())["ray_workers"]
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"
    wait_until(lambda: not any(running(w["pid"]) for w in placed.values()), 10, "the Ray workers to exit")
    cpus_given_back(ray_cluster)


def test_a_cluster_without_gpus_refuses_gpu_workers_in_one_line(ray_cluster, capsys, tmp_path):
    err = refused([*FAST, *on_ray(ray_cluster), "transport.ray.num_gpus_per_worker=0.5"], capsys, tmp_path / "o")
    assert err == "error: transport.ray.num_gpus_per_worker = 0.5: expected at most the 0 GPUs of the Ray cluster"


def test_an_unreachable_ray_address_is_refused_in_one_line(capsys, tmp_path):
    pytest.importorskip("ray", reason=NEEDS_RAY)
    nobody = free_address().removeprefix("tcp://")
    err = refused([*FAST, *on_ray(nobody)], capsys, tmp_path / "o")
    assert err.startswith(f"error: transport.ray.address = {nobody!r}: nothing answers at {nobody} ("), err


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["transport.launcher=slurm"],
            "transport.launcher = 'slurm': expected local | ray",
        ),
        (
            ["transport.launcher=ray", "transport.ray.address=http://head:6379"],
            "transport.ray.address = 'http://head:6379': expected '' (a Ray instance on this machine) | auto | "
            "HOST:PORT | ray://HOST:PORT, PORT in 1..65535",
        ),
        (
            ["transport.launcher=ray", "transport.ray.address=head:70000"],
            "transport.ray.address = 'head:70000': expected",
        ),
        (
            ["transport.launcher=ray"],  # the default address: an ipc socket
            "transport.address = '': expected tcp://HOST:PORT with transport.launcher = ray",
        ),
        (
            ["transport.launcher=ray", "transport.address=ipc:///tmp/dpfl.sock"],
            "transport.address = 'ipc:///tmp/dpfl.sock': expected tcp://HOST:PORT with transport.launcher = ray",
        ),
    ],
)
def test_a_bad_launcher_setting_is_one_line_naming_the_key(overrides, message, capsys, tmp_path):
    if "transport.ray.address=" in " ".join(overrides):  # an address is checked only with transport.address tcp
        overrides = [*overrides, "transport.address=tcp://127.0.0.1:5555"]
    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    assert str(e.value).startswith(message), e.value
    assert refused([*FAST, *overrides], capsys, tmp_path / "o") == f"error: {e.value}"


def test_with_ray_a_wildcard_address_needs_no_keys_dir_the_run_hands_out_its_own():
    # without Ray the same address is refused: a worker started by hand would need keygen's keys
    with pytest.raises(ConfigError, match="needs CURVE keys"):
        load(None, ["transport.address=tcp://0.0.0.0:5555"])
    if not _has_ray():
        pytest.skip(NEEDS_RAY)
    assert load(None, ["transport.launcher=ray", "transport.address=tcp://0.0.0.0:5555"]).transport.launcher == "ray"


def _has_ray() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def test_without_ray_installed_the_ray_launcher_is_one_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # what find_spec reports for a package that is not there
    with pytest.raises(ConfigError) as e:
        load(None, ["transport.launcher=ray", "transport.address=tcp://127.0.0.1:5555"])
    assert str(e.value) == "transport.launcher = 'ray': expected Ray installed (pip install 'dpfl-emulator[ray]')"

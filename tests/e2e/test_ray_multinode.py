"""transport.launcher=ray across nodes (issue 52, item 4): a Ray cluster of two raylets on this machine, each with
resources of its own (ray.cluster_utils.Cluster, as Ray's own tests build one). The run's workers are spread over
both (Ray's state API says where), talk to the server over tcp with CURVE keys from `python -m emulator keygen`, and
give the tables of local workers; a node lost mid-run costs the tasks its worker held, and the slot restarts on the
node that is left.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodes.contracts.keys import keygen
from tests.conftest import rows
from tests.e2e.test_faults import running, wait_until
from tests.e2e.test_ray_launcher import NEEDS_RAY, on_ray
from tests.e2e.test_runtime import GE
from tests.e2e.test_security import free_address
from tests.e2e.test_signals import rounds_on_disk, start

pytestmark = pytest.mark.xdist_group("ray")  # one local Ray instance at a time (make test: --dist loadgroup)


@pytest.fixture
def two_nodes() -> Iterator[tuple[Any, Any]]:
    """(the cluster, its second node): a head raylet with 3 CPUs, where Ray's default scheduling would pack both of
    a run's workers, and a second raylet with 1."""
    pytest.importorskip("ray", reason=NEEDS_RAY)
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's unix sockets live below it
    Path("/tmp/ray").mkdir(exist_ok=True)
    dashboard = int(free_address().rsplit(":", 1)[1])  # Ray's state API answers through its dashboard
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 3, "include_dashboard": True, "dashboard_port": dashboard, "temp_dir": temp},
    )
    try:
        second = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster, second
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def curve_keys(tmp_path: Path) -> str:
    keys = tmp_path / "keys"
    keygen(keys)
    return f"transport.keys_dir={keys}"


def worker_actors(cluster: Any, count: int) -> list[str]:
    """Ray's own record of the worker actors, ended ones included: the node each ran on, once it lists `count` of
    them (the state API answers from the dashboard, which may not have them all yet: CI once read none). Asked of
    this cluster's dashboard by its URL: an address left to Ray follows RAY_ADDRESS or the last cluster started on
    this machine (CI once read another cluster's actors)."""
    from ray.util.state import list_actors

    dashboard = f"http://{cluster.head_node.address_info['webui_url']}"
    listed: list[str] = []

    def listed_all() -> bool:
        hosts = [("class_name", "=", "WorkerHost")]
        found = list_actors(address=dashboard, filters=hosts, detail=True, raise_on_missing_output=False)
        listed[:] = [a.node_id for a in found]
        return len(listed) >= count

    wait_until(listed_all, 60, f"Ray's state API to list {count} worker actors")
    return listed


def test_workers_spread_over_two_nodes_give_the_tables_of_local_workers(emulate, two_nodes, tmp_path, monkeypatch):
    cluster, second = two_nodes
    for variable in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):  # they would override the dashboard's URL
        monkeypatch.delenv(variable, raising=False)
    local = emulate(*GE)
    remote = emulate(*GE, *on_ray(cluster.address), curve_keys(tmp_path))
    for name in ("rounds", "client_rounds", "events"):
        assert rows(remote, name) == rows(local, name), name
    m = json.loads((remote / "run.json").read_text())
    assert m["status"] == "complete"
    placed = m["ray_workers"]
    assert sorted(placed) == ["ray-0.0", "ray-1.0"]
    nodes = {w["node_id"] for w in placed.values()}
    assert nodes == {cluster.head_node.node_id, second.node_id}, placed  # one worker on each raylet
    # where Ray's state API, asked apart from the run, says the run's actors were (this cluster's only ones)
    assert sorted(worker_actors(cluster, len(placed))) == sorted(w["node_id"] for w in placed.values())
    wait_until(lambda: not any(running(w["pid"]) for w in placed.values()), 10, "the Ray workers to exit")


def test_a_node_lost_mid_run_restarts_its_worker_on_the_node_left(two_nodes, tmp_path):
    cluster, second = two_nodes
    proc = start(tmp_path, *on_ray(cluster.address), curve_keys(tmp_path), "budget.rounds=30", "dp.tau=20")
    run = tmp_path / "run"
    try:
        wait_until(lambda: (run / "rounds").is_dir() and rounds_on_disk(run) >= 2, 240, "two completed rounds")
        cluster.remove_node(second)  # its raylet and every process of it killed, as a machine lost
        assert proc.wait(timeout=240) == 0, (tmp_path / "console.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    m = json.loads((run / "run.json").read_text())
    assert m["status"] == "complete" and rounds_on_disk(run) == 30
    placed = m["ray_workers"]
    lost = [name for name, w in placed.items() if w["node_id"] == second.node_id]
    assert len(lost) == 1, placed  # the one worker the second node ran
    head = cluster.head_node.node_id
    restarted = sorted(set(placed) - {"ray-0.0", "ray-1.0"})
    assert restarted == [f"{lost[0].rsplit('.', 1)[0]}.1"] and placed[restarted[0]]["node_id"] == head, placed
    counters = m["transport"]
    assert counters["worker_deaths"] == 1 and counters["restarts"] == 1, counters
    wait_until(lambda: not any(running(w["pid"]) for w in placed.values()), 10, "the Ray workers to exit")

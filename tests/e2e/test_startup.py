"""Start-up: the workers are started before the server loads its data, the server never imports
Opacus or torch (its evaluator process does, nodes/transport/evaluator.py) and never builds a client's samples,
and a run that cannot start still reaps its workers and its evaluator."""

import json
import os
import sys

import pytest

from emulator.config import load
from emulator.run.lifecycle import run
from nodes.data.locate import DatasetNotFound
from tests.conftest import FAST, privacy_ledgers, python_stdout, rows

# A whole run in a process of its own, with the server forbidden to build any client's samples:
# what it imported and what it recorded come back as JSON on stdout.
SERVER_RUN = """
import json, sys
from nodes.data.synthetic import SyntheticData
def refuse(self, k):
    raise AssertionError(f"the server built client {k}'s samples")
SyntheticData._build = refuse
from emulator.config import load
from emulator.run.lifecycle import run
run_dir = run(load(None, sys.argv[1:]))
manifest = json.loads((run_dir / "run.json").read_text())
print(json.dumps({"opacus": sorted(m for m in sys.modules if m.split(".")[0] == "opacus"),
                  "torch": "torch" in sys.modules,
                  "status": manifest["status"], "privacy": manifest["privacy"], "run": run_dir.name}))
"""


def test_the_server_imports_no_opacus_no_torch_and_builds_no_client(tmp_path):
    """While workers train with DP-SGD and the run evaluates the global model every round: the
    evaluator process imports torch (~1.5 s of CPU the server's cores keep for the workers)."""
    out = python_stdout(SERVER_RUN, *FAST, "workers=1", "budget.rounds=1", f"output.dir={tmp_path}")
    report = json.loads(out.splitlines()[-1])
    assert report["opacus"] == []
    assert report["torch"] is False
    assert report["status"] == "complete"
    # the server's accounting ran: each client's ledger holds its round of DP-SGD steps (dp.tau = 2)
    assert report["privacy"]["clients_charged"] == 6
    one_round = {"entries": [{"q": 0.05, "sigma": 1.0, "steps": 2}]}
    assert privacy_ledgers(tmp_path / report["run"]) == dict.fromkeys(range(6), one_round)


def test_the_workers_are_started_before_the_server_loads_its_data(tmp_path, monkeypatch):
    from emulator.run import lifecycle as run_module
    from nodes.transport.pool import WorkerPool

    pools: list[WorkerPool] = []
    seen: list[list[bool]] = []

    class Recorded(WorkerPool):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            pools.append(self)

    def loading(*args):
        seen.append([w.proc is not None and w.proc.poll() is None for w in pools[0].workers.values()])
        return load_server_data(*args)

    load_server_data = run_module.load_server_data
    monkeypatch.setattr(run_module, "WorkerPool", Recorded)
    monkeypatch.setattr(run_module, "load_server_data", loading)
    run(load(None, [*FAST, f"output.dir={tmp_path}"]))
    assert seen == [[True, True]]  # both local workers were running as the server began its data


def test_a_missing_dataset_found_after_the_workers_started_reaps_them_and_leaves_no_run(tmp_path, monkeypatch):
    from emulator.run import lifecycle as run_module
    from nodes.transport.pool import WorkerPool

    pools: list[WorkerPool] = []

    class Recorded(WorkerPool):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            pools.append(self)

    monkeypatch.setattr(run_module, "WorkerPool", Recorded)
    cfg = load(
        None,
        [
            *FAST,
            "data.dataset=mnist",
            "model.name=cnn_fmnist",
            f"data.root={tmp_path / 'nowhere'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "data.download=false",
            f"output.dir={tmp_path / 'runs'}",
        ],
    )
    with pytest.raises(DatasetNotFound):
        run(cfg)
    assert not (tmp_path / "runs").exists()
    pool = pools[0]
    assert pool.zygote is not None  # the workers were forked from it: it may have ended before it forked them
    processes = [pool.zygote.proc.pid, *pool.zygote.pids]  # the workers and the evaluator
    for pid in processes:
        with pytest.raises(ProcessLookupError):  # reaped: not even a zombie is left
            os.kill(pid, 0)


# Workers that keep no built client: every task builds its client's data afresh.
NO_CACHE_WORKER = (
    sys.executable,
    "-c",
    "import nodes.training.trainer; nodes.training.trainer.CACHE_BYTES = 1; from nodes import worker; worker.cli()",
)


def test_results_do_not_depend_on_which_built_clients_the_workers_keep(emulate, monkeypatch):
    """Every task rebuilding its client's data, label noise included, gives the same tables as
    keeping them all: a client is built the same whenever and in whichever worker it is built."""
    noisy = "data.quality=[{clients: [1, 2], from_round: 1, label_noise: 0.3}]"
    kept = emulate("workers=1", noisy)
    monkeypatch.setattr("nodes.transport.supervisor.WORKER_COMMAND", NO_CACHE_WORKER)
    rebuilt = emulate("workers=2", noisy)
    for name in ("rounds", "client_rounds", "events"):
        assert rows(kept, name) == rows(rebuilt, name), name


# A worker's setup and its first tasks, plain and DP-SGD, in a process of its own: whether they
# imported torch's compiler, and the determinism settings they left.
WORKER_TASKS = """
import json, sys, torch
from emulator.config import load
from nodes import worker
from nodes.contracts.schema import to_dict
from nodes.contracts.tasks import ClientTask
from nodes.training.trainer import state_to_numpy
trainer, _ = worker._setup(to_dict(load(None, ["clients.n=2"])))
weights = state_to_numpy(trainer.model)
for sigma, clip in ((0.0, 0.0), (1.0, 1.0)):
    trainer.train(0, ClientTask(client=0, steps=2, lr=0.1, sigma=sigma, clip=clip, q=0.2), weights)
print(json.dumps([m for m in sys.modules if m.startswith(("torch._dynamo", "torch._inductor"))][:3]),
      torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
"""


def test_a_worker_sets_up_and_trains_deterministically_without_importing_torchs_compiler():
    """torch.use_deterministic_algorithms and torch.optim's first use each import torch._dynamo
    (torch 2.13: ~2 s of CPU per worker, for a compiler no worker runs)."""
    assert python_stdout(WORKER_TASKS).split() == ["[]", "True", "True"]


def test_round_0_starts_from_a_local_workers_build_of_the_initial_model_which_is_the_servers(tmp_path):
    """The local workers' initial model, adopted so that round 0 need not wait for the server's torch
    import, is the one the server builds from the seed, bit for bit."""
    from nodes.contracts.schema import to_dict
    from nodes.data import dataset_spec
    from nodes.training.models import build_model
    from nodes.training.trainer import state_to_numpy
    from nodes.transport.pool import WorkerPool

    cfg = load(None, [*FAST, "clients.n=4"])
    pool = WorkerPool(f"ipc://{tmp_path}/s.sock", cfg.transport)
    try:
        pool.set_up(to_dict(cfg))
        pool.start(2)
        pool.wait_ready()
        data = dataset_spec(cfg.data)
        built = state_to_numpy(build_model(cfg.model, data.sample_shape, data.classes, cfg.seed))
        assert pool.initial_model is not None and pool.initial_model.keys() == built.keys()
        assert all(pool.initial_model[k].tobytes() == built[k].tobytes() for k in built)
    finally:
        pool.close()


def _worker_whose_initial_model(change: str) -> tuple[str, ...]:
    """A worker whose ready carries its initial model changed by `change` (a statement on `w`)."""
    code = (
        "import numpy as np, nodes.training.trainer as t\n"
        "weights = t.Trainer.weights\n"
        "def first(self):\n"
        "    w = weights(self)\n"
        "    if not getattr(self, 'sent', False):\n"
        f"        self.sent = True\n        {change}\n"
        "    return w\n"
        "t.Trainer.weights = first\n"
        "from nodes import worker\nworker.cli()"
    )
    return (sys.executable, "-c", code)


@pytest.mark.parametrize(
    "change, found",
    [
        ("w['fc.bias'][0] += 1e-6", "differs from the local workers' in fc.bias"),  # found before round 0's rows
        ("w['fc.bias'] = np.zeros(3, np.float32)", "has tensors"),  # found before round 0
    ],
)
def test_a_local_workers_initial_model_unlike_the_servers_fails_the_run_before_any_row(
    emulate, monkeypatch, tmp_path, change, found
):
    from emulator.run.lifecycle import InitialModelMismatch

    monkeypatch.setattr("nodes.transport.supervisor.WORKER_COMMAND", _worker_whose_initial_model(change))
    with pytest.raises(InitialModelMismatch, match=found):
        emulate("workers=1")
    run_dir = tmp_path / "run0"
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "failed" and found in manifest["error"]
    assert rows(run_dir, "rounds") == []


def test_a_worker_imports_torch_without_collecting_and_then_runs_with_the_collector_on():
    """Collections during torch's import, of objects that all live on, took 0.2-0.25 s of a worker's
    1.45 s of imports (nodes.worker.import_training; the zygote imports the same way)."""
    code = (
        "import gc, sys\n"
        "from nodes import worker\n"
        "collections = []\n"
        "gc.callbacks.append(lambda phase, info: collections.append(phase))\n"
        "worker.import_training()\n"
        "print(len(collections), gc.isenabled(), 'torch' in sys.modules)\n"
    )
    assert python_stdout(code).split() == ["0", "True", "True"]


def test_a_worker_imports_and_sets_up_without_omegaconf():
    """The zygote's imports are every local worker's critical path to its first task: the server sends its
    workers plain data they rebuild without OmegaConf (nodes.contracts.schema.from_dict), whose import the server's
    configuration needs, not theirs."""
    from nodes.contracts.schema import to_dict

    code = (
        "import json, sys\n"
        "from nodes import worker\nfrom nodes.training import dp_step, trainer\n"
        "trainer, _ = worker._setup(json.loads(sys.argv[1]))\n"
        "print(trainer.data.n_clients, 'omegaconf' in sys.modules)\n"
    )
    scenario = json.dumps(to_dict(load(None, FAST)))
    assert python_stdout(code, scenario).split() == ["6", "False"]

"""A user's codec without forking: compression.kind=package.module:ClassName, imported by the server and
its worker, end to end from the command line (the plug-in: tests/plugins/codec.py)."""

import json

import numpy as np

from emulator.output.results import read_table
from nodes.contracts import protocol
from tests.cli import emulator

FLOAT16 = "tests.plugins.codec:Float16"


def float16_update_bytes(shapes: dict[str, tuple[int, ...]], metrics: dict[str, float]) -> int:
    """The size of a compressed update whose parts are float16 copies of its tensors, built here without
    the plug-in: what only that codec puts on the wire."""
    message = protocol.encode(
        "compressed",
        round=0,
        client=0,
        codec={"kind": FLOAT16, "bits": 8, "fraction": 0.01},
        shapes=[[k, list(s)] for k, s in shapes.items()],
        parts={f"{k}:half": np.zeros(int(np.prod(s)), np.float16) for k, s in shapes.items()},
        residual={},
        metrics=metrics,
    )
    return len(message)


def test_a_user_codec_encodes_every_upload_end_to_end(tmp_path):
    r = emulator(
        tmp_path,
        f"compression.kind={FLOAT16}",
        "workers=1",
        "clients.n=3",
        "budget.rounds=2",
        "dp.tau=2",
        "data.samples_per_client=60",
        "output.dir=runs",
        "output.name=f16",
        "output.progress=false",
    )
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "runs" / "f16"
    with np.load(run_dir / "checkpoint.npz") as z:
        shapes = {k: z[k].shape for k in z.files if k != "__state__"}
    # the server's estimate is the float16 message without metrics; each upload is it with the worker's
    # metrics (steps, train_loss, update_norm: their encoded sizes do not depend on their values)
    estimate = json.loads((run_dir / "run.json").read_text())["derived_budgets"]["update_bytes"]
    assert estimate == float16_update_bytes(shapes, {})
    metrics = {"steps": 2, "train_loss": 0.0, "update_norm": 0.0}
    clients = read_table(run_dir, "client_rounds").to_pylist()
    assert len(clients) == 6
    # arrived: the server decoded each against the plug-in's parts, strictly, and aggregated it
    assert {(c["outcome"], c["bytes_up"]) for c in clients} == {("arrived", float16_update_bytes(shapes, metrics))}
    assert float16_update_bytes(shapes, metrics) < sum(4 * int(np.prod(s)) for s in shapes.values())


def test_a_codec_that_cannot_be_loaded_is_one_line_exit_2(tmp_path):
    r = emulator(tmp_path, "compression.kind=no_such_module:Codec")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "compression.kind = 'no_such_module:Codec': cannot import no_such_module" in r.stderr
    assert not (tmp_path / "runs").exists()

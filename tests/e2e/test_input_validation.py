"""Bad input stops before anything starts: one line naming the key, exit status 2, nothing written.

Issue 10 (input validation): every class of bad input an adversarial pass found, each
reproducing its failure (a traceback, a hang, a run that "completed" or wrote outside
output.dir), plus a generated test of NaN, +-inf, -1 and 1e308 on every numeric key.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import get_origin, get_type_hints

import pytest

from emulator.__main__ import main
from emulator.config import (
    ConfigError,
    ServerScenario,
    clip,
    help_text,
    load,
)
from emulator.policies import POLICIES
from nodes.contracts import schema
from nodes.contracts.schema import list_entry_type, numeric_type

ROOT = Path(__file__).resolve().parents[2]


def refused(argv: list[str], capsys, out_dir: Path) -> str:
    """The one error line of `python -m emulator argv` run in-process; asserts exit 2 and no output."""
    code = main([*argv, f"output.dir={out_dir}", "output.progress=false"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert not out_dir.exists() or not any(out_dir.iterdir()), "a refused run must write nothing"
    return err


def cli(*argv: str, timeout: float = 120, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "emulator", *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


# --- numbers that crashed, hung or "completed" --------------------------------------------

NUMBERS = [  # (overrides, the key the error must name)
    (["seed=-1"], "seed"),  # numpy traceback
    ([f"seed={2**64}"], "seed"),  # msgpack OverflowError
    (["dp.batch_eval=-1"], "dp.batch_eval"),  # range(0, n, -1) is empty: an evaluation of nothing
    (["dp.lr=inf"], "dp.lr"),  # hung
    (["dp.clip=inf"], "dp.clip"),
    (["dp.sigma=inf"], "dp.sigma"),
    (["dp.tau=10000000000"], "dp.tau"),
    (["links.latency_s.kind=list", "links.latency_s.values=[0.1,inf]"], "links.latency_s.values[1]"),
    (["compute.step_s.kind=constant", "compute.step_s.value=inf"], "compute.step_s.value"),
    (["links.down_bps.kind=uniform", "links.down_bps.low=1e6", "links.down_bps.high=inf"], "links.down_bps.high"),
    (["links.up_bps.kind=lognormal", "links.up_bps.median=1e6", "links.up_bps.sigma=1e308"], "links.up_bps.sigma"),
    (["model.hidden=-5"], "model.hidden"),
    (["data.classes=2000000000"], "data.classes"),  # tried to allocate 894 GiB
    (["transport.heartbeat_s=1e-300"], "transport.heartbeat_s"),
]


@pytest.mark.parametrize("argv, key", NUMBERS, ids=[" ".join(a)[:60] for a, _ in NUMBERS])
def test_a_number_out_of_its_range_is_one_line_naming_the_key(argv, key, capsys, tmp_path):
    err = refused(argv, capsys, tmp_path / "runs")
    assert err.startswith(f"error: {key} = "), err


def test_a_seed_of_minus_one_from_the_real_command_line(tmp_path):
    r = cli("seed=-1", f"output.dir={tmp_path}")
    assert r.returncode == 2 and r.stderr == "error: seed = -1: expected an integer in [0, 18446744073709551615]\n"


def test_an_infinite_noise_multiplier_is_refused_instead_of_hanging(tmp_path):
    r = cli("dp.sigma=inf", f"output.dir={tmp_path}", timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: dp.sigma = inf: expected a number in [0, 1e+06]")
    assert not any(tmp_path.iterdir())


# --- schedules ----------------------------------------------------------------------------

SCHEDULES = [
    (["links.schedule=[{t: 10, factor: 0.5}, {t: 5, factor: 2}]"], "links.schedule[1].t"),
    (["links.schedule=[{t: -1, factor: 0.5}]"], "links.schedule[0].t"),
    (["impact.kind=schedule", "impact.schedule=[{from_round: 5}, {from_round: 2}]"], "impact.schedule[1].from_round"),
    (["impact.kind=schedule", "impact.schedule=[{from_round: -3}]"], "impact.schedule[0].from_round"),
    (
        ["data.quality=[{clients: [0, 1], from_round: 5}, {client_range: [1, 3], from_round: 2}]"],
        "data.quality[1].from_round",
    ),
    (["data.quality=[{clients: [0], from_round: -1}]"], "data.quality[0].from_round"),
    (["links.dropout.outages=[{start: 50, end: 60}, {start: 10, end: 20}]"], "links.dropout.outages[1].start"),
    (["links.dropout.outages=[{start: -5, end: 3}]"], "links.dropout.outages[0].start"),
]


@pytest.mark.parametrize("overrides, key", SCHEDULES, ids=[k for _, k in SCHEDULES])
def test_a_schedule_out_of_order_or_before_zero_is_refused(overrides, key):
    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    assert str(e.value).startswith(f"{key} = "), e.value


def test_schedules_in_order_and_rules_for_other_clients_in_any_order_are_accepted():
    load(
        None,
        [
            "links.schedule=[{t: 5, factor: 0.5}, {t: 5, factor: 2}, {t: 9, factor: 1}]",
            "links.dropout.outages=[{start: 1, end: 2}, {start: 1, end: 5}]",
            "data.quality=[{clients: [0], from_round: 5}, {clients: [1], from_round: 2}]",
        ],
    )


# --- the scenario file ------------------------------------------------------------------------


@pytest.fixture
def scenario_file(tmp_path):
    def write(content: str | bytes, name: str = "s.yaml") -> str:
        p = tmp_path / name
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(p)

    return write


def billion_laughs() -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\n"


FILES = [  # (content, what the one line must say)
    ("", "the file is empty"),
    ("# only a comment\n", "the file is empty"),
    ("seed: 1\nclients: {n: 3}\nseed: 2\n", "line 3: duplicate key 'seed' (first at line 1)"),
    ("dp:\n  q: 0.1\n  sigma: 1\n  q: 0.2\n", "line 4: duplicate key 'q' (first at line 2)"),
    ("seed: 2024-01-01\n", "seed = '2024-01-01': expected integer"),
    (b"name: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 9)"),
    (billion_laughs(), "expands to more than 20000 values through aliases"),
    ("a: &a [*a]\n", "recursive alias"),
    ("a: " + "[" * 100_000 + "]" * 100_000 + "\n", "nests deeper than 32 levels"),
    ("name: " + "x" * (2**20) + "\n", "larger than 1024 KiB"),
    ("1: 2\n", "key 1 is not a name"),
    ("name: !!binary aGVsbG8=\n", "name: a YAML bytes is not a scenario value"),
    ("- 1\n- 2\n", "expected a mapping of keys at top level"),
]


@pytest.mark.parametrize("content, expected", FILES, ids=[e for _, e in FILES])
def test_a_bad_scenario_file_is_one_line(content, expected, scenario_file, capsys, tmp_path):
    start = time.monotonic()
    err = refused([f"scenario={scenario_file(content)}"], capsys, tmp_path / "runs")
    assert expected in err, err
    assert time.monotonic() - start < 10, "refused up front, not after expanding or parsing it all"


def test_scenario_with_no_value_is_refused_not_the_defaults(capsys, tmp_path):
    assert "scenario= has no value" in refused(["scenario="], capsys, tmp_path / "runs")


def test_an_unreadable_scenario_file_is_one_line(scenario_file, capsys, tmp_path, monkeypatch):
    path = scenario_file("seed: 1\n")
    real_open = open

    def no_permission(file, *args, **kw):  # chmod 000 does not stop root, so refuse the read itself
        if str(file) == path:
            raise PermissionError(13, "Permission denied", path)
        return real_open(file, *args, **kw)

    monkeypatch.setattr("builtins.open", no_permission)
    assert "cannot read the file: Permission denied" in refused([f"scenario={path}"], capsys, tmp_path / "runs")


def test_a_yaml_bomb_and_deep_nesting_from_the_real_command_line(scenario_file):
    bomb = cli(f"scenario={scenario_file(billion_laughs(), 'bomb.yaml')}", timeout=60)
    assert bomb.returncode == 2 and "through aliases" in bomb.stderr
    deep = cli(f"scenario={scenario_file('a: ' + '[' * 100_000, 'deep.yaml')}", timeout=60)  # segfaulted libyaml
    assert deep.returncode == 2 and "nests deeper than 32 levels" in deep.stderr


def test_a_yaml_bomb_in_an_override_is_refused():
    levels = ["&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
        f"&{n} [{', '.join([f'*{p}'] * 10)}]" for p, n in zip("abcd", "bcde")
    ]
    with pytest.raises(ConfigError, match="seed: the YAML value expands to more than 20000 values"):
        load(None, [f"seed=[{', '.join(levels)}]"])


def test_a_huge_key_or_value_is_echoed_cut_short(capsys, tmp_path):
    key = "k" * 100_000
    err = refused([f"{key}=1"], capsys, tmp_path / "runs")
    assert len(err) < 200 and "unknown key" in err and "…" in err
    err = refused([f"policy={'p' * 100_000}"], capsys, tmp_path / "runs")
    assert len(err) < 300 and err.startswith("error: policy = 'ppp") and "…" in err


def test_a_bad_entry_of_a_list_of_sections_is_named_in_full():
    with pytest.raises(ConfigError, match=r"^data\.groups\[1\]\.clients = nan: expected integer"):  # a float: Hydra's
        load(None, ["data.groups=[{clients: 1}, {clients: nan}]"])
    with pytest.raises(ConfigError, match=r"^links\.dropout\.outages\[0\]\.when: unknown key"):
        load(None, ["links.dropout.outages=[{when: 1}]"])


# --- output, transport, device ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "/abs", "a\\b"])
def test_a_run_name_that_leaves_output_dir_is_refused(name, capsys, tmp_path):
    err = refused([f"output.name={name}"], capsys, tmp_path / "runs")
    assert err.startswith(f"error: output.name = {name!r}: expected a directory name"), err
    assert list(tmp_path.iterdir()) == [] or not (tmp_path / "x").exists()


@pytest.mark.parametrize("key", ["data.root", "data.cache_dir", "transport.keys_dir", "output.dir"])
def test_a_path_the_file_system_cannot_take_is_refused_naming_the_key(key):
    for path in ("d" * 300, "d/" * 2000):  # a name over 255 bytes; a path over 3500
        with pytest.raises(ConfigError, match=rf"^{key} = 'd.*: expected a path of at most 3500 bytes"):
            load(None, [f"{key}={path}"])


def test_output_dir_that_is_a_file_is_one_line(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("not a directory")
    for out in (f, f / "below"):
        code = main([f"output.dir={out}"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and f"{f} is not a directory" in err, err


def in_small_tmpfs(mount_options: str, target: Path) -> subprocess.CompletedProcess:
    """python -m emulator with output.dir on a fresh tmpfs mounted at `target` with `mount_options`,
    in a user and mount namespace of its own (no root needed, nothing mounted outside it)."""
    if not shutil.which("unshare"):
        pytest.skip("needs unshare(1)")
    target.mkdir()
    script = (
        f"mount -t tmpfs -o {mount_options} tmpfs {target} && cd {ROOT} && "
        f"exec {sys.executable} -m emulator output.dir={target}/runs"
    )
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if "mount" in r.stderr and r.returncode != 2:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    return r


def test_read_only_output_is_one_line_exit_2(tmp_path):
    r = in_small_tmpfs("ro", tmp_path / "ro")
    assert r.returncode == 2, r.stderr
    shown = clip(repr(f"{tmp_path}/ro/runs"))
    assert r.stderr == f"error: output.dir = {shown}: cannot write there: Read-only file system\n"


def test_a_full_disk_at_start_is_one_line_exit_2(tmp_path):
    r = in_small_tmpfs("size=256k", tmp_path / "small")
    assert r.returncode == 2, r.stderr
    shown = clip(repr(f"{tmp_path}/small/runs"))
    assert r.stderr.startswith(f"error: output.dir = {shown}: ") and len(r.stderr.splitlines()) == 1
    assert "No space left on device" in r.stderr or "MiB free" in r.stderr


@pytest.mark.parametrize(
    "address",
    ["tcp://127.0.0.1:99999", "tcp://127.0.0.1:0", "tcp://127.0.0.1", "tcp://:5555", "tcp://127.0.0.1:http", "ipc://"],
)
def test_a_malformed_address_or_port_is_refused_by_the_schema(address):
    with pytest.raises(ConfigError, match=r"^transport\.address = .*PORT in 1\.\.65535"):
        load(None, [f"transport.address={address}"])


def test_a_port_in_use_is_one_line_exit_2(capsys, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        err = refused([f"transport.address={address}"], capsys, tmp_path / "runs")
    assert err == f"error: transport.address = '{address}': cannot listen there: Address already in use"


def run_limited(soft: int, hard: int, out: Path) -> subprocess.CompletedProcess:
    """A small run of `python -m emulator` under ulimit -n: `soft`, `hard` (lowering needs no privilege)."""
    return subprocess.run(
        [sys.executable, "-m", "emulator", "workers=2", "clients.n=6", "budget.rounds=2", f"output.dir={out}"],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_open_files_limit_too_low_for_the_run_is_one_line_exit_2(tmp_path):
    r = run_limited(20, 20, tmp_path / "runs")  # ulimit -n 20: ZeroMQ aborted (SIGABRT), run.json left `starting`
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.startswith("error: open files limit (ulimit -n) is 20: this run needs at least ")
    assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_a_soft_open_files_limit_too_low_is_raised_for_the_server_and_its_workers(tmp_path):
    from emulator.run.guards import open_files_needed

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < open_files_needed(2):
        pytest.skip(f"this machine's hard open files limit ({hard}) is below what the run needs")
    # 12: enough to start Python and read the scenario, too few for the server, and for a worker forked
    # from the zygote started before the server raised its own limit
    r = run_limited(12, hard, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    (run,) = [p.parent for p in tmp_path.glob("*/run.json")]
    assert json.loads((run / "run.json").read_text())["status"] == "complete"


def test_an_ipc_socket_in_a_missing_directory_is_one_line_exit_2(capsys, tmp_path):
    err = refused(["transport.address=ipc:///no-such-dir/s.sock"], capsys, tmp_path / "runs")
    assert err == "error: transport.address = 'ipc:///no-such-dir/s.sock': the directory /no-such-dir does not exist"


def test_cuda_without_a_gpu_is_one_line_exit_2(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    err = refused(["device=cuda"], capsys, tmp_path / "runs")
    assert err.startswith("error: device = 'cuda': ") and "no CUDA GPU" in err


# --- combinations -------------------------------------------------------------------------


def test_a_minimum_no_client_can_have_is_refused_instead_of_hanging():
    with pytest.raises(ConfigError, match=r"^data\.min_samples = 100000: expected at most 1,"):
        load(None, ["data.samples_per_client=1", "data.min_samples=100000"])
    with pytest.raises(ConfigError, match=r"^data\.min_samples = 7000: expected at most 6000"):
        load(None, ["data.dataset=fashion_mnist", "data.min_samples=7000"])


@pytest.mark.parametrize(
    "model, dataset, shape",
    [
        ("cnn_cifar", "fashion_mnist", "(1, 28, 28)"),  # ran ten minutes at chance
        ("cnn_cifar", "synthetic", "(60,)"),
        ("cnn_fmnist", "cifar10", "(3, 32, 32)"),
        ("cnn_fmnist", "synthetic", "(60,)"),
    ],
)
def test_a_model_that_does_not_fit_the_data_is_refused(model, dataset, shape):
    with pytest.raises(ConfigError) as e:
        load(None, [f"model.name={model}", f"data.dataset={dataset}"])
    assert str(e.value).startswith(f"model.name = '{model}': expected a model for data.dataset={dataset}")
    assert f"samples have shape {shape}" in str(e.value)


@pytest.mark.parametrize(
    "model, dataset",
    [
        ("cnn_fmnist", "mnist"),
        ("cnn_fmnist", "fashion_mnist"),
        ("cnn_cifar", "cifar10"),
        ("mlp", "cifar10"),
        ("logreg", "synthetic"),
    ],
)
def test_models_on_the_data_they_are_defined_for_are_accepted(model, dataset):
    load(None, [f"model.name={model}", f"data.dataset={dataset}"])


# --- memory ---------------------------------------------------------------------------------


def test_a_model_too_big_for_memory_is_refused_with_the_estimate(capsys, tmp_path):
    err = refused(["model.name=mlp", "model.hidden=20000000", "workers=2"], capsys, tmp_path / "runs")
    assert "estimated memory" in err and "GiB available" in err and "2 workers" in err
    assert "1,420,000,010 parameters" in err and "per-sample gradients of a batch of" in err


@pytest.mark.parametrize(
    "model, dataset, parameters",
    [
        ("cnn_fmnist", "fashion_mnist", 26_010),
        ("cnn_cifar", "cifar10", 550_570),
        ("mlp_wei", "mnist", 203_530),
        ("logreg", "synthetic", 610),
    ],
)
def test_the_model_is_sized_without_allocating_it(model, dataset, parameters):
    from emulator.run.guards import model_size

    assert model_size(load(None, [f"model.name={model}", f"data.dataset={dataset}"])).parameters == parameters


def test_the_layer_sizes_are_those_a_forward_pass_gives_for_every_model_and_dataset():
    """The guard sizes layers from their settings (no forward pass, see model_size): the numbers a
    meta-device forward pass gives, for every model on every dataset it accepts."""
    import torch

    from emulator.config import ConfigError
    from emulator.run.guards import model_size
    from nodes.data import dataset_spec
    from nodes.training.model_catalog import MODEL_NAMES, architecture
    from nodes.training.models import sequential

    checked = 0
    for name in MODEL_NAMES:
        for dataset in ("synthetic", "mnist", "cifar10"):
            try:
                cfg = load(None, [f"model.name={name}", f"data.dataset={dataset}", "model.hidden=37"])
            except ConfigError:  # a model defined for other data
                continue
            outputs: list[int] = []
            data = dataset_spec(cfg.data)
            with torch.device("meta"):
                model = sequential(architecture(cfg.model, data.sample_shape, data.classes))
                for m in (m for m in model.modules() if not any(m.children())):
                    m.register_forward_hook(lambda _m, _i, out, outputs=outputs: outputs.append(out.numel()))
                model(torch.empty((1, *data.sample_shape)))
            size = model_size(cfg)
            assert (size.activations, size.widest_layer) == (sum(outputs), max(outputs)), (name, dataset)
            checked += 1
    assert checked >= len(MODEL_NAMES)


def test_the_model_is_sized_and_checked_without_torch(tmp_path):
    """preflight and the memory check size the model from its architecture: torch (~1.5 s of CPU)
    is not imported, so the server sets its workers up before it imports torch (emulator.run.lifecycle)."""
    code = (
        "import sys; from emulator.config import load; from emulator.run.guards import check_memory, preflight;"
        "cfg = load(None, ['model.name=cnn_fmnist', 'data.dataset=mnist', 'output.dir=' + sys.argv[1]]);"
        "preflight(cfg); check_memory(cfg, 2); print('torch' in sys.modules)"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_a_run_imports_torch_only_after_its_workers_have_started():
    """Loading and validating every shipped scenario (every section between them), and importing the run and sweep
    modules leave torch unimported: the server binds and spawns the workers before it imports torch
    (~1.5 s of CPU), so that the workers' imports overlap its own (emulator.run.lifecycle._listening)."""
    code = (
        "import sys; from emulator.config import SCENARIO_DIR, load;"
        "[load(p.name, []) for p in SCENARIO_DIR.glob('*.yaml')];"
        "load(None, ['model.name=cnn_fmnist', 'data.dataset=mnist',"
        " 'data.quality=[{clients: [0], salt_pepper: 0.1}]']);"
        "import emulator.run.lifecycle, emulator.cli.sweep, emulator.__main__; print('torch' in sys.modules)"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


# A synthetic test set of a few hundred MB built client by client (held twice as it is joined), more
# than a process's runtime allowance covers, built in seconds: by the evaluator (over HANDOVER_BYTES),
# or of about 110 MB by the server too, which hands it over (nodes.data.federated.ServerData)
BOUNDED = [
    *("clients.n=2000", "data.test_fraction=0.9", "model.name=logreg", "clients.select=uniform"),
    *("clients.per_round=2", "budget.rounds=1", "dp.tau=1", "workers=1"),
]


@pytest.mark.parametrize("samples", [1200, 250])
def test_the_memory_estimate_bounds_each_process_of_a_run_from_above(samples):
    from bench.rss_tree import peak_tree_rss
    from emulator.run.guards import MIB, available_memory, memory_estimate, server_data_bytes

    bounded = [*BOUNDED, f"data.samples_per_client={samples}"]
    cfg = load(None, bounded)
    e = memory_estimate(cfg, 1)
    assert (e.server_data == server_data_bytes(cfg) > 100 * MIB) == (samples == 250)  # the server draws it
    if e.total > available_memory():
        pytest.skip(f"the run's estimated {e.total / MIB:.0f} MiB exceed the memory available here")
    p = peak_tree_rss(bounded)
    # 5 %: every forked process's VmRSS counts the pages it shares with the zygote (torch's libraries, as
    # large as this machine's builds make them) again; the estimate counts one runtime per process
    slack = 1.05
    assert p.server * MIB <= e.server * slack, (p.server, e.server / MIB)
    assert max(p.others) * MIB <= max(e.evaluator, e.worker) * slack, (p.others, e.evaluator / MIB, e.worker / MIB)
    assert p.total * MIB <= e.total * slack, (p.total, e.total / MIB)


def test_the_servers_estimate_counts_each_client_each_task_of_a_round_and_each_outcome():
    from emulator.run.guards import memory_estimate

    def server(*overrides: str) -> int:
        return memory_estimate(load(None, ["model.name=logreg", "clients.n=1000", *overrides]), 1).server

    uniform = ("clients.select=uniform", "clients.per_round=10")
    assert server("clients.per_round=10") == server()  # clients.select=all trains every client, whatever per_round
    assert server(*uniform) < server()
    assert server(*uniform, "clients.n=2000") > server(*uniform)
    assert server("budget.rounds=40") > server("budget.rounds=20")


def test_the_memory_estimate_counts_per_sample_gradients_and_each_worker():
    from emulator.run.guards import memory_estimate

    base = load(None, ["model.name=mlp", "model.hidden=10000"])
    bigger_batch = load(None, ["model.name=mlp", "model.hidden=10000", "dp.q=0.5"])
    no_dp = load(None, ["model.name=mlp", "model.hidden=10000", "dp.sigma=0", "dp.clip=0"])
    e = memory_estimate(base, 2)
    assert e.total == e.server + e.evaluator + 2 * e.worker
    assert memory_estimate(bigger_batch, 2).worker > e.worker > memory_estimate(no_dp, 2).worker
    assert memory_estimate(base, 4).total - e.total == 2 * e.worker


# --- the generated test: every numeric key of the schema -----------------------------------


def numeric_keys(cls=ServerScenario, prefix=""):
    """(key, section class, field name, override) for every number of the schema; override(text)
    sets that number to text: a list of numbers gets one value, a list of sections one entry."""
    hints = get_type_hints(cls)
    for f in fields(cls):
        key, hint = prefix + f.name, hints[f.name]
        entry = list_entry_type(hint)
        if is_dataclass(hint):
            yield from numeric_keys(hint, key + ".")
        elif entry:
            for inner, name, listed in _numbers_of(entry):
                yield (
                    f"{key}[0].{inner}",
                    entry,
                    name,
                    lambda text, key=key, name=name, listed=listed: f"{key}=[{{{name}: {_one(text, listed)}}}]",
                )
        elif numeric_type(hint):
            listed = get_origin(hint) is list
            yield (
                f"{key}[0]" if listed else key,
                cls,
                f.name,
                lambda text, key=key, listed=listed: f"{key}={_one(text, listed)}",
            )


def _numbers_of(entry: type):
    """(key inside the entry, field name, is a list) of a list entry's numbers (entries hold no sections)."""
    hints = get_type_hints(entry)
    for f in fields(entry):
        if numeric_type(hints[f.name]):
            listed = get_origin(hints[f.name]) is list
            yield (f"{f.name}[0]" if listed else f.name), f.name, listed


def _one(text: str, listed: bool) -> str:
    return f"[{text}]" if listed else text


KEYS = list(numeric_keys())
BAD_NUMBERS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "-1": -1, "1e308": 1e308}
CASES = [(key, cls, name, make, text) for key, cls, name, make in KEYS for text in BAD_NUMBERS]


def test_the_schema_walk_finds_the_nested_and_listed_keys():
    keys = {k for k, *_ in KEYS}
    assert {
        "seed",
        "dp.q",
        "links.down_bps.values[0]",
        "links.schedule[0].t",
        "data.groups[0].samples",
        "impact.schedule[0].values[0]",
        "links.dropout.outages[0].clients[0]",
    } <= keys
    assert len(CASES) == 5 * len(KEYS) > 400


def test_every_numeric_key_declares_its_range():
    missing = sorted({f"{cls.__name__}.{name}" for _, cls, name, _ in KEYS if name not in schema.ranges_of(cls)})
    assert not missing, f"add a Range for these to schema.RANGES (a policy's to its options' RANGES): {missing}"


@pytest.mark.parametrize("key, cls, name, make, text", CASES, ids=[f"{c[0]}={c[4]}" for c in CASES])
def test_every_numeric_key_refuses_nan_inf_negative_and_huge_or_documents_them(key, cls, name, make, text):
    rng, integer = schema.declared_range(cls, name), numeric_type(get_type_hints(cls)[name]) is int
    value = BAD_NUMBERS[text]
    documented = not (integer and not float(value).is_integer()) and rng.admits(value)
    section = key.split(".")[0]
    overrides = [f"policy={section}"] * (section in POLICIES) + [make(text)]  # only the chosen policy's is read
    if documented:  # valid by the key's documented range (help text), e.g. dp.epsilon=inf (unlimited)
        assert rng.describe(integer) in help_text()
        load(None, overrides)
        return
    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    assert str(e.value).startswith(f"{key} = "), e.value


def test_the_sections_of_the_policies_not_chosen_are_not_checked():
    load(None, ["policy=fedavg_dp", "ali_dpfl.gamma=-1"])  # a sweep over policies may set every section
    with pytest.raises(ConfigError, match=r"^ali_dpfl\.gamma = -1"):
        load(None, ["policy=ali_dpfl", "ali_dpfl.gamma=-1"])

"""End-to-end: real server and worker processes, real ZeroMQ, real Opacus; results read back."""

import json
import math

import pytest
import torch
from opacus.accountants import RDPAccountant

from emulator.config import load
from nodes.contracts.protocol import Message
from nodes.data import load_federated
from nodes.training.model_catalog import evaluation_batch
from nodes.training.models import build_model
from nodes.training.trainer import evaluate, tensors
from nodes.transport.dispatch import PendingTasks
from tests.conftest import rows

GE = [
    "links.dropout.model=gilbert_elliott",
    "links.dropout.p_good_to_bad=0.3",
    "links.dropout.loss_bad=0.7",
    "links.up_bps.kind=lognormal",
    "links.up_bps.median=2e4",
    "links.up_bps.sigma=1.0",
    "round.deadline_s=1.5",
]


def manifest(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def test_parquet_bytes_equal_the_frames_the_workers_received_and_sent(emulate):
    run = emulate("transport.wire_log=true")
    wire = {(r["round"], r["client"]): r for r in map(json.loads, (run / "wire.jsonl").read_text().splitlines())}
    cr = rows(run, "client_rounds")
    assert len(cr) == len(wire) == 6 * 3
    for r in cr:
        w = wire[(r["round"], r["client"])]
        assert (r["bytes_down"], r["bytes_up"]) == (w["received"], w["sent"])
    for rnd in rows(run, "rounds"):
        mine = [r for r in cr if r["round"] == rnd["round"]]
        assert rnd["bytes_down"] == sum(r["bytes_down"] for r in mine)
        assert rnd["bytes_up"] == sum(r["bytes_up"] for r in mine)
    assert manifest(run)["status"] == "complete"


def test_each_worker_starts_a_round_with_a_client_it_trained_last(emulate):
    """Its data are in that worker's cache (nodes.transport.dispatch.PendingTasks). At a round's start every worker
    is idle, so its first task follows from who trained what before, whatever the timing."""
    run = emulate("transport.wire_log=true", "clients.select=uniform", "clients.per_round=3", "budget.rounds=8")
    served: dict[int, dict[str, list[int]]] = {}  # round -> worker -> clients, in the worker's order
    for r in map(json.loads, (run / "wire.jsonl").read_text().splitlines()):
        served.setdefault(r["round"], {}).setdefault(r["worker"], []).append(r["client"])
    trainer_of: dict[int, bytes] = {}
    for rnd in sorted(served):
        chosen = sorted(c for cs in served[rnd].values() for c in cs)
        if rnd > 0 and len(served[rnd - 1]) == 2:  # both workers ready: each takes one task at the start
            pending = PendingTasks([(c, Message(())) for c in chosen], trainer_of)
            for worker in sorted(served[rnd - 1]):
                first = pending.next_for(worker.encode())
                pending.mark_sent(first)
                assert served[rnd][worker][0] == chosen[first], (rnd, worker, served[rnd], trainer_of)
        for worker, clients in served[rnd].items():
            trainer_of.update((c, worker.encode()) for c in clients)


def test_same_seed_gives_identical_tables_whatever_the_number_of_workers(emulate):
    one = emulate("workers=1", *GE)
    three = emulate("workers=3", *GE)
    other_seed = emulate("workers=1", "seed=1", *GE)
    for name in ("rounds", "client_rounds", "events"):
        assert rows(one, name) == rows(three, name), name
    assert rows(one, "client_rounds") != rows(other_seed, "client_rounds")
    outcomes = {r["outcome"] for r in rows(one, "client_rounds")}
    assert {"arrived", "late"} <= outcomes and outcomes & {"lost_down", "lost_up"}, outcomes


def test_no_dropout_loses_nothing(emulate):
    run = emulate("links.dropout.model=bernoulli", "links.dropout.p=0")
    assert {r["outcome"] for r in rows(run, "client_rounds")} == {"arrived"}
    assert not [e for e in rows(run, "events") if e["kind"].endswith("_lost")]


def test_all_uploads_lost_aggregates_nothing_and_keeps_the_global_model(emulate):
    run = emulate("links.dropout.model=bernoulli", "links.dropout.p=1", "links.dropout.direction=up")
    rounds = rows(run, "rounds")
    assert [r["arrived"] for r in rounds] == [0, 0, 0] and all(r["lost"] == 6 for r in rounds)
    cfg = load(None, ["clients.n=6", "data.samples_per_client=60"])
    data = load_federated(cfg.data, cfg.clients.n, cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # as the run's evaluator (nodes.training.determinism): the same kernels, summing in one order
    try:
        initial = evaluate(model, *tensors(data.test()), evaluation_batch(cfg.model.name, cfg.dp.batch_eval))
    finally:
        torch.set_num_threads(threads)
    assert [(r["test_loss"], r["test_accuracy"]) for r in rounds] == [initial] * 3
    # the clients still trained (they got the model), so their privacy was spent
    assert all(r["local_steps"] == 2 and r["epsilon"] > 0 for r in rows(run, "client_rounds"))


def test_bernoulli_loss_rate_lands_in_the_99_percent_binomial_interval(emulate):
    run = emulate(
        "links.dropout.model=bernoulli", "links.dropout.p=0.3", "clients.n=30", "budget.rounds=12", "dp.tau=1"
    )
    ev = [e["kind"] for e in rows(run, "events")]
    n = sum(ev.count(k) for k in ("download_end", "download_lost", "upload_end", "upload_lost"))
    lost = ev.count("download_lost") + ev.count("upload_lost")
    assert n >= 500
    assert abs(lost - 0.3 * n) <= 2.576 * math.sqrt(n * 0.3 * 0.7), (lost, n)


def test_a_client_too_slow_for_the_deadline_is_late_and_not_aggregated(emulate):
    # client 0 uploads at 10 kbit/s: its ~3 kB update needs > 2 s; the others need milliseconds
    run = emulate(
        "links.up_bps.kind=list",
        "links.up_bps.values=[1e4,1e7,1e7,1e7,1e7,1e7]",
        "links.latency_s.value=0.01",
        "compute.step_s.value=0.1",
        "round.deadline_s=1.0",
    )
    for r in rows(run, "client_rounds"):
        if r["client"] == 0:
            assert r["outcome"] == "late" and r["impact_factor"] == 0.0 and r["t_upload_end"] == "nan"
            expected_arrival = r["t_compute_end"] + 0.01 + 8 * r["bytes_up"] / 1e4
            assert expected_arrival > r["t_download_start"] + 1.0
        else:
            assert r["outcome"] == "arrived" and r["impact_factor"] > 0
    for rnd in rows(run, "rounds"):
        assert (rnd["arrived"], rnd["late"]) == (5, 1)
        assert rnd["t_end"] == pytest.approx(rnd["t_start"] + 1.0)
        mine = [r["impact_factor"] for r in rows(run, "client_rounds") if r["round"] == rnd["round"]]
        assert sum(mine) == pytest.approx(1.0)


def test_byte_budget_stops_the_run_without_being_exceeded(emulate):
    probe = rows(emulate("budget.rounds=1"), "rounds")[0]["bytes_total"]
    budget = int(2.5 * probe)
    run = emulate("budget.rounds=50", f"budget.bytes={budget}")
    rounds = rows(run, "rounds")
    assert len(rounds) == 2
    assert sum(r["bytes_total"] for r in rounds) <= budget
    m = manifest(run)
    assert "byte budget" in m["stop_reason"] and m["derived_budgets"]["R_s"] == 2


def test_time_budget_stops_the_run_without_being_exceeded(emulate):
    run = emulate(
        "budget.rounds=50",
        "budget.time_s=2.5",
        "round.deadline_s=1.0",
        "links.dropout.model=bernoulli",
        "links.dropout.p=0.5",
    )
    rounds = rows(run, "rounds")
    assert rounds[-1]["t_end"] <= 2.5 and len(rounds) < 50
    assert "time budget" in manifest(run)["stop_reason"]


def test_epsilon_matches_opacus_and_never_exceeds_the_target(emulate):
    # (q=0.1, sigma=1.5, delta=1e-5): 56 steps fit in epsilon=3, so 3 rounds of 15 steps and no 4th
    run = emulate("dp.epsilon=3", "dp.sigma=1.5", "dp.q=0.1", "dp.tau=15", "budget.rounds=20")
    cr = rows(run, "client_rounds")
    assert max(r["epsilon"] for r in cr) <= 3
    for c in range(6):
        mine = [r for r in cr if r["client"] == c]
        assert sum(r["local_steps"] for r in mine) == 45
        acc = RDPAccountant()
        for _ in range(45):
            acc.step(noise_multiplier=1.5, sample_rate=0.1)
        assert mine[-1]["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert "privacy budget exhausted" in manifest(run)["stop_reason"]
    assert len(rows(run, "rounds")) == 3


def test_a_worker_killed_mid_round_costs_its_update_and_the_run_goes_on(emulate, monkeypatch, faulty_workers):
    monkeypatch.setenv("DPFL_FAULT_KILL_AT", "1:2")  # the worker holding client 2 in round 1 SIGKILLs itself
    run = emulate("budget.rounds=4")
    cr = {(r["round"], r["client"]): r for r in rows(run, "client_rounds")}
    assert cr[(1, 2)]["outcome"] == "failed" and "died" in cr[(1, 2)]["failure"]
    assert cr[(1, 2)]["impact_factor"] == 0.0
    assert all(cr[(r, 2)]["outcome"] == "arrived" for r in (2, 3))
    assert [r["failed"] for r in rows(run, "rounds")] == [0, 1, 0, 0]
    m = manifest(run)
    assert m["status"] == "complete" and m["transport"]["worker_deaths"] == 1


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:  # a kernel without IPv6, or no ::1 on its loopback interface
        return False
    return socket.has_ipv6


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        pytest.param(
            "::1", marks=pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
        ),
    ],
)
def test_a_worker_started_by_hand_joins_over_tcp(emulate, tmp_path, host):
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from nodes.contracts.keys import keygen

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    # the IPv6 address as typed on a command line, unquoted: brackets and all
    address, keys = f"tcp://{f'[{host}]' if ':' in host else host}:{port}", tmp_path / "keys"
    keygen(keys)  # tcp, loopback included, is authenticated: a worker started by hand needs keys
    root = Path(__file__).resolve().parents[2]
    # started first: ZeroMQ connects as soon as the server binds
    hand = subprocess.Popen(
        [sys.executable, "-m", "nodes.worker", "--connect", address, "--id", "by-hand", "--keys", str(keys)], cwd=root
    )
    try:
        run = emulate(
            f"transport.address={address}",
            f"transport.keys_dir={keys}",
            "workers=1",
            "transport.wire_log=true",
            "budget.rounds=8",
            "transport.min_workers=2",
        )
        served = {json.loads(line)["worker"] for line in (run / "wire.jsonl").read_text().splitlines()}
        assert "by-hand" in served and len(served) == 2
        assert hand.wait(timeout=30) == 0  # the server shut it down at the end of the run
        assert manifest(run)["server_address"] == address
    finally:
        hand.kill()


def test_a_data_quality_swap_at_a_given_round_is_recorded_and_applied(emulate):
    # clients 0-2 have 50% noisy labels until round 2, clients 3-5 from round 2 on
    rules = (
        "data.quality=[{client_range: [0, 3], from_round: 0, label_noise: 0.5},"
        "{client_range: [0, 3], from_round: 2, label_noise: 0.0},"
        "{client_range: [3, 6], from_round: 2, label_noise: 0.5}]"
    )
    noisy = emulate(rules, "budget.rounds=4", "dp.sigma=0", "dp.clip=0", "dp.q=0.5")
    clean = emulate("budget.rounds=4", "dp.sigma=0", "dp.clip=0", "dp.q=0.5")
    got = {(r["round"], r["client"]): r for r in rows(noisy, "client_rounds")}
    ref = {(r["round"], r["client"]): r for r in rows(clean, "client_rounds")}
    for (rnd, c), r in got.items():
        expect = 0.5 if (c < 3) == (rnd < 2) else 0.0
        assert r["label_noise"] == expect and r["salt_pepper"] == 0.0
        # round 0 starts from the same global model: only the corrupted clients train differently
        if rnd == 0:
            assert (r["train_loss"] != ref[(rnd, c)]["train_loss"]) == (expect > 0), (rnd, c)

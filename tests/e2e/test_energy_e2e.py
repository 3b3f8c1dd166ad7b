"""Energy end to end: the tables' joules are the power model's function of the tables' own times and bytes
(docs/energy.md), budget.energy_j is never exceeded, and neither the workers nor a SIGKILL change them."""

import json
import math
import re

import pytest

from emulator.__main__ import main
from emulator.config import load
from emulator.output.summary import summarise_run
from emulator.run.lifecycle import run
from tests.conftest import FAST, killed_after_round, rows
from tests.e2e.test_runtime import GE

# LTE as docs/energy.md gives it: W per Mbit/s up and down, W in flight, the tail's W and s
ALPHA_UP, ALPHA_DOWN, BETA, TAIL_W, TAIL_S = 0.43839, 0.05197, 1.28804, 1.060, 11.576
COMPUTE_W = 1.5
# Constant links of their own (no trace, no shared server link): what crossed before a cut is rate x time.
ENERGY = ["energy.radio=lte", f"energy.compute_w.value={COMPUTE_W}", *GE]


def by_hand(r: dict, link: dict) -> tuple[float, float, float, float]:
    """A client_rounds row's (radio down, radio up, tail, compute) joules from its own columns and its
    client's link (the clients table): Huang et al.'s P = alpha * Mbit/s + beta in flight, its tail after."""
    start, end, down_end, compute_end, up_end = (
        r[k] for k in ("t_download_start", "t_end", "t_download_end", "t_compute_end", "t_upload_end")
    )
    crossed = {  # a cut transfer: from its start and latency to the cut, at the link's rate
        "down": lambda t0: link["down_bps"] * max(0.0, end - t0 - link["latency_s"]),
        "up": lambda t0: link["up_bps"] * max(0.0, end - t0 - link["latency_s"]),
    }
    if down_end == "nan":  # cut during its download
        bits = crossed["down"](start)
        return BETA * (end - start) + ALPHA_DOWN * bits / 1e6, 0.0, TAIL_W * TAIL_S, 0.0
    down = BETA * (down_end - start) + ALPHA_DOWN * 8 * r["bytes_down"] / 1e6
    if compute_end == "nan":  # lost on the way down, failed, or cut during training
        trained = r["outcome"] not in ("lost_down", "failed")
        return down, 0.0, TAIL_W * TAIL_S, COMPUTE_W * (end - down_end) if trained else 0.0
    late = r["outcome"] == "late"
    bits = crossed["up"](compute_end) if late else 8 * r["bytes_up"]
    up = BETA * ((end if up_end == "nan" else up_end) - compute_end) + ALPHA_UP * bits / 1e6
    tail = TAIL_W * min(TAIL_S, compute_end - down_end) + TAIL_W * TAIL_S
    return down, up, tail, COMPUTE_W * (compute_end - down_end)


def test_every_tasks_joules_follow_from_its_times_and_bytes(emulate):
    run_dir = emulate(*ENERGY, "budget.rounds=6")
    links = {c["client"]: c for c in rows(run_dir, "clients")}
    cr = rows(run_dir, "client_rounds")
    assert {"arrived", "late"} <= {r["outcome"] for r in cr} and {"lost_down", "lost_up"} & {r["outcome"] for r in cr}
    for r in cr:
        got = tuple(r[f"energy_{k}_j"] for k in ("radio_down", "radio_up", "tail", "compute"))
        assert got == pytest.approx(by_hand(r, links[r["client"]]), rel=1e-9), r
    for rnd in rows(run_dir, "rounds"):
        mine = [
            sum(r[f"energy_{k}_j"] for k in ("radio_down", "radio_up", "tail", "compute"))
            for r in cr
            if r["round"] == rnd["round"]
        ]
        assert rnd["energy_j"] == pytest.approx(sum(mine), rel=1e-12)
    parts = [sum(r[f"energy_{k}_j"] for r in cr) for k in ("radio_down", "radio_up", "tail", "compute")]
    summary = dict(line.split(None, 1) for line in summarise_run(run_dir).splitlines())
    assert summary["energy"] == (
        f"{sum(parts):.1f} J over {len(cr)} tasks (lte radio: {parts[0]:.1f} J down, {parts[1]:.1f} J up, "
        f"{parts[2]:.1f} J tail; compute {parts[3]:.1f} J)"
    )


def test_without_an_energy_model_the_energy_columns_are_empty(emulate):
    run_dir = emulate()
    assert {r["energy_j"] for r in rows(run_dir, "rounds")} == {None}
    assert {r["energy_tail_j"] for r in rows(run_dir, "client_rounds")} == {None}
    assert "energy" not in dict(line.split(None, 1) for line in summarise_run(run_dir).splitlines())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_energy_budget_stops_the_run_without_being_exceeded(emulate, seed):
    probe = rows(emulate(*ENERGY, f"seed={seed}", "budget.rounds=1"), "rounds")[0]["energy_j"]
    budget = 2.5 * probe
    run_dir = emulate(*ENERGY, f"seed={seed}", "budget.rounds=50", f"budget.energy_j={budget}")
    rounds = rows(run_dir, "rounds")
    spent = sum(r["energy_j"] for r in rounds)
    m = json.loads((run_dir / "run.json").read_text())
    refused = float(re.search(r"would draw ([0-9.e+]+) J", m["stop_reason"]).group(1))
    assert spent <= budget < spent + refused * (1 + 1e-5)  # the round refused would have passed it
    assert m["stop_reason"].startswith(f"energy budget {budget:g} J reached")
    assert m["virtual_time_s"] == rounds[-1]["t_end"]  # the refused round's time is not spent either


def test_the_tables_do_not_depend_on_the_number_of_workers(emulate):
    one, three = emulate(*ENERGY, "workers=1"), emulate(*ENERGY, "workers=3")
    for name in ("rounds", "client_rounds", "events"):
        assert rows(one, name) == rows(three, name), name


def test_a_resumed_run_stops_where_the_uninterrupted_one_did_by_its_energy_budget(tmp_path):
    scenario = [*FAST, *ENERGY, "budget.rounds=50"]
    probe = rows(
        run(load(None, [*scenario, "budget.rounds=1", f"output.dir={tmp_path}", "output.name=probe"])), "rounds"
    )
    with_budget = [*scenario, f"budget.energy_j={6.5 * probe[0]['energy_j']}"]
    reference = run(load(None, [*with_budget, f"output.dir={tmp_path}", "output.name=ref"]))
    assert 5 <= len(rows(reference, "rounds")) < 50
    run_dir = tmp_path / "killed"
    killed_after_round([*with_budget, f"output.dir={tmp_path}", "output.name=killed"], run_dir, 2)
    assert main(["resume", str(run_dir)]) == 0
    for name in ("rounds", "client_rounds", "events"):
        assert rows(run_dir, name) == rows(reference, name), name
    stop = [json.loads((d / "run.json").read_text())["stop_reason"] for d in (run_dir, reference)]
    assert stop[0] == stop[1] and math.isfinite(float(re.search(r"([0-9.e+]+) J spent", stop[0]).group(1)))


# Batteries of 36 J at most, charged 30-100 % at t = 0: a few tasks empty them.
BATTERY = [
    *ENERGY,
    "energy.battery.enabled=true",
    "energy.battery.capacity_wh.value=0.01",
    "energy.battery.initial.kind=uniform",
    "energy.battery.initial.low=0.3",
    "energy.battery.initial.high=1.0",
    "budget.rounds=8",
]


def by_client(cr: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in sorted(cr, key=lambda r: r["round"]):
        out.setdefault(r["client"], []).append(r)
    return out


def joules(r: dict) -> float:
    return sum(r[f"energy_{k}_j"] for k in ("radio_down", "radio_up", "tail", "compute"))


def test_a_battery_drains_by_its_tasks_and_a_task_that_empties_it_is_lost_then(emulate):
    run_dir = emulate(*BATTERY, "energy.battery.floor=0")
    clients = {c["client"]: c for c in rows(run_dir, "clients")}
    emptied = {(e["round"], e["client"]): e["t"] for e in rows(run_dir, "events") if e["kind"] == "battery_empty"}
    assert emptied, "no battery emptied during a task"
    for c, tasks in by_client(rows(run_dir, "client_rounds")).items():
        charge = clients[c]["battery_initial_j"]
        assert 0.3 * clients[c]["battery_capacity_j"] <= charge <= clients[c]["battery_capacity_j"]
        for r in tasks:
            assert r["battery_start_j"] == charge  # nothing recharges it between tasks (recharge_w = 0)
            assert r["battery_end_j"] == pytest.approx(max(0.0, charge - joules(r)), abs=1e-9)
            assert joules(r) <= charge * (1 + 1e-12)  # a battery gives no more than it holds
            if (r["round"], c) in emptied:
                assert r["outcome"] in ("lost_down", "lost_up") and r["t_end"] == emptied[r["round"], c]
                assert r["battery_end_j"] == pytest.approx(0.0, abs=1e-9)
            charge = r["battery_end_j"]


def test_below_the_floor_a_client_is_offered_no_task(emulate):
    run_dir = emulate(*BATTERY, "energy.battery.floor=0.5")
    capacity = {c["client"]: c["battery_capacity_j"] for c in rows(run_dir, "clients")}
    cr = rows(run_dir, "client_rounds")
    assert cr and all(r["battery_start_j"] >= 0.5 * capacity[r["client"]] for r in cr)
    assert len(cr) < 8 * 6  # some client was left out of some round


def test_batteries_do_not_depend_on_the_workers_or_a_sigkill(emulate, tmp_path):
    one, three = (
        emulate(*BATTERY, "energy.battery.floor=0", "workers=1"),
        emulate(*BATTERY, "energy.battery.floor=0", "workers=3"),
    )
    for name in ("rounds", "client_rounds", "events", "clients"):
        assert rows(one, name) == rows(three, name), name
    scenario = [*FAST, *BATTERY, "energy.battery.floor=0", f"output.dir={tmp_path}"]
    run_dir = tmp_path / "killed"
    killed_after_round([*scenario, "output.name=killed"], run_dir, 3)
    assert main(["resume", str(run_dir)]) == 0
    reference = run(load(None, [*scenario, "output.name=ref"]))
    for name in ("rounds", "client_rounds", "events"):
        assert rows(run_dir, name) == rows(reference, name), name

"""ALI-DPFL Table VII: FashionMNIST at R_s = 1/3 R_c, epsilon = 2, under IID and three
Dirichlet label skews, in the authors' code's setting (scenarios/paper/ali_dpfl_table7_fmnist.yaml).
PE-DPFL and the FedAvg+DP row (whose tau the paper does not give) are not reproduced."""

from __future__ import annotations

from bench.reproduce.ali_dpfl import SCENARIO_DIR, rows_report
from bench.reproduce.common import Options, Point, column, run_points, runs

SCENARIO = f"{SCENARIO_DIR}/ali_dpfl_table7_fmnist.yaml"
SWEEP = "ali_dpfl_table7"
TAUS = (1, 2, 3, 5, 10)
# setting -> (its data keys, Gamma of Sec. V-D)
SETTINGS = {
    "IID": ({"data.partition": "iid"}, 0.0),
    "Dir(0.05)": ({"data.partition": "dirichlet_capped", "data.dirichlet_beta": "0.05"}, 10.0),
    "Dir(0.5)": ({"data.partition": "dirichlet_capped", "data.dirichlet_beta": "0.5"}, 5.0),
    "Dir(1)": ({"data.partition": "dirichlet_capped", "data.dirichlet_beta": "1.0"}, 1.0),
}
ROWS = ["Adap DP-FL", *(f"tau = {t}" for t in TAUS), "ALI-DPFL"]
PAPER = {  # Table VII columns IID, Dir(0.05), Dir(0.5), Dir(1)
    "Adap DP-FL": (87.12, 83.58, 83.62, 84.05),
    "tau = 1": (84.56, 80.92, 81.01, 82.77),
    "tau = 2": (86.12, 82.15, 84.61, 84.88),
    "tau = 3": (89.46, 84.45, 84.89, 85.82),
    "tau = 5": (83.30, 80.62, 81.21, 82.05),
    "tau = 10": (76.56, 73.56, 74.06, 74.51),
    "ALI-DPFL": (89.62, 84.85, 85.45, 86.12),
}


EVIDENCE = """
#### Why the rows differ from the paper

- The setting is Table II's, the authors' code's (`ali_dpfl_table2`'s report, items 1–12, each
  confirmed in their files), at R_s = R_c/3 = 106 rounds. In that setting the authors' own code,
  run on this machine, ends 18 points below the paper's Table II at τ = 2 (65.2 % against 83.2 %)
  and 24 below at τ = 1 (57.3 % against 81.6 %), where ours does (`ali_dpfl_table2`'s report).
  The rows above are below Table VII's figures by gaps of the same order. The authors' code was
  not run in Table VII's four settings here (about 20 s a round on one core, 84 runs).
- Dir(0.05) is Table II's partition (the same capped draw and seed), so its τ = 3, 5, 10 rows,
  which stop at ε = 2 before either table's R_s, give Table II's numbers. Its smallest client
  gives B̂ = q · min |D_i| = 0.015 · 204 ≈ 3 (the authors' code: int(...) = 3): the noise term
  σ²C²d/B̂² of eq. 9 dominates τ*, and ALI-DPFL takes τ = 1 in every round (its mean τ above), as
  the authors' code does in Table II.
- The fixed-τ rows stop at ε = 2 (their max ε): τ = 3, 5, 10 play 104, 62 and 31 of the 106
  rounds. The authors' DPFL server has no privacy stop (`ali_dpfl_table2_no_stop` runs Table II's
  rows that way).
"""


def points(opts: Options) -> list[Point]:
    out = []
    for seed in opts.seeds:
        for keys, gamma in SETTINGS.values():
            extra = [f"ali_dpfl.gamma={gamma}"]
            out += [
                Point(SWEEP, SCENARIO, seed, {**keys, "policy": "fedavg_dp", "dp.tau": str(t)}, extra) for t in TAUS
            ]
            out.append(Point(SWEEP, SCENARIO, seed, {**keys, "policy": "ali_dpfl"}, extra))
            out.append(Point(SWEEP, SCENARIO, seed, {**keys, "policy": "adap_dpfl", "dp.tau": "3"}, extra))
    return out


def row_of(run) -> str:
    policy = run.keys["policy"]
    return {"ali_dpfl": "ALI-DPFL", "adap_dpfl": "Adap DP-FL"}.get(policy, f"tau = {run.keys.get('dp.tau')}")


def report(opts: Options) -> str:
    run_points(opts, points(opts))
    done = runs(opts.out / SWEEP)
    parts = []
    for col, (name, (keys, _)) in enumerate(SETTINGS.items()):
        mine = [r for r in done if all(r.keys.get(k) == v for k, v in keys.items())]
        parts.append(
            rows_report(
                f"Table VII, {name} (FashionMNIST, R_s = 1/3 R_c, epsilon = 2)",
                {row: PAPER[row][col] for row in ROWS},
                mine,
                row_of,
            )
            + adap_note(mine)
        )
    return "\n".join(parts) + EVIDENCE


def adap_note(runs) -> str:
    """What Adap DP-FL's runs did: sigma decays only when the test loss stalls, and a decayed sigma
    spends more epsilon a round, so a run may end before the tau = 3 run's last round."""
    adap = [r for r in runs if r.status == "complete" and r.keys["policy"] == "adap_dpfl"]
    if not adap:
        return ""
    lines = []
    for r in adap:
        sigmas = column(r, "rounds", "sigma")
        played = "–".join(f"{v:g}" for v in sorted(set(sigmas)))
        lines.append(
            f"- seed {r.keys['seed']}: {len(sigmas)} rounds, σ = {played} in the rounds played; "
            f"stopped: {r.manifest.get('stop_reason')}"
        )
    return (
        "\nAdap DP-FL (τ = 3): σ × 0.9 after 4 rounds without a new lowest test loss; a round that "
        "would pass ε = 2 is not played, which ends the run.\n\n" + "\n".join(lines) + "\n"
    )

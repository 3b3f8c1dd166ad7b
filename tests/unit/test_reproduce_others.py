"""The reproduction targets for Fu et al., Talaei & Izadi and Wei et al.: registered, importable,
their paper scenarios valid, and the numbers their reports derive from the papers' equations."""

import importlib
import math

import pytest

from bench.reproduce.__main__ import TARGETS
from emulator.aggregate.impact import impact_factors
from emulator.config import SCENARIO_DIR, load

NEW_TARGETS = {
    "fu_tuning_e": ["paper/fu_laplace_lr.yaml", "paper/fu_gaussian_fmnist.yaml"],
    "padpfl_scenarios": [f"paper/padpfl_scenario{n}.yaml" for n in range(1, 5)],
    "udp_crd_eps": ["paper/udp_crd_fmnist.yaml"],
}


@pytest.mark.parametrize("target", sorted(NEW_TARGETS))
def test_target_is_registered_and_imports(target):
    module = importlib.import_module(f"bench.reproduce.{TARGETS[target]}")
    assert callable(module.report)


@pytest.mark.parametrize("path", sorted(p for ps in NEW_TARGETS.values() for p in ps))
def test_paper_scenario_loads(path):
    assert (SCENARIO_DIR / path).is_file()
    cfg = load(path)
    assert cfg.policy in {"fu_tuning", "padpfl", "udp_crd"}


@pytest.mark.parametrize(
    "path", sorted(str(p.relative_to(SCENARIO_DIR)) for p in (SCENARIO_DIR / "paper").glob("*.yaml"))
)
def test_every_paper_scenario_validates(path):
    load(path)


def test_fu_predicted_optima_at_the_papers_T():
    from bench.reproduce.fu_tuning_e import GAUSSIAN, LAPLACE

    assert (LAPLACE.T, LAPLACE.predicted) == (120, 24)  # 120^(2/3) = 24.33
    assert (GAUSSIAN.T, GAUSSIAN.predicted) == (240, 15)  # 240^(1/2) = 15.49
    assert LAPLACE.predicted in LAPLACE.grid and GAUSSIAN.predicted in GAUSSIAN.grid
    for m in (LAPLACE, GAUSSIAN):  # the scenario is the mechanism swept
        cfg = load(m.scenario)
        assert (cfg.fu_tuning.mechanism, cfg.fu_tuning.iterations) == (m.name, m.T)


@pytest.mark.parametrize(
    "n, factors",
    [
        (1, {0: 0.0, 20: 1 / 60, 40: 2 / 60}),  # "0-1-2"
        (2, {0: 0.0, 20: 2 / 75, 55: 1 / 75}),  # "0-2-1" = 0, 8/(5N), 4/(5N)
        (3, {0: 1 / 180, 20: 1 / 60, 40: 1 / 36}),  # "1-3-5"
        (4, {0: 0.0, 20: 1 / 60, 40: 1 / 30}),  # t <= 10
    ],
)
def test_padpfl_scenarios_carry_the_papers_factors(n, factors):
    cfg = load(f"paper/padpfl_scenario{n}.yaml")
    sizes = [g.samples for g in cfg.data.groups for _ in range(g.clients)]
    p = impact_factors(cfg.impact, 0, sizes)
    for first, value in factors.items():
        assert p[first] == pytest.approx(value)
    if n == 4:
        after = impact_factors(cfg.impact, 10, sizes)  # the paper's t = 11, 0-based round 10
        assert [after[0], after[20], after[40]] == pytest.approx([1 / 30, 1 / 60, 0.0])
    assert len(sizes) == 60 and cfg.budget.rounds == 30 and cfg.dp.delta == 0.01 and cfg.dp.lr == 0.02


def test_padpfl_noise_table_is_eq8_and_eq13_by_hand():
    from bench.reproduce.padpfl_scenarios import _noise_rows

    rows = {(r[0], r[1]): r for r in _noise_rows()}
    c = math.sqrt(2 * math.log(1.25 / 0.01))
    sC = 2 * 10.0 * 30 * c / (150 * 20.0)  # eq. 8: 2 B R c / (min m eps), R = T = 30
    assert float(rows[(1, "uniform")][2]) == pytest.approx(sC, rel=1e-2)
    assert float(rows[(1, "uniform")][3]) == 0.0  # eq. 13 with R = T: no server noise
    ratio = sC * math.sqrt(1 / 60) / (10.0 / math.sqrt(159_010))
    assert float(rows[(1, "uniform")][5]) == pytest.approx(ratio, abs=0.05)
    sC3 = 2 * 10.0 * 30 * c / (50 * 20.0)  # scenario 3: min m = 50
    assert float(rows[(3, "uniform")][2]) == pytest.approx(sC3, rel=1e-2)


def test_udp_crd_scenario_is_the_papers_fig8b_setting():
    cfg = load("paper/udp_crd_fmnist.yaml")
    assert (cfg.udp_crd.horizon, cfg.udp_crd.zeta, cfg.udp_crd.beta, cfg.dp.delta) == (200, 0.001, 0.9, 1e-3)
    assert cfg.clients.per_round / cfg.clients.n == pytest.approx(0.6)
    assert cfg.data.max_train / cfg.clients.n == 800  # |D_i| = 800


def test_fedcs_cellular_reads_time_to_target_off_the_accuracy_curve():
    from pathlib import Path

    import pyarrow as pa

    from bench.reproduce.common import Options, accuracy_curve, time_to
    from bench.reproduce.fedcs_cellular import GRID_S, points

    class Run:  # what analysis.load.Run offers the report: its rounds table
        def table(self, name):
            return pa.table(
                {"t_start": [0.0, 1.5, 3.0], "t_end": [1.5, 3.0, 4.5], "test_accuracy": [0.3, math.nan, 0.7]}
            )

    c = accuracy_curve(Run(), GRID_S)
    assert c[GRID_S < 1.5].max() == 0.0  # nothing known before the first round ends
    assert set(c[(GRID_S >= 1.5) & (GRID_S < 4.5)]) == {0.3}  # the unevaluated round changes nothing
    assert time_to(c, 0.5, GRID_S) == 4.5 and time_to(c, 0.8, GRID_S) == math.inf
    ps = points(Options(seeds=[0, 1], jobs=1, out=Path("x")))
    assert len(ps) == 8 and {p.hive["policy"] for p in ps} == {"fedcs", "fedavg_dp"}
    for p in ps:  # every point is a valid scenario
        load(p.scenario, [f"seed={p.seed}", *(f"{k}={v}" for k, v in p.hive.items()), *p.overrides])


def test_async_cellular_compares_the_three_modes_and_states_fedbuffs_claim_from_the_times():
    from pathlib import Path

    import pyarrow as pa

    from bench.reproduce.async_cellular import GRID_S, claim, mean_staleness, points
    from bench.reproduce.common import Options, accuracy_curve, time_to

    class Run:  # what analysis.load.Run offers the report: its rounds and client_rounds tables
        def table(self, name):
            if name == "client_rounds":
                return pa.table({"staleness": [0, 3, 2, 5], "impact_factor": [0.5, 0.25, 0.0, 0.1]})
            return pa.table({"t_end": [2.0, 3.0, 5.0], "test_accuracy": [0.2, math.nan, 0.6]})

    c = accuracy_curve(Run(), GRID_S)
    assert c[GRID_S < 2.0].max() == 0.0 and time_to(c, 0.5, GRID_S) == 5.0 and time_to(c, 0.7, GRID_S) == math.inf
    assert mean_staleness(Run()) == pytest.approx(8 / 3)  # the applied updates only: 0, 3 and 5
    assert claim({"sync": 40.0, "buffered": 25.0}, 0.5).startswith("50%: confirmed")
    assert claim({"sync": 40.0, "buffered": math.inf}, 0.5).startswith("50%: refuted")
    assert claim({"sync": math.inf, "buffered": math.inf}, 0.5).startswith("50%: undecided")
    ps = points(Options(seeds=[0, 1, 2], jobs=1, out=Path("x")))
    assert len(ps) == 9 and {p.hive["round.mode"] for p in ps} == {"sync", "buffered", "async"}
    for p in ps:  # every point is a valid scenario
        load(p.scenario, [f"seed={p.seed}", *(f"{k}={v}" for k, v in p.hive.items()), *p.overrides])

import os
import subprocess
import sys
from dataclasses import dataclass, fields
from functools import reduce
from pathlib import Path
from typing import get_type_hints

import pytest

from emulator.__main__ import main
from emulator.config import SCENARIO_DIR, ConfigError, help_text, load
from emulator.policies import POLICIES, Policy
from nodes.contracts.schema import list_entry_type

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ArgsOptions:
    k: int = 2
    j: int = 0


class ArgsPolicy(Policy):
    """A user policy (policy=module:Class) whose options are policy_args.k and policy_args.j."""

    name = "args_policy"
    Options = ArgsOptions


@pytest.fixture
def bad_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("clients: {n: 3\nseed: [\n")
    return str(p)


# (argv, text the one-line error must contain: the key and what was expected)
BAD = [
    (["clients.nn=3"], "clients.nn: unknown key"),
    (["clients.n=three"], "clients.n"),
    (["dp.q=1.5"], "dp.q = 1.5: expected a number in (0, 1]"),
    (["dp.q=0"], "dp.q = 0.0: expected a number in (0, 1]"),
    (["dp.sigma=-1"], "dp.sigma = -1.0: expected a number in [0, 1e+06]"),
    (["links.up_bps.value=0"], "links.up_bps.value = 0.0: expected a number >= 1 (bits/s)"),
    (["links.dropout.p=2"], "links.dropout.p = 2.0: expected a number in [0, 1]"),
    (["impact.kind=explicit", "clients.n=3", "impact.values=[0.5,0.4,0.3]"], "impact.values"),
    (["impact.kind=explicit", "clients.n=3", "impact.values=[0.5,0.5]"], "impact.values"),
    (["scenario=no_such_scenario.yaml"], "scenario=no_such_scenario.yaml: file not found"),
    (["policy=nope"], "policy = 'nope': expected"),
    (["round.deadline_s=0"], "round.deadline_s"),
    (["budget.bytes=-5"], "budget.bytes"),
    (["dp.epsilon=2", "dp.sigma=0", "dp.clip=0"], "dp.sigma"),
    (["links.dropout.model=markov"], "links.dropout.model = 'markov'"),
    (["transport.address=http://x"], "transport.address"),
    (["seed"], "seed: expected key=value"),
    (["energy.radio=5g"], "energy.radio = '5g': expected none | lte | wifi"),
    (["energy.radio=lte", "energy.compute_w.value=-1"], "energy.compute_w.value = -1.0"),
    (["budget.energy_j=100"], "budget.energy_j = 100.0: expected inf while energy.radio = none"),
    (["energy.radio=lte", "budget.energy_j=100", "round.mode=buffered"], "budget.energy_j = 100.0: expected inf under"),
]


@pytest.mark.parametrize("argv, expected", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_gives_one_line_naming_the_key_and_exit_2(argv, expected, capsys, tmp_path):
    code = main([*argv, f"output.dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert expected in err, err
    assert not any(tmp_path.iterdir()), "a rejected scenario must start nothing"


def test_malformed_yaml(bad_yaml, capsys):
    assert main([f"scenario={bad_yaml}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "malformed YAML" in err and "line" in err and len(err.splitlines()) == 1


def test_yaml_with_a_list_at_top_level(tmp_path, capsys):
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    assert main([f"scenario={p}"]) == 2
    assert "expected a mapping" in capsys.readouterr().err


def test_exit_status_2_from_the_real_command_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "emulator", "dp.q=7", f"output.dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == "error: dp.q = 7.0: expected a number in (0, 1]"


def test_help_lists_every_key_with_its_meaning():
    text = help_text()
    for key in ("seed = 0", "dp.q = 0.05", "links.dropout.model", "budget.bytes", "round.deadline_s"):
        assert key in text
    assert "Poisson sampling rate" in text
    # the defaults of Dist sections are the real ones (20e6 bit/s down), not Dist's own zeros
    assert "links.down_bps.value = 20000000.0" in text and "compute.step_s.value = 0.05" in text
    assert "dp.tau = 5  # local DP-SGD steps per round; an integer in [1, 1000000]" in text
    assert "links.schedule[i].t = 0.0" in text and "listed in order of t" in text
    r = subprocess.run(
        [sys.executable, "-m", "emulator", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "links.up_bps" in r.stdout


def test_help_shows_every_keys_real_default_and_the_policy_choices():
    """Each `key = default` line against the scenario load() gives without a file or overrides
    (Dist sections included: their defaults are the section's, not Dist's zeros)."""
    defaults = load()
    shown = [line.strip().split("  # ")[0].split(" = ", 1) for line in help_text().splitlines() if " = " in line]
    for key, text in shown:
        assert text == repr(_default(defaults, key)), key
    assert len(shown) > 100
    policy_line = next(line for line in help_text().splitlines() if line.startswith("  policy = "))
    assert f"# server policy: {' | '.join(POLICIES)} | package.module:ClassName" in policy_line


@pytest.mark.parametrize("flag", [["--cfg", "job"], ["--cfg=job"]])
def test_cfg_job_prints_the_resolved_config_and_runs_nothing(flag, capsys, tmp_path):
    import yaml

    from nodes.contracts.schema import to_dict

    overrides = ["scenario=cellular.yaml", "policy=fedcs", "dp.sigma=0.7", f"output.dir={tmp_path}"]
    assert main([*overrides, *flag]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    expected = to_dict(load("cellular.yaml", overrides[1:]))
    assert shown == {k: v for k, v in expected.items() if k not in POLICIES or k == "fedcs"}
    assert shown["dp"]["sigma"] == 0.7 and shown["links"]["server_up_bps"] == 8e6 and "ali_dpfl" not in shown
    assert not any(tmp_path.iterdir())  # nothing ran
    assert main(["dp.sigma=-1", *flag]) == 2 and "dp.sigma" in capsys.readouterr().err
    assert main(["-m", "seed=0,1", *flag]) == 2 and "--cfg job" in capsys.readouterr().err


def _default(defaults, key: str):
    """The default of `key`; `a.b[i].c` is field c of a fresh entry of the list a.b."""
    if "[i]." not in key:
        return reduce(getattr, key.split("."), defaults)
    owner, field = key.split("[i].")
    parent, _, name = owner.rpartition(".")
    section = reduce(getattr, parent.split("."), defaults) if parent else defaults
    return getattr(list_entry_type(get_type_hints(type(section))[name])(), field)


def test_scenario_resolution_and_override_precedence():
    cfg = load("dropout", ["clients.n=7", "seed=3"])
    assert (cfg.name, cfg.clients.n, cfg.seed) == ("dropout", 7, 3)
    assert cfg.links.dropout.model == "gilbert_elliott"  # from the YAML
    assert load("dropout.yaml").clients.n == load(str(SCENARIO_DIR / "dropout.yaml")).clients.n


@pytest.mark.parametrize("path", sorted(SCENARIO_DIR.rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_scenario_validates_and_its_plain_data_is_omegaconfs(path):
    from omegaconf import OmegaConf

    from emulator.config import ServerScenario
    from emulator.config import from_dict as server_from_dict
    from nodes.contracts.schema import Scenario, from_dict, to_dict

    cfg = load(str(path))
    # run.json and the workers' set-up hold to_dict's plain data: OmegaConf's own, value and type
    data = to_dict(cfg)
    assert repr(data) == repr(OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True))
    # and from it the workers rebuild, without OmegaConf, what OmegaConf would (their Scenario and the server's)
    for cls in (Scenario, ServerScenario):
        own = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)}}
        expected = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), OmegaConf.create(own)))
        assert repr(from_dict(data, cls)) == repr(expected)
    assert repr(server_from_dict(data)) == repr(cfg)


def test_a_missing_dataset_offline_is_one_line_saying_where_to_put_it_and_exit_2(tmp_path, capsys):
    code = main(
        [
            "data.dataset=mnist",
            f"data.root={tmp_path / 'nothing'}",
            "data.download=false",
            f"data.cache_dir={tmp_path / 'cache'}",
            f"output.dir={tmp_path / 'runs'}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "mnist" in err and "nothing" in err and "data.root" in err
    assert not (tmp_path / "runs").exists(), "no run directory for a run that never started"


# --- Hydra's override grammar and command line ------------------------------------------------


def test_hydra_override_prefixes_add_and_remove_policy_args_only():
    policy = "policy=tests.unit.test_config:ArgsPolicy"
    assert load(None, [policy, "+policy_args.k=4", "+policy_args.j=1", "~policy_args.j"]).policy_args == {"k": 4}
    assert load(None, ["++dp.sigma=0.7"]).dp.sigma == 0.7  # ++: set, whether there or not
    for item, expected in [
        ("+dp.sigma=0.7", r"^\+dp\.sigma: already set"),
        ("~dp.sigma", r"^~dp\.sigma: only a policy_args key can be removed"),
        ("~policy_args.k", r"^~policy_args\.k: not set"),
        ("dp.sigma=0.5,0.7", r"^dp\.sigma=0\.5,0\.7: a sweep; add --multirun"),
        ("dp.sigma=[0.5", r"^dp\.sigma=\[0\.5: .*Hydra's override grammar"),
    ]:
        with pytest.raises(ConfigError, match=expected):
            load(None, [item])


def test_a_policy_args_key_the_scenario_file_sets_is_removed_by_hydra_and_by_load(tmp_path, capsys):
    import yaml

    scenario = tmp_path / "args.yaml"
    scenario.write_text("policy: tests.unit.test_config:ArgsPolicy\npolicy_args: {k: 3, j: 1}\n")
    assert main([f"scenario={scenario}", "~policy_args.j", "--cfg", "all"]) == 0  # Hydra composes it too
    assert yaml.safe_load(capsys.readouterr().out)["policy_args"] == {"k": 3}


def test_values_are_read_by_hydras_grammar_quoted_or_not(tmp_path):
    cfg = load(None, [f"output.dir='{tmp_path}/a=b,c'", "transport.address=tcp://127.0.0.1:5555", "name=007"])
    assert (cfg.output.dir, cfg.name) == (f"{tmp_path}/a=b,c", "007")
    assert cfg.transport.address == "tcp://127.0.0.1:5555"


def test_a_bracketed_ipv6_address_is_read_as_typed_by_load_and_by_hydras_job(monkeypatch, tmp_path):
    import emulator.run.lifecycle

    typed, quoted = "transport.address=tcp://[::1]:5555", "transport.address='tcp://[::1]:5555'"
    assert load(None, [typed]).transport.address == load(None, [quoted]).transport.address == "tcp://[::1]:5555"
    seen = []
    monkeypatch.setattr(emulator.run.lifecycle, "run", lambda cfg: seen.append(cfg.transport.address) or tmp_path)
    assert main([typed, "+hydra.job.env_set.DPFL_PROBE=yes", f"output.dir={tmp_path}"]) == 0  # Hydra parses it too
    assert seen == ["tcp://[::1]:5555"]
    for item, expected in [
        ("transport.address=tcp://::1:5555", r"^transport\.address = 'tcp://::1:5555': expected .* an IPv6 HOST in br"),
        (
            f"{typed},tcp://[::1]:5556",
            r"Hydra's override grammar; quote a value holding brackets: transport\.address='",
        ),
    ]:
        with pytest.raises(ConfigError, match=expected):
            load(None, [item])


def test_a_sweep_without_multirun_and_a_bad_flag_are_one_line_exit_2(capsys, tmp_path):
    for argv, expected in [
        (["seed=0,1"], "error: seed=0,1: a sweep; add --multirun (-m) to run every value"),
        (["--bogus"], "error: unrecognized arguments: --bogus"),
        (["seed=0", "hydra/launcher=nope"], "hydra/launcher"),
        (["seed=0", "hydra.nope=1"], "error: hydra.nope: unknown key"),
    ]:
        assert main([*argv, f"output.dir={tmp_path}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(expected) or (expected in err and err.startswith("error: ")), err
        assert len(err.splitlines()) == 1, err
    assert not any(tmp_path.iterdir())


def test_a_run_goes_through_hydras_job_only_when_a_hydra_key_is_set(monkeypatch, tmp_path):
    """Without a hydra.* override the run starts at once (Hydra's job would change nothing); with one,
    Hydra's job applies it: here hydra.job.env_set, seen by the run."""
    import emulator.run.lifecycle

    seen: list[tuple[int, str | None]] = []

    def run(cfg):
        seen.append((cfg.clients.n, os.environ.get("DPFL_PROBE")))
        return tmp_path

    monkeypatch.setattr(emulator.run.lifecycle, "run", run)
    monkeypatch.delenv("DPFL_PROBE", raising=False)
    assert main(["clients.n=3", f"output.dir={tmp_path}"]) == 0
    assert main(["clients.n=4", "+hydra.job.env_set.DPFL_PROBE=yes", f"output.dir={tmp_path}"]) == 0
    assert seen == [(3, None), (4, "yes")]


def test_hydra_tab_completes_keys_launchers_policies_and_scenarios(monkeypatch, capsys):
    def complete(line: str) -> list[str]:
        monkeypatch.setenv("COMP_LINE", line)
        monkeypatch.setenv("COMP_POINT", str(len(line)))
        assert main(["-sc", "query=bash"]) == 0
        return capsys.readouterr().out.split()

    assert "dp.sigma=" in complete("dpfl-emulator dp.si")
    assert "links.dropout.p=" in complete("dpfl-emulator links.dropout.")
    assert complete("dpfl-emulator policy=") == sorted(f"policy={p}" for p in POLICIES)
    assert "scenario=dropout" in complete("dpfl-emulator scenario=")
    assert complete("dpfl-emulator scenario=dropout policy=ali_dpfl dp.sig") == ["dp.sigma="]
    assert {"hydra/launcher=joblib", "hydra/launcher=submitit_slurm"} <= set(complete("dpfl-emulator hydra/launcher="))
    assert main(["policy=ali_dpfl", "--cfg", "hydra"]) == 0  # Hydra composes policy as a key again

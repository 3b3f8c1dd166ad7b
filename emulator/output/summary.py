"""The lines printed when a run ends, read back from its own run.json and Parquet tables (never
from the server's memory), so that they say what the run directory holds.

    summarise_run("runs/<id>") -> str
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from emulator.output.results import read_table
from emulator.privacy import ACCOUNTANTS

if TYPE_CHECKING:
    import pyarrow as pa

# The accountants' mechanism tags (Policy.make_accountant): DP-SGD's ledgers, tagged with the
# dp.accountant that reads them (rdp, prv, pld or a user's package.module:ClassName), protect each
# sample; every other tag is output noise on a client's whole upload, which protects the client.
PURE_EPSILON_MECHANISMS = {"fu_laplace"}  # Laplace noise: epsilon-DP with delta = 0


def privacy_kind(manifest: dict[str, Any]) -> str:
    """'sample-level' or 'client-level', from the accountant's tag in run.json; a run recorded
    before the tag was stored falls back to whether its policy declares its own accountant."""
    mechanism = manifest.get("privacy_mechanism")
    if mechanism is None:
        from emulator.policies import POLICIES
        from emulator.policies.base import Policy

        policy = POLICIES.get(manifest.get("scenario", {}).get("policy"))
        own = policy is not None and policy.make_accountant is not Policy.make_accountant
        return "client-level" if own else "sample-level"
    return "sample-level" if ACCOUNTANTS.admits(mechanism) else "client-level"


def privacy_label(manifest: dict[str, Any]) -> str:
    """What a run's epsilon is: its privacy unit and the accountant behind it (a sampled population's
    also says its dp.accountant and whether its amplification by sampling holds)."""
    kind, mechanism = privacy_kind(manifest), manifest.get("privacy_mechanism")
    population = _population(manifest)
    fallback = _fallbacks(manifest)
    if not mechanism:
        return kind
    if not population:
        return ", ".join([kind, mechanism, *fallback])
    caveats = [
        *([] if population["amplification_valid"] else ["amplification does not hold"]),
        *([] if population["noise_complete"] else ["noise short in some rounds"]),
    ]
    return ", ".join([kind, mechanism, population["accountant"], *caveats, *fallback])


def _fallbacks(manifest: dict[str, Any]) -> list[str]:
    """Where a numerical accountant reported RDP's epsilon instead of its own (run.json's privacy_fallback)."""
    return [f"RDP's ε where {m} fell back: {why}" for m, why in manifest.get("privacy_fallback", {}).items()]


def _population(manifest: dict[str, Any]) -> dict[str, Any]:
    """run.json's privacy.population (PopulationAccountant.summary), {} for a run without one."""
    population: dict[str, Any] = manifest.get("privacy", {}).get("population") or {}
    return population


def privacy_delta(manifest: dict[str, Any]) -> float:
    """The delta the run's epsilons are stated at."""
    if manifest.get("privacy_mechanism") in PURE_EPSILON_MECHANISMS:
        return 0.0
    return float(manifest.get("scenario", {}).get("dp", {}).get("delta", math.nan))


def _column(table: pa.Table, name: str) -> np.ndarray:
    column: np.ndarray = table[name].to_numpy(zero_copy_only=False).astype(float)
    return column


def _energy_line(client_rounds: pa.Table, radio: str) -> str:
    """The clients' joules over the run, by what drew them (emulator.energy)."""
    parts = {k: float(np.nansum(_column(client_rounds, f"energy_{k}_j"))) for k in ("radio_down", "radio_up", "tail")}
    compute = float(np.nansum(_column(client_rounds, "energy_compute_j")))
    total = sum(parts.values()) + compute
    return (
        f"{total:.1f} J over {client_rounds.num_rows} tasks ({radio} radio: {parts['radio_down']:.1f} J down, "
        f"{parts['radio_up']:.1f} J up, {parts['tail']:.1f} J tail; compute {compute:.1f} J)"
    )


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def _command(*words: str) -> str:
    return " ".join(shlex.quote(w) for w in words)


def summarise_run(run_dir: Path | str) -> str:
    """Stop reason, rounds, accuracy, privacy, virtual time, traffic, update outcomes, workers, the
    bundles' K, and the command to run next (the analysis, or `resume` for a run that did not complete)."""
    run_dir = Path(run_dir)
    manifest = json.loads((run_dir / "run.json").read_text())
    scenario = manifest.get("scenario", {})
    rounds = read_table(run_dir, "rounds").sort_by("round")
    status = manifest.get("status", "unknown")
    n = rounds.num_rows

    lines = [
        (
            "run",
            f"{run_dir} ({scenario.get('name', '?')}, policy {scenario.get('policy', '?')}, "
            f"seed {manifest.get('seed', '?')})",
        )
    ]
    why = manifest.get("stop_reason") or manifest.get("error") or ""
    lines.append(("status", f"{status}: {why}" if why else status))
    lines.append(("rounds", f"{n} completed, {manifest.get('virtual_time_s', math.nan):.2f} s of virtual time"))
    if n:
        lines.append(("accuracy", _accuracy_line(rounds)))
        lines.append(("privacy", _privacy_line(manifest, scenario, np.nanmax(_column(rounds, "max_epsilon")))))
        if _population(manifest):
            lines.append(("sampling", _sampling_line(_population(manifest))))
        down, up = _column(rounds, "bytes_down").sum(), _column(rounds, "bytes_up").sum()
        lines.append(("traffic", f"{_mb(down + up)} ({_mb(down)} down, {_mb(up)} up)"))
        if scenario.get("energy", {}).get("radio", "none") != "none":
            lines.append(("energy", _energy_line(read_table(run_dir, "client_rounds"), scenario["energy"]["radio"])))
        counts = {k: int(_column(rounds, k).sum()) for k in ("selected", "arrived", "late", "lost", "failed")}
        lines.append(
            (
                "updates",
                f"{counts['arrived']} on time, {counts['late']} late, {counts['lost']} lost, "
                f"{counts['failed']} failed, of {counts['selected']} sent",
            )
        )
    local, remote = manifest.get("workers", {}), manifest.get("remote_workers", {})
    on_ray = manifest.get("ray_workers", {})  # transport.launcher=ray: name -> its node and pid
    lines.append(
        (
            "workers",
            f"{len(local)} started here"
            + (f", {len(on_ray)} by Ray on {', '.join(sorted({w['node'] for w in on_ray.values()}))}" if on_ray else "")
            + (f", {len(remote)} joined: {', '.join(remote)}" if remote else ""),
        )
    )
    chosen, k = manifest.get("bundle"), str(scenario.get("train", {}).get("bundle", 1))
    if chosen:  # train.bundle = auto
        lines.append(("bundles", f"K = {chosen['chosen']} (train.bundle=auto: {chosen['why']})"))
    elif k != "1":
        lines.append(("bundles", f"K = {k} (train.bundle)"))
    devices = manifest.get("devices", {})
    if devices.get("gpus"):
        lines.append(("gpus", _gpu_line(devices)))
    if status == "complete":
        lines.append(("next", _command("python", "-m", "analysis", str(run_dir))))
    else:
        lines.append(("resume", _command("python", "-m", "emulator", "resume", str(run_dir))))
    width = max(len(label) for label, _ in lines)
    return "\n".join(f"{label:<{width}}  {text}" for label, text in lines)


def _gpu_line(devices: dict[str, Any]) -> str:
    """Each GPU the run used (run.json's devices), by name, with what trained on it."""
    parts = []
    for gpu in devices["gpus"]:
        here = f"cuda:{gpu['index']}"
        workers = sum(w == here for w in devices["workers"])
        who = [f"{workers} worker{'s' if workers != 1 else ''}"] if workers else []
        who += ["the evaluator"] if devices["evaluator"] == here else []
        parts.append(f"GPU {gpu['index']} ({gpu['name']}): {' and '.join(who)}")
    mixed = f" (not deterministic: {devices['not_deterministic']})" if "not_deterministic" in devices else ""
    return "; ".join(parts) + mixed


def _accuracy_line(rounds: pa.Table) -> str:
    """Final and best over the evaluated rounds (with eval.every > 1 the others are NaN); the final
    round is always evaluated, so an earlier 'final' is named: a run that has not ended."""
    acc, numbers = _column(rounds, "test_accuracy"), rounds["round"].to_pylist()
    evaluated = np.flatnonzero(~np.isnan(acc))
    if not evaluated.size:
        return "no round evaluated yet"
    last, best = evaluated[-1], evaluated[np.argmax(acc[evaluated])]
    final = f"final {acc[last]:.4f}" + ("" if last == len(acc) - 1 else f" (round {numbers[last]})")
    return f"{final}, best {acc[best]:.4f} (round {numbers[best]})"


def _privacy_line(manifest: dict[str, Any], scenario: dict[str, Any], max_epsilon: float) -> str:
    kind = privacy_kind(manifest)
    mechanism = manifest.get("privacy_mechanism")
    noise = "noise on the clipped updates' sum" if _population(manifest) else "output noise"
    how = ", ".join(
        [("DP-SGD" if kind == "sample-level" else noise), *([mechanism] if mechanism else []), *_fallbacks(manifest)]
    )
    budget = float(scenario.get("dp", {}).get("epsilon", math.inf))
    limit = f" (budget ε = {budget:g})" if math.isfinite(budget) else " (no ε budget)"
    return f"{kind} ({how}): max ε over clients = {max_epsilon:.4g} at δ = {privacy_delta(manifest):g}{limit}"


def _sampling_line(population: dict[str, Any]) -> str:
    """The two epsilons of a sampled population: with amplification by sampling (the privacy line's),
    whether it holds and why not, and without it."""
    holds = (
        "holds" if population["amplification_valid"] else f"does NOT hold: {population['amplification_invalid_reason']}"
    )
    line = (
        f"ε = {population['epsilon_amplified']:.4g} with amplification by sampling ({population['sampling']}, "
        f"q = {population['q']:g}, {population['accountant']}): {holds}; ε = "
        f"{population['epsilon_unamplified_max']:.4g} without it (the rounds each client trained in, largest)"
    )
    return line + (f"; {population['noise_short_reason']}" if population["noise_short_reason"] else "")

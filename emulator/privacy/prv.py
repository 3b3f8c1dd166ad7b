"""The prv accountant: Opacus's `PRVAccountant.get_epsilon` (Gopi et al. 2021, "Numerical composition
of differential privacy"): the privacy random variables discretised and composed by FFT; its upper bound
eps_upper at Opacus's default eps_error 0.01, delta_error delta/1000 (from the analysis' files, as for
RDP: `_opacus_prv`).
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import numpy as np

from emulator.privacy.base import Runs
from emulator.privacy.numerical import NumericalTheorem
from emulator.privacy.rdp import DEFAULT_ORDERS, _epsilon_of, _opacus_rdp
from nodes.contracts.schema import Conversion


@cache
def _opacus_prv() -> ModuleType:
    """opacus/accountants/analysis/prv, executed from its files as `_opacus_rdp` is, so that
    dp.accountant=prv keeps the server free of torch too: a package of its own, whose `..rdp` is
    `_opacus_rdp`'s module and whose `...rdp` (Opacus's RDPAccountant, which only its
    compute_safe_domain_size uses; `_prv_epsilon` sizes the domain itself) is a stand-in. Another
    layout of Opacus's files: the ordinary import (which imports torch)."""
    try:
        return _prv_from_files()
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == _PRV_ROOT]:
            del sys.modules[name]
        import opacus.accountants.analysis.prv as prv

        imported: ModuleType = prv
        return imported


_PRV_ROOT = "dpfl_opacus"


def _prv_from_files() -> ModuleType:
    package = importlib.util.find_spec("opacus")
    if package is None or package.origin is None:
        raise ImportError("opacus is not installed (pip install opacus)")
    here = Path(package.origin).parent / "accountants" / "analysis" / "prv"
    for name in (_PRV_ROOT, f"{_PRV_ROOT}.accountants", f"{_PRV_ROOT}.accountants.analysis"):
        parent = ModuleType(name)
        parent.__path__ = []  # a package with no files: only what is set here
        sys.modules[name] = parent
    sys.modules[f"{_PRV_ROOT}.accountants.analysis.rdp"] = _opacus_rdp()
    stand_in = ModuleType(f"{_PRV_ROOT}.accountants.rdp")
    setattr(stand_in, "RDPAccountant", None)  # noqa: B010  # domain.py's import; never called here
    sys.modules[stand_in.__name__] = stand_in
    name = f"{_PRV_ROOT}.accountants.analysis.prv"
    spec = importlib.util.spec_from_file_location(name, here / "__init__.py", submodule_search_locations=[str(here)])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load Opacus's PRV analysis from {here}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# PRV (Opacus PRVAccountant.get_epsilon's defaults, passed explicitly so that the tests' call of the
# library is the same question): |eps_upper - eps| <= eps_error; delta_error = delta / 1000.
PRV_EPS_ERROR = 0.01
PRV_DELTA_ERROR_FRACTION = 1e-3


# Opacus discretises each PRV on 2 L / mesh points (L: RDP's epsilon at delta_error / 4, + 3; mesh:
# eps_error / sqrt(steps ln(12 / delta_error) / 2)), which also grows with the steps; past this many
# (a grid that takes memory and seconds) RDP's epsilon, as above. 14,063 steps at eps 2.4: 5 * 10^5;
# 10^6 steps at q = 0.001, sigma = 1 (eps 6) are past it: pld's grid does not grow with the steps.
PRV_MAX_POINTS = 2**22


def _prv_epsilon(entries: tuple[tuple[float, float, int], ...], delta: float) -> float | None:
    """Opacus PRVAccountant.get_epsilon(delta, eps_error=PRV_EPS_ERROR) of the runs (Gopi et al. 2021,
    PRV), step for step from the library's public parts, with two differences that change no bit:
    the RDP epsilons that size its domain (Remark 5.6, as Opacus's compute_safe_domain_size computes
    them) come from this module's cache, which equals RDPAccountant.get_epsilon bit for bit (most of
    Opacus's time: the fractional orders), and the domain is sized before anything is allocated: None
    past PRV_MAX_POINTS. A test holds the result to PRVAccountant's own."""
    prv = _opacus_prv()
    delta_error = delta * PRV_DELTA_ERROR_FRACTION
    counts = [n for _, _, n in entries]
    total = sum(counts)
    # compute_safe_domain_size: RDP's epsilon of the whole history at delta_error / 4, and of one step
    # of each run at delta_error / (8 * total), the largest, then max(., eps_error) + 3
    half_width = _epsilon_of(entries, tuple(DEFAULT_ORDERS), delta_error / 4, Conversion.IMPROVED.value)
    for q, sigma, _ in entries:
        one = _epsilon_of(((q, sigma, 1),), tuple(DEFAULT_ORDERS), delta_error / (8 * total), Conversion.IMPROVED.value)
        half_width = max(half_width, one)
    half_width = max(half_width, PRV_EPS_ERROR) + 3
    # PRVAccountant._get_domain
    mesh_size = PRV_EPS_ERROR / np.sqrt(total * np.log(12 / delta_error) / 2)
    domain = prv.Domain.create_aligned(-half_width, half_width, mesh_size)
    if domain.size > PRV_MAX_POINTS:
        return None
    # PRVAccountant._get_dprv and get_epsilon
    with np.errstate(divide="ignore"):  # q = 1: log(1 - q) in PoissonSubsampledGaussianPRV, harmless
        rvs = [prv.PoissonSubsampledGaussianPRV(q, sigma) for q, sigma, _ in entries]
        truncated = [prv.TruncatedPrivacyRandomVariable(rv, domain.t_min, domain.t_max) for rv in rvs]
        dprvs = [prv.discretize(t, domain) for t in truncated]
        dprv = prv.compose_heterogeneous(dprvs=dprvs, num_self_compositions=counts)
        _, _, eps_upper = dprv.compute_epsilon(delta, delta_error, PRV_EPS_ERROR)
    return float(eps_upper)


# PRV sizes its domain by the whole history, so each question discretises and composes every distinct run again: the
# seconds of each, as python -m bench.accountants --histories measures them on a 2-core machine (bench/README.md).
PRV_SECONDS_PER_RUN = 0.035


class PrvTheorem(NumericalTheorem):
    """dp.accountant=prv: Opacus's PRVAccountant.get_epsilon(delta, eps_error=PRV_EPS_ERROR)."""

    name = "prv"
    max_runs = 100  # a question there: max_runs * PRV_SECONDS_PER_RUN

    @staticmethod
    def question_seconds(runs: int) -> float:
        return PRV_SECONDS_PER_RUN * runs

    @staticmethod
    def grid_epsilon(runs: Runs, delta: float) -> float | None:
        return _prv_epsilon(runs, delta)

"""Output perturbation: the classic Gaussian mechanism's constant; each paper's calibration lives with
its policy (Fu et al. Thm 1-2 in fu_tuning, Wei et al. eq. 10 and 25 in udp_crd, Talaei & Izadi eq. 8
and 13 in padpfl).
"""

from __future__ import annotations

import math

from emulator.privacy.base import check_delta


def check_epsilon(eps: float) -> float:
    eps = float(eps)
    if not eps > 0.0:
        raise ValueError(f"epsilon must be > 0, got {eps}")
    return eps


def gaussian_c(delta: float) -> float:
    """c = sqrt(2 ln(1.25/delta)), the classic Gaussian-mechanism constant (Dwork & Roth
    Thm A.1; quoted in Talaei & Izadi §II and used in their eq. 8 and 13)."""
    return math.sqrt(2.0 * math.log(1.25 / check_delta(delta)))

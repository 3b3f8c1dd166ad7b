"""A user's accountant, `dp.accountant=tests.plugins.accountant:UnamplifiedZcdp`, whose epsilon is
exactly computable; and classes that break the contract, for the errors."""

import math

from emulator.privacy import EpsilonTheorem


def zcdp_epsilon(runs, delta):
    """Each step the Gaussian mechanism at noise multiplier sigma, its sampling ignored: rho = 1 / (2 sigma^2)
    zCDP, composed by adding rho, and rho-zCDP is (rho + 2 sqrt(rho ln(1/delta)), delta)-DP (Bun & Steinke
    2016, Prop. 1.3). An upper bound, far above RDP's with amplification: a value no built-in gives."""
    rho = sum(steps / (2 * sigma**2) for _, sigma, steps in runs)
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


class UnamplifiedZcdp(EpsilonTheorem):
    """Only `epsilon` written: `max_steps` is the base class's search over it."""

    def epsilon(self, runs, delta):
        return zcdp_epsilon(runs, delta)


class NotATheorem:
    def epsilon(self, runs, delta):
        return 0.0


class ReturnsNan(EpsilonTheorem):
    def epsilon(self, runs, delta):
        return math.nan


class Raises(EpsilonTheorem):
    def epsilon(self, runs, delta):
        raise ZeroDivisionError("no bound\nsecond line")


class NoEpsilon(EpsilonTheorem):
    pass

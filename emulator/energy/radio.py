"""The radios' power models: while a transfer is in flight the radio draws P = alpha_up * t_up +
alpha_down * t_down + beta (t in Mbit/s, the throughput of each direction), and after the last one it
stays in a tail state, drawing `tail_w` for `tail_s` unless a new transfer starts first (Huang et al.,
MobiSys 2012, the LTE power model; its coefficients, and where each comes from, in docs/energy.md).

A transfer of b bits over T seconds therefore costs beta * T + alpha * b / 10^6 joules, whatever its
throughput did within T: the energy follows from the bits and times that the clock already computes.
Adding a radio is one entry in RADIOS.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodes.contracts.schema import Radio


@dataclass(frozen=True)
class RadioPower:
    """One radio technology's power model.

    Attributes:
        alpha_up_w: watts per Mbit/s of upload throughput.
        alpha_down_w: watts per Mbit/s of download throughput.
        beta_w: watts while a transfer is in flight, whatever its throughput.
        tail_w: watts in the tail state after a transfer.
        tail_s: seconds the tail lasts when no transfer starts within it.
    """

    alpha_up_w: float
    alpha_down_w: float
    beta_w: float
    tail_w: float
    tail_s: float

    def transfer_j(self, direction: str, seconds: float, bits: float) -> float:
        """Joules of a transfer in `direction` ("down" | "up") that moved `bits` over `seconds`.

        Args:
            direction: "down" or "up".
            seconds: from its start (latency included) to its end or cut.
            bits: the bits that crossed the link in that time.

        Returns:
            beta * seconds + alpha * bits / 10^6.
        """
        alpha = self.alpha_down_w if direction == "down" else self.alpha_up_w
        return self.beta_w * seconds + alpha * bits / 1e6

    def tail_j(self, idle_s: float) -> float:
        """Joules of the tail after a transfer when the next one starts `idle_s` later (inf: none does)."""
        return self.tail_w * min(self.tail_s, idle_s)


# Huang et al. 2012: LTE, Table 4 (alpha, beta) and Table 3 (the tail); WiFi, Table 4, with no tail state.
RADIOS: dict[str, RadioPower] = {
    Radio.LTE: RadioPower(alpha_up_w=0.43839, alpha_down_w=0.05197, beta_w=1.28804, tail_w=1.060, tail_s=11.576),
    Radio.WIFI: RadioPower(alpha_up_w=0.28317, alpha_down_w=0.13701, beta_w=0.13286, tail_w=0.0, tail_s=0.0),
}

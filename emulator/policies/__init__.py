"""Server policies: one small class each, registered by name."""
from emulator.policies.accounting import Accountant  # noqa: F401
from emulator.policies.adap_dpfl import AdapDpfl
from emulator.policies.ali_dpfl import AliDpfl
from emulator.policies.base import (  # noqa: F401
    ClientResult,
    ClientTask,
    Policy,
    RoundPlan,
    RunContext,
)
from emulator.policies.fedavg_dp import FedAvgDP
from emulator.policies.fedcs import FedCS
from emulator.policies.fu_tuning import FuTuning
from emulator.policies.oort import Oort
from emulator.policies.padpfl import Padpfl
from emulator.policies.system import ClientInfo, ClientOutcome, OutcomeLog  # noqa: F401
from emulator.policies.udp_crd import UdpCrd

POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (FedAvgDP, AliDpfl, AdapDpfl, FuTuning, Padpfl, UdpCrd, FedCS, Oort)}

"""Server policies: one small class each, registered by name."""

from emulator.policies.accounting import Accountant
from emulator.policies.adap_dpfl import AdapDpfl
from emulator.policies.ali_dpfl import AliDpfl
from emulator.policies.base import Policy, RoundPlan, RunContext, dp_sgd_tasks
from emulator.policies.fedavg_dp import FedAvgDP
from emulator.policies.fedcs import FedCS
from emulator.policies.fu_tuning import FuTuning
from emulator.policies.oort import Oort
from emulator.policies.options import PolicyLoadError, is_user_policy
from emulator.policies.padpfl import Padpfl
from emulator.policies.system import ClientInfo, ClientOutcome, OutcomeLog
from emulator.policies.udp_crd import UdpCrd
from emulator.policies.user import load_policy
from nodes.tasks import ClientResult, ClientTask

__all__ = [
    "POLICIES",
    "Accountant",
    "AdapDpfl",
    "AliDpfl",
    "ClientInfo",
    "ClientOutcome",
    "ClientResult",
    "ClientTask",
    "FedAvgDP",
    "FedCS",
    "FuTuning",
    "Oort",
    "OutcomeLog",
    "Padpfl",
    "Policy",
    "PolicyLoadError",
    "RoundPlan",
    "RunContext",
    "UdpCrd",
    "dp_sgd_tasks",
    "is_user_policy",
    "load_policy",
    "policy_class",
]

POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (FedAvgDP, AliDpfl, AdapDpfl, FuTuning, Padpfl, UdpCrd, FedCS, Oort)
}


def policy_class(name: str) -> type[Policy]:
    """A built-in policy by name, or a user's Policy subclass by package.module:ClassName."""
    return load_policy(name) if is_user_policy(name) else POLICIES[name]

"""Server policies: one small class each, registered by name."""

import importlib

from emulator.policies.accounting import Accountant
from emulator.policies.base import Policy, RoundPlan, RunContext, dp_sgd_tasks
from emulator.policies.options import PolicyLoadError, is_user_policy
from emulator.policies.system import ClientInfo, ClientOutcome, OutcomeLog
from emulator.policies.user import load_policy
from nodes.contracts.tasks import ClientResult, ClientTask

__all__ = [
    "POLICIES",
    "Accountant",
    "ClientInfo",
    "ClientOutcome",
    "ClientResult",
    "ClientTask",
    "OutcomeLog",
    "Policy",
    "PolicyLoadError",
    "RoundPlan",
    "RunContext",
    "dp_sgd_tasks",
    "is_user_policy",
    "load_policy",
    "policy_class",
]

# The registry: one line per built-in policy, `module:Class` under emulator/policies/. A new
# policy is its own file plus one line here; the order is the order `--help` lists them in.
BUILT_IN = (
    "fedavg_dp:FedAvgDP",
    "ali_dpfl:AliDpfl",
    "adap_dpfl:AdapDpfl",
    "fu_tuning:FuTuning",
    "padpfl:Padpfl",
    "udp_crd:UdpCrd",
    "fedcs:FedCS",
    "oort:Oort",
    "dp_fedavg:DpFedAvg",
)


def _built_in(entry: str) -> type[Policy]:
    module, _, name = entry.partition(":")
    cls: type[Policy] = getattr(importlib.import_module(f"emulator.policies.{module}"), name)
    return cls


POLICIES: dict[str, type[Policy]] = {p.name: p for p in map(_built_in, BUILT_IN)}


def policy_class(name: str) -> type[Policy]:
    """A built-in policy by name, or a user's Policy subclass by package.module:ClassName."""
    return load_policy(name) if is_user_policy(name) else POLICIES[name]

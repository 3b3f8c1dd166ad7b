"""Server policies: one small class each, registered by name."""
from emulator.policies.base import ClientResult, ClientTask, Policy, RoundPlan, RunContext  # noqa: F401
from emulator.policies.fedavg_dp import FedAvgDP

POLICIES: dict[str, type[Policy]] = {
    FedAvgDP.name: FedAvgDP,
}

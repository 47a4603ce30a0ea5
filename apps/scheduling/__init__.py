"""Pure scheduling core: dataclasses in, decisions out.

No Django, no I/O: the same code runs inside the console's scheduler pass and the trace simulator.
Entry point: `apps.scheduling.policy.schedule(snapshot, config=None) -> Decisions`.
"""

from apps.scheduling.config import PolicyConfig
from apps.scheduling.prediction import FinishedRun, RuntimeHistory
from apps.scheduling.types import (
    Decisions,
    GpuView,
    HostView,
    PendingInfo,
    PendingJob,
    Placement,
    Preemption,
    Priority,
    RunningJob,
    Snapshot,
    TeamQuotaView,
)

__all__ = [
    "Decisions",
    "FinishedRun",
    "PolicyConfig",
    "RuntimeHistory",
    "GpuView",
    "HostView",
    "PendingInfo",
    "PendingJob",
    "Placement",
    "Preemption",
    "Priority",
    "RunningJob",
    "Snapshot",
    "TeamQuotaView",
]

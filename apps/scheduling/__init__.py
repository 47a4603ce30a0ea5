"""Pure scheduling core: dataclasses in, decisions out.

No Django, no I/O: the same code runs inside the console's scheduler pass and the trace simulator.
"""

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

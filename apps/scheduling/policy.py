"""The entry point the console and the simulator call."""

from __future__ import annotations

from apps.scheduling.fcfs import schedule_fcfs
from apps.scheduling.types import Decisions, Snapshot


def schedule(snapshot: Snapshot) -> Decisions:
    return schedule_fcfs(snapshot)

"""The entry point the console and the simulator call."""

from __future__ import annotations

from dataclasses import replace

from apps.scheduling.config import PolicyConfig
from apps.scheduling.fcfs import schedule_fcfs
from apps.scheduling.scheduler import schedule_console
from apps.scheduling.types import Decisions, Snapshot

POLICIES = ("console", "fifo", "fifo-backfill", "fair-share")


def fifo_backfill_config(config: PolicyConfig) -> PolicyConfig:
    """FIFO within priority, one reservation and backfill; no shortest-first, no fair share, no SRPT preemption."""
    return replace(config, ordering="fifo", srpt_preemption=False, fair_share_weight=0.0, backfill=True)


def fair_share_config(config: PolicyConfig) -> PolicyConfig:
    """Order by fair share (with aging) alone; quotas, priorities, reservation and backfill as in the console."""
    return replace(config, ordering="fair-share", srpt_preemption=False)


def schedule(snapshot: Snapshot, config: PolicyConfig | None = None) -> Decisions:
    """Decide placements, preemptions and explanations for one snapshot. Deterministic for a given snapshot."""
    config = config or PolicyConfig()
    if config.policy == "fifo":
        return schedule_fcfs(snapshot)
    if config.policy == "fifo-backfill":
        return schedule_console(snapshot, fifo_backfill_config(config))
    if config.policy == "fair-share":
        return schedule_console(snapshot, fair_share_config(config))
    if config.policy == "console":
        return schedule_console(snapshot, config)
    raise ValueError(f"unknown scheduling policy {config.policy!r}; expected one of {', '.join(POLICIES)}")

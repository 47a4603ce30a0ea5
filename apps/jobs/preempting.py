"""Preemptions of a scheduler pass, each re-checked just before it is sent.

A pass decides on a snapshot; by the time it sends a preemption, GPUs may have come free elsewhere (a job ended,
a host came back). The core (apps.scheduling.preemption.still_needed) is asked again on a fresh snapshot, once
per waiting job the preemptions make room for: if that job can now start without them, they are not sent, and
neither is its placement on the victims' GPUs; the next pass places it on the free ones.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from apps.jobs import services
from apps.scheduling.config import PolicyConfig
from apps.scheduling.preemption import still_needed
from apps.scheduling.types import Decisions, Snapshot

logger = logging.getLogger(__name__)


def send_preemptions(
    decisions: Decisions, config: PolicyConfig, snapshot_now: Callable[[], Snapshot]
) -> tuple[int, set[int]]:
    """Send the pass's preemptions that are still needed. Returns (how many were sent, the waiting jobs whose
    preemptions were dropped: their placements of this pass are to be dropped too)."""
    beneficiaries = {p.for_job for p in decisions.preemptions if p.for_job is not None}
    dropped: set[int] = set()
    if beneficiaries:
        fresh = snapshot_now()
        for job_id in beneficiaries:
            promised = [g for placement in decisions.placements if placement.job_id != job_id
                        for g in placement.gpu_ids]
            if not still_needed(fresh, job_id, promised, config):
                dropped.add(job_id)
    sent = 0
    for preemption in decisions.preemptions:
        if preemption.for_job in dropped:
            logger.info("preemption of job %s not sent: job %s can start without it now", preemption.job_id,
                        preemption.for_job)
            continue
        sent += services.job_preempt(preemption.job_id, preemption.reason, move=preemption.moved)
    return sent, dropped

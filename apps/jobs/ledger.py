"""The ledger check: held GPUs are exactly those of placed and running jobs, repaired where a crash left drift."""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Count, Q
from django.db.models import F as models_F
from django.utils import timezone

from apps.jobs.lifecycle import finish, lock_job
from apps.jobs.models import Job, JobAllocation, UsageSegment

logger = logging.getLogger(__name__)
State = Job.State


def ledger_reconcile() -> dict[str, int]:
    """Check (and repair) that held GPUs are exactly those of placed and running jobs.

    Usage is always derived from job records, so a team's GPUs held is the sum over its placed and running jobs by
    construction; what can drift after a crash is the allocation and ledger rows beside them. Anything found is
    repaired here and returned; the reaper (apps.operations.reapers) reports it as an alert.
    """
    now = timezone.now()
    found = {"stray_allocations": 0, "open_segments": 0, "jobs_without_gpus": 0}
    with transaction.atomic():
        stray = JobAllocation.objects.filter(released_at__isnull=True).exclude(job__state__in=Job.HOLDING_STATES)
        found["stray_allocations"] = stray.update(released_at=now)
        segments = UsageSegment.objects.filter(ended_at__isnull=True).exclude(job__state__in=Job.HOLDING_STATES)
        found["open_segments"] = segments.update(ended_at=now)
    short = (Job.objects.filter(state__in=Job.HOLDING_STATES)
             .annotate(held=Count("allocations", filter=Q(allocations__released_at__isnull=True)))
             .exclude(held=models_F("gpus")).values_list("pk", flat=True))
    for job_id in list(short):
        with transaction.atomic():
            job = lock_job(job_id)
            if job is not None and job.state in Job.HOLDING_STATES:
                finish(job, State.FAILED, "its GPU allocation was lost (repaired by the ledger check)", now,
                       exit_code=None)
                found["jobs_without_gpus"] += 1
    if any(found.values()):
        logger.warning("ledger check repaired: %s", found)
    return found

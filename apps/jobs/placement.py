"""Placement: a queued job gets its GPUs under the quota's and the GPUs' row locks; the pass's notes on waiting jobs."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from apps.cluster.models import GPU
from apps.jobs import scheduling_rows
from apps.jobs.dispatch import dispatch_job
from apps.jobs.lifecycle import transition
from apps.jobs.models import Job, JobAllocation, UsageSegment
from apps.jobs.usage import budget_exhausted, units_held
from apps.quotas.models import UserQuota
from apps.quotas.services import quota_lock
from apps.scheduling.placeability import placement_refusal

logger = logging.getLogger(__name__)
State = Job.State


def job_place(
    job_id: int,
    gpu_ids: tuple[int, ...],
    *,
    reason: str = "placed by the scheduler",
    borrowing: bool = False,
    share_units: int | None = None,
) -> bool:
    """Give a queued job its GPUs, atomically. False (and nothing changed) if anything no longer holds.

    Within quota, a team's own borrowers do not count against it; a borrowing placement needs a team that may
    borrow, and runs as preemptible capacity beyond the quota.
    """
    try:
        with transaction.atomic():
            job = Job.objects.select_related("team").filter(pk=job_id).first()
            if job is None or job.state != State.QUEUED or len(gpu_ids) != job.gpus:
                return False
            quota = quota_lock(job.team)
            # Locked with its team and user, which the placement rule's view of the job names (one query).
            job = Job.objects.select_for_update(of=("self",)).select_related("team", "user").filter(pk=job_id).first()
            if job is None or job.state != State.QUEUED:
                return False
            if budget_exhausted(job.team, quota):  # (spent since the pass's snapshot: the core's rule, re-read)
                return False
            share = 100 if not job.is_fractional else (share_units or job.gpu_share_units)
            if not 1 <= share <= 100:
                return False
            units = job.gpus * share
            if borrowing:
                if not quota.may_borrow:
                    return False
            elif units_held(job.team, guaranteed_only=True) + units > quota.max_gpus * 100:
                return False
            user_cap = UserQuota.objects.filter(team=job.team, user_id=job.user_id).values_list("max_gpus", flat=True)
            if user_cap and units_held(job.team, user=job.user) + units > user_cap[0] * 100:
                return False
            gpus = list(GPU.objects.select_for_update().filter(pk__in=gpu_ids).select_related("host").order_by("pk"))
            if len(gpus) != len(gpu_ids):
                return False
            # Under the GPUs' row locks: the core's rule (health, host, type, units left, memory) on fresh rows.
            taken = dict(
                JobAllocation.objects.filter(gpu_id__in=gpu_ids, released_at__isnull=True)
                .values_list("gpu_id").annotate(units=Sum("share_units"))
            )
            refusal = placement_refusal(scheduling_rows.pending_job(job, time.time()),
                                        [scheduling_rows.candidate(gpu, taken.get(gpu.pk, 0)) for gpu in gpus], share)
            if refusal is not None:
                logger.info("placement of job %s on GPUs %s refused: %s", job_id, gpu_ids, refusal)
                return False
            now = timezone.now()
            where = ", ".join(f"{gpu.host.name}:{gpu.index}" for gpu in gpus)
            if share < 100:
                where += f" ({share}% of the GPU, shared)"
            if borrowing:
                where += " (borrowing idle GPUs beyond the team's quota; preemptible)"
            if not transition(
                job,
                State.PLACED,
                f"{reason} on {where}",
                at=now,
                placed_at=now,
                pending_reason="",
                queue_position=None,
                estimated_start=None,
                estimate_confidence=None,
                attempts=job.attempts + 1,
                borrowing=borrowing,
                data={"gpus": [gpu.uuid for gpu in gpus]},
            ):
                return False
            JobAllocation.objects.bulk_create([JobAllocation(job=job, gpu=gpu, share_units=share, attempt=job.attempts)
                                               for gpu in gpus])
            Job.objects.filter(pk=job.pk).update(node_results={})
            UsageSegment.objects.create(job=job, team=job.team, user_id=job.user_id, gpus=job.gpus,
                                        share_units=share, started_at=now)
            if share != job.gpu_share_units:
                Job.objects.filter(pk=job.pk).update(gpu_share_units=share)
            transaction.on_commit(lambda: dispatch_job(job.pk))
            return True
    except IntegrityError:
        # Another pass took one of these GPUs between our check and insert: the constraint held the line.
        logger.info("placement of job %s lost a race for GPUs %s", job_id, gpu_ids)
        return False


def jobs_set_pending_info(infos: dict[int, tuple[str, int | None, Any, float | None]]) -> int:
    """Store each waiting job's (reason, position, estimated start, its confidence); writes only rows that changed.

    Each pass changes the rows of every job submitted since the last one (a hundred a second under load). One
    statement run for all of them (executemany: a single pipeline on PostgreSQL) took a twentieth of the time
    of an ORM update per row, and a tenth of bulk_update's CASE. Only jobs still queued are written: one placed
    or cancelled meanwhile keeps its own.
    """
    if not infos:
        return 0
    changed = [
        (new[0][:300], new[1], new[2], new[3], pk)
        for pk, *current in Job.objects.filter(state=State.QUEUED).values_list(
            "pk", "pending_reason", "queue_position", "estimated_start", "estimate_confidence")
        if (new := infos.get(pk)) is not None and tuple(current) != new
    ]
    if changed:
        with connection.cursor() as cursor:
            cursor.executemany(
                f"UPDATE {Job._meta.db_table} SET pending_reason = %s, queue_position = %s, estimated_start = %s,"
                f" estimate_confidence = %s WHERE id = %s AND state = '{State.QUEUED}'", changed)
    return len(changed)

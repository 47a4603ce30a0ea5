"""The packing pass (measured-utilization packing of shareable jobs), where jobs meet telemetry.

Every scheduler interval: pairings that are over end (the one left holds its whole GPU again), pairs measured to
hurt are split, and shareable jobs the scheduler left waiting join shareable jobs that leave their GPU mostly
idle. What is measured comes from telemetry (each GPU's 10-second buckets while the job ran there alone) and from
the job's progress records (step times, wait on data); the decisions are apps.scheduling.colocation's, the
changes apps.jobs.colocating's.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from apps.jobs import colocating
from apps.jobs.models import Job, JobAllocation
from apps.scheduling.colocation import ColocationConfig, Guest, Measured, Resident, choose_pairs, should_split
from apps.scheduling.placeability import gpu_type_key
from apps.scheduling.sharing import FULL
from apps.telemetry.models import GpuSampleBucket

logger = logging.getLogger(__name__)
State = Job.State
# How far back a resident's utilization is measured.
WINDOW_S = 300


def config() -> ColocationConfig:
    values = settings.COLOCATION
    return ColocationConfig(max_utilization_pct=float(values["max_utilization_pct"]),
                            min_samples=int(values["min_samples"]), max_slowdown=float(values["max_slowdown"]))


def _mean(tally: Any) -> float | None:
    return tally[1] / tally[0] if isinstance(tally, list) and len(tally) == 2 and tally[0] else None


def _alone_since(job: Job, now: datetime) -> datetime:
    """Telemetry of the job's GPU counts as the job's own from when it started there alone."""
    since = max(job.started_at or now, now - timedelta(seconds=WINDOW_S))
    windows = (job.colocation or {}).get("windows") or []
    if windows and windows[-1][1] is not None:
        since = max(since, datetime.fromtimestamp(windows[-1][1], tz=UTC))
    return since


def measure_alone(job: Job, gpu_id: int, now: datetime) -> dict[str, Any] | None:
    """The job's GPU while it ran there alone: mean utilization, samples, peak memory (None: no sample yet)."""
    rows = GpuSampleBucket.objects.filter(gpu_id=gpu_id, job_id=job.pk, bucket_start__gte=_alone_since(job, now),
                                          available_samples__gt=0, utilization_avg__isnull=False)
    samples = 0
    busy = 0.0
    memory = 0
    for available, utilization, memory_max in rows.values_list("available_samples", "utilization_avg",
                                                               "memory_used_max_mb"):
        samples += available
        busy += available * (utilization or 0.0)
        memory = max(memory, memory_max or 0)
    if not samples:
        return None
    return {"utilization_pct": round(busy / samples, 1), "samples": samples, "memory_mb": memory}


def _measured(job: Job, taken: dict[str, Any] | None) -> Measured:
    colocation = job.colocation or {}
    taken = taken or colocation.get("measured") or {}
    return Measured(job_id=job.pk, utilization_pct=taken.get("utilization_pct"), samples=taken.get("samples", 0),
                    memory_mb=taken.get("memory_mb"), wait_fraction=job.wait_fraction,
                    step_s=_mean(colocation.get("alone")))


def _end_pairings_that_are_over() -> int:
    ended = 0
    for job in Job.objects.filter(shareable=True, colocation__state__in=["paired", "split"]):
        if colocating.pair_over(job) and colocating.unpair(job.pk):
            ended += 1
    return ended


def _split_pairs_that_hurt(cfg: ColocationConfig) -> int:
    split = 0
    guests = Job.objects.filter(shareable=True, state=State.RUNNING, preempt_requested_at__isnull=True,
                                colocation__state="paired", colocation__role="guest")
    for guest in guests:
        resident = Job.objects.filter(pk=guest.colocation.get("with")).first()
        if resident is None:
            continue
        slowdowns = [colocating.slowdown_of(resident.colocation), colocating.slowdown_of(guest.colocation)]
        reports = [colocating.paired_reports(resident.colocation), colocating.paired_reports(guest.colocation)]
        if should_split(slowdowns, reports, cfg):
            worst = max(s for s in slowdowns if s is not None)
            reason = f"slowdown measured {worst:.2f}×, over the {cfg.max_slowdown:.2f}× allowed"
            if colocating.split(guest.pk, resident.pk, reason=reason):
                split += 1
    return split


def _pair_waiting_jobs(cfg: ColocationConfig, now: datetime) -> int:
    running = [job for job in Job.objects.filter(shareable=True, state=State.RUNNING, gpus=1, gpu_share_units=FULL,
                                                 preempt_requested_at__isnull=True)
               if (job.colocation or {}).get("state") != "paired"]
    allocations = {a.job_id: a for a in JobAllocation.objects.filter(
        job__in=running, released_at__isnull=True).select_related("gpu")}
    residents: list[Resident] = []
    taken: dict[int, dict[str, Any]] = {}
    for job in running:
        allocation = allocations.get(job.pk)
        if allocation is None or allocation.share_units != FULL:
            continue
        measured = measure_alone(job, allocation.gpu_id, now)
        if measured is None:
            continue
        taken[job.pk] = measured
        if (job.colocation or {}).get("measured") != measured:  # kept for its later runs (as a guest, say)
            Job.objects.filter(pk=job.pk).update(colocation={**(job.colocation or {}), "measured": measured})
            job.colocation = {**(job.colocation or {}), "measured": measured}
        residents.append(Resident(_measured(job, measured), gpu_id=allocation.gpu_id,
                                  gpu_memory_mb=allocation.gpu.memory_mb,
                                  avoid=frozenset((job.colocation or {}).get("avoid", [])),
                                  gpu_type=gpu_type_key(allocation.gpu.gpu_type)))
    if not residents:
        return 0
    # Jobs a scheduler pass looked at and left waiting (a pass writes their pending reason), in queue order.
    waiting = (Job.objects.filter(shareable=True, state=State.QUEUED, gpus=1, gpu_share_units=FULL,
                                  gpu_memory_mb__isnull=True).exclude(pending_reason="")
               .exclude(pending_reason__startswith="starting")
               .order_by(F("queue_position").asc(nulls_last=True), "pk"))
    guests = [Guest(_measured(job, None), avoid=frozenset((job.colocation or {}).get("avoid", [])),
                    gpu_type=gpu_type_key(job.gpu_type)) for job in waiting[:200]]
    paired = 0
    for choice in choose_pairs(residents, guests, cfg):
        if colocating.pair(choice.resident, choice.guest, choice.gpu_id, reason=choice.reason,
                           predicted_slowdown=choice.predicted_slowdown, measured=taken):
            paired += 1
    return paired


def colocation_pass() -> dict[str, int]:
    if not settings.COLOCATION_ENABLED:
        return {}
    cfg = config()
    now = timezone.now()
    result = {"ended": _end_pairings_that_are_over(), "split": _split_pairs_that_hurt(cfg),
              "paired": _pair_waiting_jobs(cfg, now)}
    if any(result.values()):
        logger.info("colocation pass: %s", result)
    return result

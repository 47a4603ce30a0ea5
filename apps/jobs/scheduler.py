"""The console side of a scheduler pass: database snapshot → pure policy → atomic placements."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db.models import Prefetch

from apps.cluster.models import GPU, Host
from apps.jobs import services
from apps.jobs.models import Job, JobAllocation
from apps.quotas.models import TeamQuota, UserQuota
from apps.scheduling.config import PolicyConfig
from apps.scheduling.policy import schedule
from apps.scheduling.types import (
    GpuView,
    HostView,
    PendingJob,
    Priority,
    RunningJob,
    Snapshot,
    TeamQuotaView,
)

logger = logging.getLogger(__name__)


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value else None


def build_snapshot(now: float | None = None) -> Snapshot:
    now = now if now is not None else time.time()
    hosts = tuple(
        HostView(
            name=host.name,
            schedulable=host.state == Host.State.UP,
            gpus=tuple(
                GpuView(gpu_id=gpu.pk, index=gpu.index, gpu_type=gpu.gpu_type, schedulable=gpu.health == GPU.Health.OK)
                for gpu in host.gpus.all()
            ),
        )
        for host in Host.objects.prefetch_related(Prefetch("gpus", queryset=GPU.objects.order_by("index")))
    )
    active_allocations = Prefetch(
        "allocations", queryset=JobAllocation.objects.filter(released_at__isnull=True), to_attr="active_allocations"
    )
    running = tuple(
        RunningJob(
            job_id=job.pk,
            team=job.team.slug,
            user=job.user.get_username(),
            gpus=job.gpus,
            priority=Priority.from_name(job.priority),
            gpu_ids=tuple(a.gpu_id for a in job.active_allocations),
            started_at=_epoch(job.started_at or job.placed_at) or now,
            submitted_at=_epoch(job.created_at) or now,
            gpu_type=job.gpu_type or None,
            declared_steps=job.max_steps,
            steps_done=job.steps_done,
            observed_step_s=1.0 / job.steps_per_second if job.steps_per_second else None,
            time_limit_s=job.time_limit_minutes * 60.0,
            preemption_count=job.preemption_count,
        )
        for job in Job.objects.filter(state__in=Job.HOLDING_STATES)
        .select_related("team", "user")
        .prefetch_related(active_allocations)
    )
    pending = tuple(
        PendingJob(
            job_id=job.pk,
            team=job.team.slug,
            user=job.user.get_username(),
            gpus=job.gpus,
            priority=Priority.from_name(job.priority),
            submitted_at=_epoch(job.created_at) or now,
            gpu_type=job.gpu_type or None,
            declared_steps=job.max_steps,
            steps_done=job.steps_done,
            observed_step_s=1.0 / job.steps_per_second if job.steps_per_second else None,
            time_limit_s=job.time_limit_minutes * 60.0,
            preemption_count=job.preemption_count,
        )
        for job in Job.objects.filter(state=Job.State.QUEUED).select_related("team", "user")
    )
    user_caps: dict[str, dict[str, int]] = {}
    for team_slug, username, cap in UserQuota.objects.values_list("team__slug", "user__username", "max_gpus"):
        user_caps.setdefault(team_slug, {})[username] = cap
    quotas = {
        quota.team.slug: TeamQuotaView(
            team=quota.team.slug,
            max_gpus=quota.max_gpus,
            user_max_gpus=user_caps.get(quota.team.slug, {}),
            share=quota.share,
            may_borrow=quota.may_borrow,
        )
        for quota in TeamQuota.objects.select_related("team")
    }
    return Snapshot(now=now, hosts=hosts, pending=pending, running=running, quotas=quotas)


@dataclass(frozen=True)
class PassResult:
    pending: int
    placed: int
    skipped: int
    seconds: float


def scheduler_pass() -> PassResult:
    started = time.perf_counter()
    snapshot = build_snapshot()
    decisions = schedule(snapshot, PolicyConfig(policy=settings.SCHEDULER_POLICY))
    placed = sum(1 for p in decisions.placements if services.job_place(p.job_id, p.gpu_ids))
    services.jobs_set_pending_info(
        {
            job_id: (
                info.reason,
                info.position,
                datetime.fromtimestamp(info.estimated_start, tz=UTC) if info.estimated_start else None,
            )
            for job_id, info in decisions.pending.items()
        }
    )
    result = PassResult(
        pending=len(snapshot.pending),
        placed=placed,
        skipped=len(decisions.placements) - placed,
        seconds=time.perf_counter() - started,
    )
    if placed or result.skipped:
        logger.info("scheduler pass: %s", result)
    return result

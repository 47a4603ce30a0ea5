"""Usage is derived from job records (the ledger of GPU-seconds per job run), never from a counter."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Sum
from django.utils import timezone

from apps.accounts.models import Team
from apps.quotas.models import TeamQuota
from apps.scheduling.usage import segment_gpu_seconds, segment_seconds


def month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def units_held(team: Team, user=None, *, guaranteed_only: bool = False) -> int:
    """GPUs the team's placed and running jobs hold, in 1/100 GPU (fractions counted exactly).

    `guaranteed_only` leaves out capacity borrowed beyond the quota.
    """
    from django.db.models import F

    from apps.jobs.models import Job

    jobs = Job.objects.filter(team=team, state__in=Job.HOLDING_STATES)
    if user is not None:
        jobs = jobs.filter(user=user)
    if guaranteed_only:
        jobs = jobs.filter(borrowing=False)
    return jobs.aggregate(total=Sum(F("gpus") * F("gpu_share_units")))["total"] or 0


def gpus_held(team: Team, user=None, *, guaranteed_only: bool = False) -> float:
    units = units_held(team, user, guaranteed_only=guaranteed_only)
    return units // 100 if units % 100 == 0 else units / 100


def gpu_seconds_between(team: Team, start: datetime, end: datetime) -> float:
    """The team's GPU-seconds inside [start, end) (a fraction counts its share; open segments run to `end`)."""
    from apps.jobs.models import UsageSegment

    total = 0.0
    window = start.timestamp(), end.timestamp()
    segments = UsageSegment.objects.filter(team=team, started_at__lt=end).exclude(ended_at__lte=start)
    for gpus, share, seg_start, seg_end in segments.values_list("gpus", "share_units", "started_at", "ended_at"):
        seconds = segment_seconds(seg_start.timestamp(), seg_end.timestamp() if seg_end else None, *window)
        total += segment_gpu_seconds(gpus, share, seconds)
    return total


@dataclass(frozen=True)
class TeamUsage:
    team: str
    gpus_held: float
    max_gpus: int
    gpu_hours_this_month: float
    gpu_hours_budget: float  # 0 = unlimited
    gpu_hours_left: float | None  # None = unlimited
    period_start: datetime


def team_usage(team: Team, now: datetime | None = None) -> TeamUsage:
    now = now or timezone.now()
    quota = TeamQuota.objects.filter(team=team).first()
    budget = float(quota.gpu_hours_per_month) if quota else 0.0
    start = month_start(now)
    used_hours = gpu_seconds_between(team, start, now) / 3600.0
    return TeamUsage(
        team=team.slug,
        gpus_held=gpus_held(team),
        max_gpus=quota.max_gpus if quota else 0,
        gpu_hours_this_month=round(used_hours, 4),
        gpu_hours_budget=budget,
        gpu_hours_left=None if budget == 0 else round(max(0.0, budget - used_hours), 4),
        period_start=start,
    )


def budget_exhausted(team: Team, quota: TeamQuota, now: datetime | None = None) -> bool:
    if quota.gpu_hours_per_month == Decimal(0):
        return False
    now = now or timezone.now()
    used_hours = gpu_seconds_between(team, month_start(now), now) / 3600.0
    return used_hours >= float(quota.gpu_hours_per_month)

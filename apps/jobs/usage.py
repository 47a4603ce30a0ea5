"""A team's usage, derived from job records (the ledger of GPU-seconds per job run), never from a counter.

It lives with the jobs it reads (it moved from apps.quotas.selectors, which may not import jobs).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import F, Sum
from django.utils import timezone

from apps.accounts.models import Team
from apps.jobs.models import Job, UsageSegment
from apps.quotas.models import TeamQuota
from apps.scheduling.usage import budget_overrun_hours, budget_spent, segment_gpu_seconds, segment_seconds


def month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def units_held(team: Team, user=None, *, guaranteed_only: bool = False) -> int:
    """GPUs the team's placed and running jobs hold, in 1/100 GPU (fractions counted exactly).

    `guaranteed_only` leaves out capacity borrowed beyond the quota.
    """
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
    return gpu_seconds_by_team(start, end, [team.pk]).get(team.slug, 0.0)


def gpu_seconds_by_team(start: datetime, end: datetime, team_ids: Iterable[int]) -> dict[str, float]:
    """GPU-seconds inside [start, end) of each of these teams, by slug (a scheduler pass reads all it needs at once)."""
    totals: dict[str, float] = {}
    window = start.timestamp(), end.timestamp()
    segments = UsageSegment.objects.filter(team_id__in=list(team_ids), started_at__lt=end).exclude(ended_at__lte=start)
    rows = segments.values_list("team__slug", "gpus", "share_units", "started_at", "ended_at")
    for slug, gpus, share, seg_start, seg_end in rows:
        seconds = segment_seconds(seg_start.timestamp(), seg_end.timestamp() if seg_end else None, *window)
        totals[slug] = totals.get(slug, 0.0) + segment_gpu_seconds(gpus, share, seconds)
    return totals


@dataclass(frozen=True)
class TeamUsage:
    team: str
    gpus_held: float
    max_gpus: int
    gpu_hours_this_month: float
    gpu_hours_budget: float  # 0 = unlimited
    gpu_hours_left: float | None  # None = unlimited
    gpu_hours_over: float  # used beyond the budget (0 within it or without one)
    budget_used_pct: float | None  # None = unlimited; above 100 when over
    budget_spent: bool  # no new placements for the team until the budget is raised or the month ends
    when_budget_spent: str  # what happens to running jobs then (TeamQuota.when_budget_spent)
    period_start: datetime


def team_usage(team: Team, now: datetime | None = None) -> TeamUsage:
    now = now or timezone.now()
    quota = TeamQuota.objects.filter(team=team).first()
    budget = float(quota.gpu_hours_per_month) if quota else 0.0
    start = month_start(now)
    used_seconds = gpu_seconds_between(team, start, now)
    used_hours = used_seconds / 3600.0
    return TeamUsage(
        team=team.slug,
        gpus_held=gpus_held(team),
        max_gpus=quota.max_gpus if quota else 0,
        gpu_hours_this_month=round(used_hours, 4),
        gpu_hours_budget=budget,
        gpu_hours_left=None if budget == 0 else round(max(0.0, budget - used_hours), 4),
        gpu_hours_over=round(budget_overrun_hours(used_seconds, budget), 4),
        budget_used_pct=None if budget == 0 else round(100.0 * used_hours / budget, 1),
        budget_spent=budget_spent(used_seconds, budget),
        when_budget_spent=quota.when_budget_spent if quota else TeamQuota.WhenBudgetSpent.FINISH,
        period_start=start,
    )


def budget_exhausted(team: Team, quota: TeamQuota, now: datetime | None = None) -> bool:
    """Whether the team has used this month's GPU-hour budget (submission and placement ask; the pass reads
    gpu_seconds_by_team for every team at once)."""
    if quota.gpu_hours_per_month == Decimal(0):
        return False
    now = now or timezone.now()
    return budget_spent(gpu_seconds_between(team, month_start(now), now), float(quota.gpu_hours_per_month))

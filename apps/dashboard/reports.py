"""Usage and efficiency reports: plain functions over the usage ledger and per-job GPU statistics.

Allocated GPU-hours come from UsageSegment rows clipped to the period. "Used" GPU-hours weight each job's allocated
hours by its mean utilization (JobGpuStats.utilization_mean / 100); a job without statistics counts as "unknown" and
is left out of used and idle. Idle = allocated (with statistics) - used.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from apps.accounts.models import Team
from apps.jobs.models import JobAllocation, UsageSegment
from apps.scheduling.usage import segment_gpu_seconds, segment_seconds
from apps.telemetry.models import JobGpuStats


def parse_costs(value: str | dict | None) -> dict[str, float]:
    """`"H200=4.5,A100=2.1"` (or a dict) -> {"H200": 4.5, "A100": 2.1}; malformed entries are skipped."""
    if not value:
        return {}
    if isinstance(value, dict):
        return {str(k): float(v) for k, v in value.items()}
    costs: dict[str, float] = {}
    for part in str(value).split(","):
        name, _, price = part.partition("=")
        try:
            costs[name.strip()] = float(price)
        except ValueError:
            continue
    return {k: v for k, v in costs.items() if k}


def gpu_hour_costs() -> dict[str, float]:
    return parse_costs(getattr(settings, "CONSOLE_GPU_HOUR_COST", ""))


@dataclass
class Row:
    """GPU-hours of one team, user or job over the period."""

    team: str
    user: str = ""
    job_id: int | None = None
    job_name: str = ""
    gpu_type: str = ""
    allocated: float = 0.0
    used: float = 0.0  # utilization-weighted, jobs with statistics only
    known: float = 0.0  # allocated hours of jobs with statistics
    unknown: float = 0.0  # allocated hours of jobs without statistics
    cost: float | None = None
    utilization_mean: float | None = None

    @property
    def idle(self) -> float:
        return max(self.known - self.used, 0.0)

    @property
    def efficiency(self) -> float | None:
        return self.used / self.known if self.known else None

    def add(self, other: Row) -> None:
        self.allocated += other.allocated
        self.used += other.used
        self.known += other.known
        self.unknown += other.unknown
        if other.cost is not None:
            self.cost = (self.cost or 0.0) + other.cost


@dataclass
class UsageReport:
    start: datetime
    end: datetime
    teams: list[Row] = field(default_factory=list)
    users: list[Row] = field(default_factory=list)
    jobs: list[Row] = field(default_factory=list)
    total: Row = field(default_factory=lambda: Row(team="all"))
    costs: dict[str, float] = field(default_factory=dict)

    def top_waste(self, n: int = 10) -> list[Row]:
        return sorted((j for j in self.jobs if j.idle > 0), key=lambda j: j.idle, reverse=True)[:n]

    @property
    def unknown_jobs(self) -> list[Row]:
        return [j for j in self.jobs if j.unknown > 0]


def usage_report(
    teams: Iterable[Team], start: datetime, end: datetime, *, costs: dict[str, float] | None = None,
    now: datetime | None = None,
) -> UsageReport:
    """GPU-hours of `teams` between start and end (segments clipped to the period; open ones end now)."""
    now = now or timezone.now()
    costs = gpu_hour_costs() if costs is None else costs
    report = UsageReport(start=start, end=end, costs=costs)
    segments = list(
        UsageSegment.objects.filter(team__in=list(teams), started_at__lt=end)
        .exclude(ended_at__lte=start)
        .values_list("job_id", "job__name", "job__gpu_type", "team__slug", "user__username", "gpus", "share_units", "started_at",
                     "ended_at")
    )
    job_ids = {seg[0] for seg in segments}
    stats = {
        s.job_id: s.utilization_mean for s in JobGpuStats.objects.filter(job_id__in=job_ids).only(
            "job_id", "samples", "utilization_sum")
    }
    placed_types: dict[int, str] = {}
    for job_id, gpu_type in JobAllocation.objects.filter(job_id__in=job_ids).values_list("job_id", "gpu__gpu_type"):
        placed_types.setdefault(job_id, gpu_type)
    jobs: dict[int, Row] = {}
    window = start.timestamp(), end.timestamp()
    for job_id, name, wanted_type, team, user, gpus, share_units, seg_start, seg_end in segments:
        seconds = segment_seconds(seg_start.timestamp(), (seg_end or now).timestamp(), *window)
        if seconds <= 0:
            continue
        hours = segment_gpu_seconds(gpus, share_units, seconds) / 3600.0  # a shared GPU counts by share
        gpu_type = placed_types.get(job_id) or wanted_type
        row = jobs.setdefault(job_id, Row(team=team, user=user, job_id=job_id, job_name=name, gpu_type=gpu_type,
                                          utilization_mean=stats.get(job_id)))
        mean = stats.get(job_id)
        part = Row(team=team, allocated=hours)
        if mean is None:
            part.unknown = hours
        else:
            part.known = hours
            part.used = hours * min(max(mean, 0.0), 100.0) / 100.0
        if gpu_type in costs:
            part.cost = hours * costs[gpu_type]
        row.add(part)
    by_team: dict[str, Row] = {}
    by_user: dict[tuple[str, str], Row] = {}
    for row in jobs.values():
        by_team.setdefault(row.team, Row(team=row.team)).add(row)
        by_user.setdefault((row.team, row.user), Row(team=row.team, user=row.user)).add(row)
        report.total.add(row)
    report.jobs = sorted(jobs.values(), key=lambda r: r.allocated, reverse=True)
    report.teams = sorted(by_team.values(), key=lambda r: r.team)
    report.users = sorted(by_user.values(), key=lambda r: (r.team, r.user))
    return report


def report_csv(report: UsageReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["section", "team", "user", "job", "gpu_type", "allocated_gpu_hours", "used_gpu_hours",
                     "idle_gpu_hours", "unknown_gpu_hours", "cost"])

    def line(section: str, r: Row) -> None:
        writer.writerow([section, r.team, r.user, r.job_id or "", r.gpu_type, f"{r.allocated:.4f}", f"{r.used:.4f}",
                         f"{r.idle:.4f}", f"{r.unknown:.4f}", "" if r.cost is None else f"{r.cost:.2f}"])

    for r in report.teams:
        line("team", r)
    for r in report.users:
        line("user", r)
    for r in report.jobs:
        line("job", r)
    line("total", report.total)
    return out.getvalue()

"""The cluster's periodic snapshot: GPUs busy, idle, stale and down, and each team's allocation and queue.

Queue length and wait times are not kept by any record over time (a job leaves the queue and its wait is
gone), so the beat task `telemetry.cluster_snapshot` writes one small ClusterSample row every 10 s; the
housekeeping task rolls them up into minutes and prunes them with the GPU buckets (retention.py).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from django.db.models import F, Sum
from django.utils import timezone

from apps.jobs.models import Job
from apps.quotas.models import TeamQuota
from apps.telemetry.freshness import cluster_view, gpu_status, host_facts
from apps.telemetry.models import ClusterSample
from apps.telemetry.services import BUCKET_S, latest_frames

TEAM_FIELDS = ("allocated", "borrowed", "quota", "queued", "wait_max_s", "wait_sum_s")


def _team(teams: dict[str, dict[str, float]], slug: str) -> dict[str, float]:
    return teams.setdefault(slug, dict.fromkeys(TEAM_FIELDS, 0.0))


def team_snapshot(now: datetime) -> dict[str, dict[str, float]]:
    """Per team: GPUs held (borrowed ones apart), its quota, queued jobs and how long they have waited."""
    teams: dict[str, dict[str, float]] = {}
    for slug, max_gpus in TeamQuota.objects.values_list("team__slug", "max_gpus"):
        _team(teams, slug)["quota"] = float(max_gpus)
    held = (Job.objects.filter(state__in=Job.HOLDING_STATES).order_by().values_list("team__slug", "borrowing")
            .annotate(units=Sum(F("gpus") * F("gpu_share_units"))))
    for slug, borrowing, units in held:
        team = _team(teams, slug)
        team["allocated"] += (units or 0) / 100
        if borrowing:
            team["borrowed"] += (units or 0) / 100
    for slug, created in Job.objects.filter(state=Job.State.QUEUED).values_list("team__slug", "created_at"):
        team = _team(teams, slug)
        wait = max(0.0, (now - created).total_seconds())
        team["queued"] += 1
        team["wait_max_s"] = max(team["wait_max_s"], wait)
        team["wait_sum_s"] += wait
    return teams


def gpu_counts(now: float) -> dict[str, int]:
    """Every GPU counted once as freshness.gpu_status says: busy, idle, stale or down."""
    facts = host_facts()
    view = cluster_view(facts, latest_frames([host.name for host in facts]), now)
    counts = Counter(gpu_status(entry) for entry in view.gpus)
    return {status: counts.get(status, 0) for status in ("busy", "idle", "stale", "down")}


def snapshot_cluster(now: datetime | None = None) -> ClusterSample:
    """Write (or rewrite) the 10-second ClusterSample of the bucket `now` falls in."""
    now = now or timezone.now()
    start = datetime.fromtimestamp(int(now.timestamp() // BUCKET_S) * BUCKET_S, tz=UTC)
    counts = gpu_counts(now.timestamp())
    fields: dict[str, Any] = {f"gpus_{status}": float(n) for status, n in counts.items()}
    sample, _ = ClusterSample.objects.update_or_create(
        resolution_s=BUCKET_S, bucket_start=start, defaults={**fields, "snapshots": 1, "teams": team_snapshot(now)})
    return sample


def merge_samples(rows: list[ClusterSample]) -> dict[str, Any]:
    """One minute's fields from its 10-second rows: counts averaged, the longest wait kept."""
    n = len(rows)
    merged: dict[str, Any] = {f: sum(getattr(r, f) for r in rows) / n
                              for f in ("gpus_busy", "gpus_idle", "gpus_stale", "gpus_down")}
    teams: dict[str, dict[str, float]] = {}
    for row in rows:
        for slug, values in row.teams.items():
            team = _team(teams, slug)
            for name in TEAM_FIELDS:
                value = float(values.get(name, 0.0))
                team[name] = max(team[name], value) if name == "wait_max_s" else team[name] + value / n
    merged["teams"] = teams
    merged["snapshots"] = n
    return merged

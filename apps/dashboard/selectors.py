"""Read-side helpers for the console pages. Who sees what is decided by apps/accounts/access.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db.models import Count, Min, QuerySet
from django.utils import timezone

from apps.accounts import access
from apps.accounts.access import Action, AnyUser
from apps.cluster.models import GPU, Host
from apps.jobs.models import Job, JobAllocation
from apps.telemetry.freshness import gpu_status, host_status
from apps.telemetry.models import Alert, GpuSampleBucket
from apps.telemetry.services import latest_frames

SPARKLINE_SECONDS = 5 * 60


@dataclass
class GpuCell:
    gpu: GPU
    host: Host
    job_id: int | None = None  # the first job on the GPU the user may see
    team: str | None = None
    other_team: bool = False  # another team's job is on it too (or only): shown busy, never named
    utilization: float | None = None
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    temperature: float | None = None
    power_w: float | None = None
    host_status: str = "up"  # up, draining, stale or down (apps/telemetry/freshness.py)
    stale: bool = False  # nothing live backs the cell: no readings, no job shown

    @property
    def busy(self) -> bool:
        return self.job_id is not None or self.other_team

    @property
    def status(self) -> str:
        """busy, idle, stale or down: what the live stream's entry for the GPU says (freshness.gpu_status)."""
        return gpu_status({"host_status": self.host_status, "health": None if self.stale else self.gpu.health,
                           "stale": self.stale,
                           "job": self.job_id, "other_team": self.other_team})


@dataclass
class Overview:
    hosts: list[tuple[Host, str, list[GpuCell]]]  # each host with its status and its GPUs
    busy: int = 0
    idle: int = 0
    stale: int = 0
    down: int = 0
    host_counts: dict[str, int] = field(default_factory=dict)  # hosts up, draining, stale, down
    queue: dict[str, int] = field(default_factory=dict)
    active_alerts: int = 0
    history: dict[str, list[list[Any]]] = field(default_factory=dict)  # uuid -> [[ts, util], ...]


def cluster_overview(user: AnyUser) -> Overview:
    """Every host and GPU the user may see, with its jobs and latest telemetry; in a fixed number of queries.

    What it shows of other teams is what the live stream shows the same user (access.visible_gpu, visible_queue).
    """
    hosts = list(access.restrict(Host.objects.prefetch_related("gpus"), user).order_by("name"))
    if not hosts:
        return Overview(hosts=[])
    viewer = access.viewer(user)
    on_gpu: dict[int, list[dict[str, Any]]] = {}
    for gpu_id, job_id, team in JobAllocation.objects.filter(released_at__isnull=True).order_by(
            "job_id").values_list("gpu_id", "job_id", "job__team__slug"):
        on_gpu.setdefault(gpu_id, []).append({"job": job_id, "team": team})
    since = timezone.now() - timedelta(seconds=SPARKLINE_SECONDS)
    latest: dict[int, dict[str, Any]] = {}
    history: dict[int, list[list[Any]]] = {}
    recent = GpuSampleBucket.objects.filter(bucket_start__gte=since)
    finest = recent.aggregate(finest=Min("resolution_s"))["finest"]
    buckets = (
        recent.filter(resolution_s=finest or 0)
        .order_by("bucket_start")
        .values("gpu_id", "bucket_start", "utilization_avg", "memory_used_max_mb", "memory_total_mb",
                "temperature_max", "power_avg_w")
    )
    for row in buckets:
        latest[row["gpu_id"]] = row
        points = history.setdefault(row["gpu_id"], [])
        ts = round(row["bucket_start"].timestamp())
        if points and points[-1][0] == ts:  # rows of one bucket from several ingest processes: keep one
            if row["utilization_avg"] is not None:
                points[-1][1] = row["utilization_avg"]
            continue
        points.append([ts, row["utilization_avg"]])
    overview = Overview(hosts=[], host_counts=dict.fromkeys(("up", "draining", "stale", "down"), 0))
    frames = latest_frames([host.name for host in hosts])
    now = time.time()
    for host in hosts:
        status = host_status(host.state, host.last_heartbeat, frames.get(host.name), now)
        overview.host_counts[status] += 1
        stale = status in ("stale", "down")
        cells = []
        for gpu in host.gpus.all():  # prefetched above
            jobs = [] if stale else on_gpu.get(gpu.pk, [])
            seen = access.visible_gpu({"job": jobs[0]["job"] if jobs else None,
                                       "team": jobs[0]["team"] if jobs else None, "jobs": jobs}, viewer)
            reading: dict[str, Any] = {} if stale else dict(latest.get(gpu.pk, {}))
            cell = GpuCell(
                gpu=gpu, host=host, job_id=seen["job"], team=seen["team"], other_team=seen.get("other_team", False),
                utilization=reading.get("utilization_avg"), memory_used_mb=reading.get("memory_used_max_mb"),
                memory_total_mb=reading.get("memory_total_mb") or gpu.memory_mb,
                temperature=reading.get("temperature_max"), power_w=reading.get("power_avg_w"), host_status=status,
                stale=stale,
            )
            setattr(overview, cell.status, getattr(overview, cell.status) + 1)
            if gpu.pk in history and not stale:
                overview.history[gpu.uuid] = history[gpu.pk]
            cells.append(cell)
        overview.hosts.append((host, status, cells))
    overview.queue = access.visible_queue(dict(
        Job.objects.filter(state=Job.State.QUEUED).values_list("team__slug").annotate(n=Count("id")).order_by(
            "team__slug")
    ), viewer)
    overview.active_alerts = alerts_visible_to(user).filter(state=Alert.State.FIRING).count()
    return overview


def alerts_visible_to(user: AnyUser, action: Action = Action.VIEW) -> QuerySet[Alert]:
    """Admins see every alert; others their teams' alerts and the cluster's hardware alerts (no team)."""
    alerts = Alert.objects.select_related("rule", "host", "gpu__host", "job", "team", "acknowledged_by")
    return access.restrict(alerts, user, action)

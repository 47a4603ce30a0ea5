"""Read-side helpers for the console pages. Who sees what is decided by apps/accounts/access.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db.models import Count, Min, QuerySet
from django.utils import timezone

from apps.accounts import access
from apps.accounts.access import Action, AnyUser
from apps.cluster.models import GPU, Host
from apps.jobs.models import Job, JobAllocation
from apps.telemetry.models import Alert, GpuSampleBucket

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
    down: bool = False

    @property
    def busy(self) -> bool:
        return self.job_id is not None or self.other_team

    @property
    def status(self) -> str:
        return "down" if self.down else ("busy" if self.busy else "idle")


@dataclass
class Overview:
    hosts: list[tuple[Host, list[GpuCell]]]
    busy: int = 0
    idle: int = 0
    down: int = 0
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
    overview = Overview(hosts=[])
    for host in hosts:
        cells = []
        for gpu in host.gpus.all():  # prefetched above
            jobs = on_gpu.get(gpu.pk, [])
            seen = access.visible_gpu({"job": jobs[0]["job"] if jobs else None,
                                       "team": jobs[0]["team"] if jobs else None, "jobs": jobs}, viewer)
            row = latest.get(gpu.pk, {})
            cell = GpuCell(
                gpu=gpu, host=host, job_id=seen["job"], team=seen["team"], other_team=seen.get("other_team", False),
                utilization=row.get("utilization_avg"), memory_used_mb=row.get("memory_used_max_mb"),
                memory_total_mb=row.get("memory_total_mb") or gpu.memory_mb, temperature=row.get("temperature_max"),
                power_w=row.get("power_avg_w"),
                down=host.state != Host.State.UP or gpu.health == GPU.Health.FAULTY,
            )
            if cell.down:
                overview.down += 1
            elif cell.busy:
                overview.busy += 1
            else:
                overview.idle += 1
            if gpu.pk in history:
                overview.history[gpu.uuid] = history[gpu.pk]
            cells.append(cell)
        overview.hosts.append((host, cells))
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

"""A host's page and a GPU's page: what the host runs jobs with (processes, or podman/docker containers, with the
images in its local store), its GPUs, their history, the jobs on them now, health marks and open alerts."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from apps.accounts import access
from apps.cluster.models import GPU, Host
from apps.cluster.selectors import hosts_visible_to
from apps.dashboard.selectors import alerts_visible_to
from apps.jobs.models import Job, JobAllocation
from apps.telemetry.freshness import gpu_status, host_status
from apps.telemetry.models import Alert
from apps.telemetry.services import latest_frames
from workers.protocol import ImageRecord

OPEN_ALERTS = 20
HOST_CHARTS = [("utilization", "Utilization (%)"), ("memory", "Memory (GiB)"), ("temperature", "Temperature (°C)"),
               ("power", "Power (W)")]


@dataclass
class GpuRow:
    gpu: GPU
    status: str  # busy, idle, stale or down (freshness.gpu_status)
    jobs: list[Job]  # the jobs on it the user may see
    other_team: bool  # another team's job is on it too (shown busy, never named)
    reading: dict[str, Any] | None  # the live frame's entry, None when nothing live backs it


def _gpu_rows(request: HttpRequest, host: Host, gpus: list[GPU], status: str) -> list[GpuRow]:
    """Each GPU with the jobs the user may see on it, as the overview and the live stream show them."""
    viewer = access.viewer(request.user)
    on_gpu: dict[int, list[dict[str, Any]]] = {}
    for gpu_id, job_id, team in JobAllocation.objects.filter(gpu__in=gpus, released_at__isnull=True).order_by(
            "job_id").values_list("gpu_id", "job_id", "job__team__slug"):
        on_gpu.setdefault(gpu_id, []).append({"job": job_id, "team": team})
    live = status in ("up", "draining")
    frame = latest_frames([host.name]).get(host.name) if live else None
    entries = {g["uuid"]: g for g in frame["gpus"]} if frame else {}
    seen = {gpu.pk: access.visible_gpu({"job": None, "team": None, "jobs": on_gpu.get(gpu.pk, [])}, viewer)
            for gpu in gpus}
    ids = {j["job"] for s in seen.values() for j in s["jobs"]}
    jobs = access.restrict(Job.objects.filter(pk__in=ids).select_related("team"), request.user).in_bulk()
    rows = []
    for gpu in gpus:
        entry = entries.get(gpu.uuid)
        shown = seen[gpu.pk]
        mine = [jobs[j["job"]] for j in shown["jobs"] if j["job"] in jobs]
        state = gpu_status({"host_status": status, "health": gpu.health if entry else None, "stale": entry is None,
                            "available": entry.get("available") if entry else None,
                            "job": mine[0].pk if mine else None, "other_team": shown.get("other_team", False)})
        rows.append(GpuRow(gpu, state, mine, shown.get("other_team", False), entry))
    return rows


def _open_alerts(request: HttpRequest, about: Q) -> list[Alert]:
    return list(alerts_visible_to(request.user).filter(about).exclude(state=Alert.State.RESOLVED)[:OPEN_ALERTS])


def _status(host: Host) -> str:
    return host_status(host.state, host.last_heartbeat, latest_frames([host.name]).get(host.name), time.time())


@login_required
def host_detail(request: HttpRequest, name: str) -> HttpResponse:
    host = get_object_or_404(hosts_visible_to(request.user), name=name)
    images = sorted(ImageRecord.decode_list(host.cached_images), key=lambda image: image.name)
    status = _status(host)
    gpus = list(host.gpus.all())
    return render(request, "dashboard/host_detail.html", {
        "host": host, "status": status, "gpus": _gpu_rows(request, host, gpus, status), "images": images,
        "containers": host.runtime != "process",
        "alerts": _open_alerts(request, Q(host=host) | Q(gpu__host=host)),
        "history_api": reverse("host-metrics", args=[host.name]), "charts": HOST_CHARTS,
    })


@login_required
def gpu_detail(request: HttpRequest, name: str, index: int) -> HttpResponse:
    host = get_object_or_404(hosts_visible_to(request.user), name=name)
    gpu = get_object_or_404(GPU.objects.filter(host=host), index=index)
    status = _status(host)
    row = _gpu_rows(request, host, [gpu], status)[0]
    return render(request, "dashboard/gpu_detail.html", {
        "host": host, "status": status, "row": row, "gpu": gpu,
        "alerts": _open_alerts(request, Q(gpu=gpu)),
        "history_api": reverse("gpu-metrics", args=[gpu.uuid]), "charts": HOST_CHARTS,
    })

"""A host's page: how its agent runs jobs (on the host, or in podman/docker containers), its GPUs and, for a
container host, the images in its local store (what a job's image can start from without a pull)."""

from __future__ import annotations

import time

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from apps.cluster.selectors import hosts_visible_to
from apps.telemetry.freshness import host_status
from apps.telemetry.services import latest_frames
from workers.protocol import ImageRecord


@login_required
def host_detail(request: HttpRequest, name: str) -> HttpResponse:
    host = get_object_or_404(hosts_visible_to(request.user), name=name)
    images = sorted(ImageRecord.decode_list(host.cached_images), key=lambda image: image.name)
    status = host_status(host.state, host.last_heartbeat, latest_frames([host.name]).get(host.name), time.time())
    return render(request, "dashboard/host_detail.html", {
        "host": host, "status": status, "gpus": host.gpus.all(), "images": images,
        "containers": host.runtime != "process"})

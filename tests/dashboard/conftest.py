from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.cluster.models import GPU, Host
from apps.jobs.models import Job, JobAllocation, JobEvent, UsageSegment
from apps.telemetry.models import GpuSampleBucket


@pytest.fixture
def web():
    """A logged-in Django test client for a persona (None: anonymous)."""

    def make(user) -> Client:
        client = Client()
        if user is not None:
            client.force_login(user)
        return client

    return make


def make_job(team, user, *, state: str = Job.State.QUEUED, gpus: int = 1, name: str = "job", **fields: Any) -> Job:
    job = Job.objects.create(name=name, team=team, user=user, gpus=gpus, preset="baseline-fp32",
                             workload={"builtin": "mlp-digits", "params": {}}, time_limit_minutes=60, state=state,
                             **fields)
    JobEvent.objects.create(job=job, to_state=Job.State.QUEUED, reason="submitted")
    return job


def hold(job: Job, gpus: list, start: datetime, end: datetime | None = None) -> None:
    """Give a job GPUs and a usage segment from start to end (None: still holding)."""
    for gpu in gpus:
        JobAllocation.objects.create(job=job, gpu=gpu, released_at=end)
    UsageSegment.objects.create(job=job, team=job.team, user=job.user, gpus=len(gpus), started_at=start,
                                ended_at=end)


def add_busy_hosts(world, first: int, count: int) -> None:
    """Hosts of 8 H200 GPUs with a minute of samples each; a vision job runs on every other one.

    `world` needs .vision (a team) and .member (one of its members): benchmarks/overview.py builds with it too."""
    hosts = [Host.objects.create(name=f"big-{i:02d}", state=Host.State.UP, simulated=True,
                                 last_heartbeat=timezone.now()) for i in range(first, first + count)]
    GPU.objects.bulk_create([
        GPU(host=host, index=i, uuid=f"GPU-{host.name}-{i}", gpu_type="H200", memory_mb=143771)
        for host in hosts for i in range(8)
    ])
    now = timezone.now()
    gpus = list(GPU.objects.filter(host__in=hosts).order_by("host__name", "index"))
    GpuSampleBucket.objects.bulk_create([
        GpuSampleBucket(gpu=gpu, resolution_s=10, bucket_start=now - timedelta(seconds=10 * k), samples=10,
                        available_samples=10, utilization_avg=50.0, memory_used_max_mb=10, memory_total_mb=143771,
                        temperature_max=50.0, power_avg_w=100.0)
        for gpu in gpus for k in range(6)
    ])
    for n in range(first, first + count):
        if n % 2 == 0:
            job = make_job(world.vision, world.member, state=Job.State.RUNNING, gpus=8)
            hold(job, gpus[(n - first) * 8:(n - first + 1) * 8], now - timedelta(minutes=5))

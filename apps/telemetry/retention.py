"""History rollups and retention: 10-second buckets for a day, 1-minute buckets for a month (configurable)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Count, Max, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from apps.telemetry.history import merge_samples
from apps.telemetry.models import ClusterSample, GpuSampleBucket

MINUTE = 60


def roll_up_minutes(now=None) -> int:
    """Merge complete minutes of 10-second buckets into 1-minute buckets (each minute once)."""
    now = now or timezone.now()
    last = (GpuSampleBucket.objects.filter(resolution_s=MINUTE).order_by("-bucket_start")
            .values_list("bucket_start", flat=True).first())
    end = now.replace(second=0, microsecond=0) - timedelta(minutes=1)
    start = last + timedelta(minutes=1) if last else end - timedelta(days=1)
    if start >= end:
        return 0
    rows = (
        GpuSampleBucket.objects.filter(resolution_s=10, bucket_start__gte=start, bucket_start__lt=end)
        .annotate(minute=TruncMinute("bucket_start"))
        .values("gpu_id", "minute")
        .annotate(samples=Sum("samples"), available=Sum("available_samples"), util=Avg("utilization_avg"),
                  util_max=Max("utilization_max"), mem=Max("memory_used_max_mb"), total=Max("memory_total_mb"),
                  temp=Max("temperature_max"), power=Avg("power_avg_w"), energy=Sum("energy_j"), n=Count("id"),
                  job=Max("job_id"))
    )
    minutes = [
        GpuSampleBucket(gpu_id=r["gpu_id"], resolution_s=MINUTE, bucket_start=r["minute"], job_id=r["job"],
                        samples=r["samples"], available_samples=r["available"], utilization_avg=r["util"],
                        utilization_max=r["util_max"], memory_used_max_mb=r["mem"], memory_total_mb=r["total"],
                        temperature_max=r["temp"], power_avg_w=r["power"], energy_j=r["energy"] or 0.0)
        for r in rows
    ]
    with transaction.atomic():
        GpuSampleBucket.objects.bulk_create(minutes)
    return len(minutes)


def roll_up_cluster_minutes(now=None) -> int:
    """The same for the cluster's snapshots (history.py): each complete minute of 10-second rows becomes one row."""
    now = now or timezone.now()
    last = (ClusterSample.objects.filter(resolution_s=MINUTE).order_by("-bucket_start")
            .values_list("bucket_start", flat=True).first())
    end = now.replace(second=0, microsecond=0) - timedelta(minutes=1)
    start = last + timedelta(minutes=1) if last else end - timedelta(days=1)
    if start >= end:
        return 0
    minutes: dict[datetime, list[ClusterSample]] = {}
    for row in ClusterSample.objects.filter(resolution_s=10, bucket_start__gte=start, bucket_start__lt=end).order_by(
            "bucket_start"):
        minutes.setdefault(row.bucket_start.replace(second=0, microsecond=0), []).append(row)
    with transaction.atomic():
        ClusterSample.objects.bulk_create(
            [ClusterSample(resolution_s=MINUTE, bucket_start=minute, **merge_samples(rows))
             for minute, rows in minutes.items()], ignore_conflicts=True)
    return len(minutes)


def prune(now=None) -> int:
    """Drop 10-second rows older than TELEMETRY_KEEP_10S_HOURS and 1-minute rows older than TELEMETRY_KEEP_1M_DAYS
    (the GPU buckets and the cluster's snapshots alike)."""
    now = now or timezone.now()
    fine = now - timedelta(hours=settings.TELEMETRY_KEEP_10S_HOURS)
    coarse = now - timedelta(days=settings.TELEMETRY_KEEP_1M_DAYS)
    deleted = 0
    for model in (GpuSampleBucket, ClusterSample):
        deleted += model.objects.filter(resolution_s=10, bucket_start__lt=fine).delete()[0]
        deleted += model.objects.filter(resolution_s=MINUTE, bucket_start__lt=coarse).delete()[0]
    return deleted

from __future__ import annotations

from django.db.models import QuerySet

from apps.accounts import access
from apps.accounts.access import AnyUser
from apps.telemetry.models import Alert, JobGpuStats


def alerts_visible_to(user: AnyUser) -> QuerySet[Alert]:
    """Cluster-wide alerts and those of the user's teams (apps/accounts/access.py decides)."""
    return access.restrict(Alert.objects.select_related("rule", "host", "gpu__host", "job", "team"), user,
                           access.Action.VIEW)


def can_acknowledge(user: AnyUser, alert: Alert) -> bool:
    return access.can(user, access.Action.ACK_ALERT, alert)


def job_gpu_summary(job_id: int) -> dict[str, float | int] | None:
    """What a job's GPUs did over its lifetime (JobGpuStats, kept at ingest from the samples of its allocated
    GPUs): mean and peak utilization (%), peak memory (MB), energy (Wh, the integral of power). None before
    any sample."""
    stats = JobGpuStats.objects.filter(job_id=job_id).first()
    if stats is None or not stats.samples:
        return None
    return {"samples": stats.samples, "utilization_mean": round(stats.utilization_mean or 0.0, 1),
            "utilization_max": round(stats.utilization_max, 1), "memory_max_mb": stats.memory_max_mb,
            "energy_wh": round(stats.energy_j / 3600, 3)}

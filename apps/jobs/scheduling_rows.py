"""Database rows → the scheduling core's dataclasses (apps/scheduling/types.py, placeability.py).

The only Django-side knowledge of the core's inputs: the rules themselves (usage, similarity, placeability)
live in apps/scheduling.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import F

from apps.cluster.models import GPU, Host
from apps.jobs.models import Job
from apps.scheduling.placeability import Candidate, gpu_type_key
from apps.scheduling.similarity import similarity_key, work_size
from apps.scheduling.types import GpuView, HostView, PendingJob, Priority

# The runtimes (workers.protocol.CONTAINER_RUNTIMES) that run a job in its image; "process" runs it on the host.
CONTAINER_BACKENDS = ("podman", "docker")

# What the policy needs of each active job, read as plain rows: a pass reads the whole queue every second, and
# building model instances (with their team and user) for 2,000 queued jobs cost 200 ms a pass.
JOB_FIELDS = {
    "job_id": F("pk"), "team_slug": F("team__slug"), "username": F("user__username"), "gpus_": F("gpus"),
    "priority_": F("priority"), "gpu_type_": F("gpu_type"), "max_steps_": F("max_steps"),
    "steps_done_": F("steps_done"), "steps_per_second_": F("steps_per_second"),
    "time_limit_minutes_": F("time_limit_minutes"), "preemption_count_": F("preemption_count"),
    "workload_": F("workload"), "gpu_share_units_": F("gpu_share_units"), "gpu_memory_mb_": F("gpu_memory_mb"),
    "created_at_": F("created_at"), "image_": F("image"), "service_group_": F("service_group"),
    "secrets_": F("secrets"), "mounts_": F("mounts"),
}
HOLDING_FIELDS = {
    "started_at_": F("started_at"), "placed_at_": F("placed_at"), "borrowing_": F("borrowing"),
    "progress_at_": F("progress_at"),
}


def epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value else None


def gpu_view(gpu: GPU) -> GpuView:
    return GpuView(gpu_id=gpu.pk, index=gpu.index, gpu_type=gpu_type_key(gpu.gpu_type), schedulable=gpu.health == GPU.Health.OK,
                   memory_mb=gpu.memory_mb)


def runs_containers(host: Host) -> bool:
    """Whether the host's agent runs jobs in OCI containers (its registration's runtime)."""
    return host.runtime in CONTAINER_BACKENDS


def host_view(host: Host, gpus: list[GPU]) -> HostView:
    return HostView(name=host.name, schedulable=host.state == Host.State.UP, gpus=tuple(gpu_view(g) for g in gpus),
                    runs_containers=runs_containers(host), own_uid_jobs=host.job_isolation == "own-uid")


def candidate(gpu: GPU, units_in_use: int) -> Candidate:
    """A GPU row (with its host selected) offered to a placement, holding `units_in_use` already."""
    return Candidate(gpu_view(gpu), gpu.host.name, gpu.host.state == Host.State.UP, units_in_use,
                     host_view(gpu.host, []))


def job_common(job: dict[str, Any], attained_gpu_seconds: float, now: float) -> dict[str, Any]:
    """The fields PendingJob and RunningJob share, from a row read with JOB_FIELDS."""
    return {
        "job_id": job["job_id"],
        "team": job["team_slug"],
        "user": job["username"],
        "gpus": job["gpus_"],
        "priority": Priority.from_name(job["priority_"]),
        "gpu_type": gpu_type_key(job["gpu_type_"]) or None,
        "attained_gpu_seconds": attained_gpu_seconds,
        "declared_steps": job["max_steps_"],
        "steps_done": job["steps_done_"],
        "observed_step_s": 1.0 / job["steps_per_second_"] if job["steps_per_second_"] else None,
        "time_limit_s": job["time_limit_minutes_"] * 60.0,
        "preemption_count": job["preemption_count_"],
        "similarity_key": similarity_key(job["workload_"]),
        "work_size": work_size(job["workload_"]),
        "preemptible": job["priority_"] != "urgent",
        "gpu_share": job["gpu_share_units_"] / 100,
        "gpu_memory_mb": job["gpu_memory_mb_"],
        "submitted_at": epoch(job["created_at_"]) or now,
        "needs_containers": bool(job["image_"]),
        # A process job's secrets (in its environment) and volumes (in its view): only under a uid no other job
        # shares, whose processes no other job can reach (host_needs.OWN_UID).
        "needs_own_uid": bool(job["secrets_"] or job["mounts_"]) and not job["image_"],
        "service_group": job["service_group_"] or None,
    }


def pending_job(job: Job, now: float) -> PendingJob:
    """A job model instance (with team and user) as the core sees a waiting job: what a placement checks."""
    row = {f"{name}_": getattr(job, name) for name in (
        "gpus", "priority", "gpu_type", "max_steps", "steps_done", "steps_per_second", "time_limit_minutes",
        "preemption_count", "workload", "gpu_share_units", "gpu_memory_mb", "created_at", "image",
        "service_group", "secrets", "mounts")}
    row.update(job_id=job.pk, team_slug=job.team.slug, username=job.user.get_username())
    return PendingJob(**job_common(row, 0.0, now))

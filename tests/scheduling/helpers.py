"""Small builders for scheduling tests (no database)."""

from __future__ import annotations

from apps.scheduling.types import GpuView, HostView, PendingJob, Priority, RunningJob, Snapshot, TeamQuotaView


def hosts(count: int, per_host: int, gpu_type: str = "a100", first_id: int = 0) -> tuple[HostView, ...]:
    return tuple(
        HostView(
            f"h{first_id // max(per_host, 1) + h}",
            tuple(GpuView(first_id + h * per_host + i, i, gpu_type) for i in range(per_host)),
        )
        for h in range(count)
    )


def pending(
    job_id: int, gpus: int = 1, team: str = "t", priority: Priority = Priority.NORMAL, **kw
) -> PendingJob:
    kw.setdefault("submitted_at", float(job_id))
    kw.setdefault("user", "u")
    return PendingJob(job_id=job_id, team=team, gpus=gpus, priority=priority, **kw)


def running(
    job_id: int, gpu_ids: tuple[int, ...], team: str = "t", priority: Priority = Priority.NORMAL, **kw
) -> RunningJob:
    kw.setdefault("started_at", 0.0)
    kw.setdefault("submitted_at", 0.0)
    kw.setdefault("user", "u")
    return RunningJob(job_id=job_id, team=team, gpus=len(gpu_ids), priority=priority, gpu_ids=gpu_ids, **kw)


def snapshot(host_views, pending_jobs=(), running_jobs=(), quotas=None, now: float = 100_000.0) -> Snapshot:
    total = sum(len(h.gpus) for h in host_views)
    return Snapshot(
        now=now,
        hosts=tuple(host_views),
        pending=tuple(pending_jobs),
        running=tuple(running_jobs),
        quotas=quotas if quotas is not None else {"t": TeamQuotaView("t", total)},
    )

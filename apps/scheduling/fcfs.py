"""First come, first served within priority: the console's first policy.

Jobs are taken by (priority descending, submit time, id). Each gets all of its GPUs or none, never beyond its
team's max_gpus (or a user's cap inside the team). Lower-priority jobs may still start when a higher one does not
fit (no reservation): the full scheduler adds backfill reservations, preemption and fair share.
"""

from __future__ import annotations

from collections import defaultdict

from apps.scheduling.placement import FreeGpus, choose_gpus
from apps.scheduling.types import Decisions, PendingInfo, PendingJob, Placement, Snapshot


def queue_order(job: PendingJob) -> tuple[int, float, int]:
    return (-int(job.priority), job.submitted_at, job.job_id)


def schedule_fcfs(snapshot: Snapshot) -> Decisions:
    free = FreeGpus.from_snapshot(snapshot)
    team_held: dict[str, int] = defaultdict(int)
    user_held: dict[tuple[str, str], int] = defaultdict(int)
    for running in snapshot.running:
        team_held[running.team] += running.gpus
        user_held[(running.team, running.user)] += running.gpus

    placements: list[Placement] = []
    pending: dict[int, PendingInfo] = {}
    position = 0
    for job in sorted(snapshot.pending, key=queue_order):
        quota = snapshot.quotas.get(job.team)
        if quota is None:
            position += 1
            pending[job.job_id] = PendingInfo(f"team {job.team} has no quota", position, code="quota")
            continue
        if team_held[job.team] + job.gpus > quota.max_gpus:
            position += 1
            code, reason = "quota", f"team {job.team} holds {team_held[job.team]} of {quota.max_gpus} GPUs"
            pending[job.job_id] = PendingInfo(reason, position, code=code)
            continue
        user_cap = quota.user_max_gpus.get(job.user)
        if user_cap is not None and user_held[(job.team, job.user)] + job.gpus > user_cap:
            position += 1
            held = user_held[(job.team, job.user)]
            code, reason = (
                "user_cap",
                f"user {job.user} holds {held} of {user_cap} GPUs allowed in team {job.team}",
            )
            pending[job.job_id] = PendingInfo(reason, position, code=code)
            continue
        gpu_ids = choose_gpus(free, job.gpus, job.gpu_type)
        if gpu_ids is None:
            position += 1
            kind = f" of type {job.gpu_type}" if job.gpu_type else ""
            available = free.count(job.gpu_type)
            code, reason = "waiting", f"waiting for {job.gpus} free GPUs{kind} ({available} free now)"
            pending[job.job_id] = PendingInfo(reason, position, code=code)
            continue
        free.take(gpu_ids)
        team_held[job.team] += job.gpus
        user_held[(job.team, job.user)] += job.gpus
        placements.append(Placement(job.job_id, gpu_ids))
    return Decisions(placements=tuple(placements), pending=pending)

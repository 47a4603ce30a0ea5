"""First come, first served within priority: the console's first policy.

Jobs are taken by (priority descending, submit time, id). Each gets all of its GPUs or none, never beyond its
team's max_gpus (or a user's cap inside the team). Lower-priority jobs may still start when a higher one does not
fit (no reservation): the full scheduler adds backfill reservations, preemption and fair share.
"""

from __future__ import annotations

from collections import defaultdict

from apps.scheduling.host_needs import host_need
from apps.scheduling.placement import FreeGpus, choose_gpus
from apps.scheduling.sharing import FULL, fmt_gpus, held_units, is_fractional, min_units
from apps.scheduling.types import Decisions, PendingInfo, PendingJob, Placement, Snapshot
from apps.scheduling.usage import budget_reason


def queue_order(job: PendingJob) -> tuple[int, float, int]:
    return (-int(job.priority), job.submitted_at, job.job_id)


def schedule_fcfs(snapshot: Snapshot) -> Decisions:
    free = FreeGpus.from_snapshot(snapshot)
    # GPUs held, in units of 1/100 GPU (fractions count their share: sharing.py)
    team_held: dict[str, int] = defaultdict(int)
    user_held: dict[tuple[str, str], int] = defaultdict(int)
    for running in snapshot.running:
        team_held[running.team] += held_units(running)
        user_held[(running.team, running.user)] += held_units(running)

    placements: list[Placement] = []
    pending: dict[int, PendingInfo] = {}
    position = 0
    for job in sorted(snapshot.pending, key=queue_order):
        quota = snapshot.quotas.get(job.team)
        if quota is None:
            position += 1
            pending[job.job_id] = PendingInfo(f"team {job.team} has no quota", position, code="no_quota")
            continue
        if quota.budget_spent:
            position += 1
            pending[job.job_id] = PendingInfo(budget_reason(job.team), position, code="budget")
            continue
        need = min_units(job)
        held = team_held[job.team]
        if held + need > FULL * quota.max_gpus:
            position += 1
            code, reason = "quota", f"team {job.team} holds {fmt_gpus(held)} of {quota.max_gpus} GPUs"
            pending[job.job_id] = PendingInfo(reason, position, code=code)
            continue
        user_cap = quota.user_max_gpus.get(job.user)
        if user_cap is not None and user_held[(job.team, job.user)] + need > FULL * user_cap:
            position += 1
            user = fmt_gpus(user_held[(job.team, job.user)])
            code, reason = (
                "user_cap",
                f"user {job.user} holds {user} of {user_cap} GPUs allowed in team {job.team}",
            )
            pending[job.job_id] = PendingInfo(reason, position, code=code)
            continue
        choice = _choose(free, job)
        if choice is not None and (
            held + choice[1] > FULL * quota.max_gpus
            or (user_cap is not None and user_held[(job.team, job.user)] + choice[1] > FULL * user_cap)
        ):
            # A memory request takes more of the chosen GPU than the quota allows: put it back.
            free.give_share(choice[0][0], choice[1], job.gpu_memory_mb or 0)
            choice = None
        needed = host_need(job)
        if choice is None and needed is not None and not free.need_hosts[needed.key]:
            position += 1
            pending[job.job_id] = PendingInfo(needed.no_host, position, code="no_runtime")
            continue
        if choice is None:
            position += 1
            kind = f" of type {job.gpu_type}" if job.gpu_type else ""
            available = free.count(job.gpu_type)
            asked = f"{job.gpus} free GPUs" if not is_fractional(job) else "room on a GPU"
            code, reason = "waiting", f"waiting for {asked}{kind} ({available} free now)"
            pending[job.job_id] = PendingInfo(reason, position, code=code)
            continue
        gpu_ids, units = choice
        team_held[job.team] += units
        user_held[(job.team, job.user)] += units
        placements.append(Placement(job.job_id, gpu_ids, gpu_share=1.0 if units >= FULL else units / FULL))
    return Decisions(placements=tuple(placements), pending=pending)


def _choose(free: FreeGpus, job: PendingJob) -> tuple[tuple[int, ...], int] | None:
    """Takes and returns (gpu ids, units in all) for the job, or None."""
    if is_fractional(job):
        found = free.choose_share(job, min_units(job))
        if found is None:
            return None
        free.take_share(found[0], found[1], job.gpu_memory_mb or 0)
        return (found[0],), found[1]
    gpu_ids = choose_gpus(free, job.gpus, job.gpu_type, hosts=free.hosts_for(job))
    if gpu_ids is None:
        return None
    free.take(gpu_ids)
    return gpu_ids, FULL * job.gpus

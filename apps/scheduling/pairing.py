"""Which fractional jobs share a GPU: among the fractions one pass placed with the same share, swap GPUs so that
each lands beside the job whose resource profile complements its own (interference.py), without changing how much
of any GPU is used. Used by the simulator's `console-share` policy, which knows the jobs' profiles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from apps.scheduling.interference import Profile, slowdowns
from apps.scheduling.types import Decisions, Placement, Snapshot


def _cost(group: list[Profile], switch_overhead: float) -> float:
    # Summed slowdowns: the run time a group loses against each job running alone.
    return sum(slowdowns(group, switch_overhead))


def pair_complementary(
    decisions: Decisions,
    snapshot: Snapshot,
    profile_of: Callable[[int], Profile],
    switch_overhead: float = 0.0,
) -> Decisions:
    stopped = {p.job_id for p in decisions.preemptions}
    occupants: dict[int, list[int]] = {}
    for job in snapshot.running:
        if job.gpu_share < 1.0 and job.job_id not in stopped:
            for gpu_id in job.gpu_ids:
                occupants.setdefault(gpu_id, []).append(job.job_id)
    by_share: dict[float, list[Placement]] = {}
    for placement in decisions.placements:
        if placement.gpu_share < 1.0:
            by_share.setdefault(placement.gpu_share, []).append(placement)
    moved: dict[int, Placement] = {}
    for placements in by_share.values():
        if len(placements) < 2:
            continue
        pool = list(placements)
        slots: dict[int, int] = {}
        for placement in placements:
            slots[placement.gpu_ids[0]] = slots.get(placement.gpu_ids[0], 0) + 1
        # GPUs that already hold a running fraction first: their partner is fixed.
        for gpu_id in sorted(slots, key=lambda g: (g not in occupants, g)):
            group = [profile_of(j) for j in occupants.get(gpu_id, [])]
            for _ in range(slots[gpu_id]):
                best = min(pool, key=lambda p: _cost([*group, profile_of(p.job_id)], switch_overhead))
                pool.remove(best)
                group.append(profile_of(best.job_id))
                moved[best.job_id] = replace(best, gpu_ids=(gpu_id,))
    if not moved:
        return decisions
    return replace(decisions, placements=tuple(moved.get(p.job_id, p) for p in decisions.placements))

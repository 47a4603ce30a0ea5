"""Packing of gang jobs (Muri-style interleaving): which waiting job joins which running group on its GPU set.

A group is the running jobs that hold exactly the same GPUs (a job alone is a group of one). A waiting job of N
GPUs (1, 2, 4, 8, ...) may join a group of N-GPU jobs of fewer than `limit` members; the whole group is then
interleaved on those GPUs, each member slowed by the interference model (interference.py: joint rounds). A join
is allowed only when every member's predicted slowdown stays at most `max_slowdown` and the group's combined
normalized throughput (the sum over members of 1 / slowdown) grows by more than `min_gain` (a group of one has
throughput 1: a pair must beat running its jobs one after the other by that much). Among the allowed groups a
job takes the one with the largest gain (Muri's "interleaving efficiency"), ties to the smallest worst slowdown.

Jobs are taken in the order given (the policy's queue order); profiles come from `profile_of`, which answers only
what the console would know (a job's measured step and per-resource times once it has run, or those of an earlier
job of the same workload) and None otherwise: such a job is not packed. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from apps.scheduling.interference import Profile, slowdowns
from apps.scheduling.types import PendingJob, RunningJob


@dataclass(frozen=True, slots=True)
class PackingConfig:
    max_slowdown: float = 1.5
    min_gain: float = 0.2
    limit: int = 4
    switch_overhead: float = 0.0


def throughput(profiles: Sequence[Profile], switch_overhead: float = 0.0) -> float:
    """Sum over the jobs of their speed in the group relative to alone (1.0 for one job)."""
    return sum(1.0 / s for s in slowdowns(profiles, switch_overhead))


@lru_cache(maxsize=65536)
def _effect(profiles: tuple[Profile, ...], switch_overhead: float) -> tuple[float, float]:
    """(worst slowdown, throughput) of a group; order-free, so keyed by the sorted profiles."""
    factors = slowdowns(profiles, switch_overhead)
    return max(factors), sum(1.0 / f for f in factors)


def effect(profiles: Sequence[Profile], switch_overhead: float = 0.0) -> tuple[float, float]:
    return _effect(tuple(sorted(profiles)), switch_overhead)


def groups_of(running: Sequence[RunningJob]) -> dict[tuple[int, ...], list[int]]:
    """Sorted GPU ids -> the whole-GPU running jobs that hold exactly those GPUs."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for job in running:
        if job.gpus == 1 and job.gpu_share < 1.0:
            continue  # a fraction (sharing.py), not a packable group
        groups.setdefault(tuple(sorted(job.gpu_ids)), []).append(job.job_id)
    return groups


def plan_packing(
    waiting: Sequence[PendingJob],
    running: Sequence[RunningJob],
    profile_of: Callable[[int], Profile | None],
    config: PackingConfig,
) -> list[tuple[int, tuple[int, ...]]]:
    """(waiting job, GPU set to join) in the order to apply them."""
    groups = {key: members for key, members in groups_of(running).items() if len(members) < config.limit}
    known: dict[int, Profile] = {}
    for members in groups.values():
        for member in members:
            found = profile_of(member)
            if found is not None:
                known[member] = found
    groups = {key: members for key, members in groups.items() if all(m in known for m in members)}
    by_size: dict[int, list[tuple[int, ...]]] = {}
    for key in groups:
        by_size.setdefault(len(key), []).append(key)
    joins: list[tuple[int, tuple[int, ...]]] = []
    # (profile, GPUs) that found no group: the same again finds none until a join changes the groups.
    refused: set[tuple[Profile, int]] = set()
    for job in waiting:
        keys = by_size.get(job.gpus)
        if not keys:
            continue
        mine = profile_of(job.job_id)
        if mine is None or (mine, job.gpus) in refused:
            continue
        best: tuple[float, float, tuple[int, ...]] | None = None
        for key in keys:
            group = [known[m] for m in groups[key]]
            worst, after = effect([*group, mine], config.switch_overhead)
            if worst > config.max_slowdown:
                continue
            gain = after - effect(group, config.switch_overhead)[1]
            if gain <= config.min_gain:
                continue
            if best is None or (gain, -worst) > (best[0], -best[1]):
                best = (gain, worst, key)
        if best is None:
            refused.add((mine, job.gpus))
            continue
        key = best[2]
        joins.append((job.job_id, key))
        groups[key].append(job.job_id)
        known[job.job_id] = mine
        refused.clear()
        if len(groups[key]) >= config.limit:
            by_size[len(key)].remove(key)
    return joins

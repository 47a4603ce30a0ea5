"""Estimated start times for waiting jobs, by counting GPUs as running jobs end.

The queue is replayed in order on a per-type GPU count (no hosts): each job starts when enough GPUs of its type
are free, no earlier than the job ahead of it, and frees them after its predicted run time. This ignores backfill
and fragmentation, so it is an estimate, computed in O(n log n) for the whole queue.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueuedDemand:
    job_id: int
    gpus: int
    gpu_type: str | None
    runtime_s: float
    # Known start (the head's reservation): the replay uses it instead of its own.
    fixed_start: float | None = None


def estimate_starts(
    now: float,
    free_by_type: dict[str, int],
    capacity_by_type: dict[str, int],
    releases: list[tuple[float, str, int]],
    queue: list[QueuedDemand],
) -> dict[int, float | None]:
    heaps: dict[str, list[tuple[float, int]]] = {t: [] for t in capacity_by_type}
    for at, gpu_type, gpus in releases:
        if gpu_type in heaps:
            heaps[gpu_type].append((at, gpus))
    for heap in heaps.values():
        heapq.heapify(heap)
    available = {t: free_by_type.get(t, 0) for t in capacity_by_type}
    clock = {t: now for t in capacity_by_type}
    # Untyped jobs are counted on the type with the most GPUs (a simplification of "any type").
    default_type = max(capacity_by_type, key=lambda t: (capacity_by_type[t], t), default=None)
    starts: dict[int, float | None] = {}
    for demand in queue:
        gpu_type = demand.gpu_type or default_type
        if gpu_type is None or gpu_type not in heaps or demand.gpus > capacity_by_type[gpu_type]:
            starts[demand.job_id] = None
            continue
        heap = heaps[gpu_type]
        while available[gpu_type] < demand.gpus and heap:
            at, gpus = heapq.heappop(heap)
            available[gpu_type] += gpus
            clock[gpu_type] = max(clock[gpu_type], at)
        if available[gpu_type] < demand.gpus:
            starts[demand.job_id] = None
            continue
        start = clock[gpu_type] if demand.fixed_start is None else max(demand.fixed_start, now)
        clock[gpu_type] = max(clock[gpu_type], start)
        available[gpu_type] -= demand.gpus
        heapq.heappush(heap, (start + demand.runtime_s, demand.gpus))
        starts[demand.job_id] = start
    return starts

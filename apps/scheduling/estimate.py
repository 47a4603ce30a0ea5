"""Estimated start times for waiting jobs, by counting GPUs as running jobs end.

The queue is replayed in order on a per-type GPU count (no hosts): each job starts when enough GPUs of its type
are free, no earlier than the job ahead of it, and frees them after its predicted run time. This ignores backfill
and fragmentation, so it is an estimate, computed in O(n log n) for the whole queue.
"""

from __future__ import annotations

import heapq

# (job id, gpus, gpu type or None, predicted run time, known start or None): the head's reservation is known.
QueuedDemand = tuple[int, int, str | None, float, float | None]


def estimate_starts(
    now: float,
    free_by_type: dict[str, int],
    capacity_by_type: dict[str, int],
    releases: list[tuple[float, str, int]],
    queue: list[QueuedDemand],
) -> dict[int, float | None]:
    heaps: dict[str, list[tuple[float, int]]] = {t: [] for t in capacity_by_type}
    for at, released_type, gpus in releases:
        if released_type in heaps:
            heaps[released_type].append((at, gpus))
    for heap in heaps.values():
        heapq.heapify(heap)
    available = {t: free_by_type.get(t, 0) for t in capacity_by_type}
    clock = {t: now for t in capacity_by_type}
    # Untyped jobs are counted on the type with the most GPUs (a simplification of "any type").
    default_type = max(capacity_by_type, key=lambda t: (capacity_by_type[t], t), default=None)
    starts: dict[int, float | None] = {}
    for job_id, needed, wanted_type, runtime_s, fixed_start in queue:
        gpu_type = wanted_type or default_type
        if gpu_type is None or gpu_type not in heaps or needed > capacity_by_type[gpu_type]:
            starts[job_id] = None
            continue
        heap = heaps[gpu_type]
        while available[gpu_type] < needed and heap:
            at, gpus = heapq.heappop(heap)
            available[gpu_type] += gpus
            if at > clock[gpu_type]:
                clock[gpu_type] = at
        if available[gpu_type] < needed:
            starts[job_id] = None
            continue
        start = clock[gpu_type] if fixed_start is None else max(fixed_start, now)
        clock[gpu_type] = max(clock[gpu_type], start)
        available[gpu_type] -= needed
        heapq.heappush(heap, (start + runtime_s, needed))
        starts[job_id] = start
    return starts

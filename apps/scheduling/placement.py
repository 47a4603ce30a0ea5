"""Choosing GPUs for a gang: all or nothing, on the fewest hosts, same host first.

`FreeGpus` indexes the free, schedulable GPUs by type and host, and keeps hosts bucketed by how many free GPUs of
a type they have, so that a single-host fit is found in O(GPUs per host) rather than by scanning every host.
"""

from __future__ import annotations

from collections.abc import Iterable

from apps.scheduling.types import Snapshot


class FreeGpus:
    """Free GPUs of schedulable hosts, by type and host; mutable scratch state of one scheduling pass."""

    def __init__(self, host_order: dict[str, int], host_capacity: dict[str, int]) -> None:
        # host name -> rank in the snapshot, for deterministic ties
        self.host_order = host_order
        # gpu type -> most schedulable GPUs of that type on any one host (the consolidation unit)
        self.host_capacity = host_capacity
        # gpu type -> host -> free gpu ids (ascending index order)
        self.free: dict[str, dict[str, list[int]]] = {}
        # gpu type -> number of free GPUs -> hosts with exactly that many free
        self.buckets: dict[str, dict[int, dict[str, None]]] = {}
        self.totals: dict[str, int] = {}
        # gpu id -> (host, type, index); every schedulable GPU, busy or not
        self.location: dict[int, tuple[str, str, int]] = {}
        # Bumped whenever GPUs come back: a gang that did not fit cannot fit until then.
        self.version = 0

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> FreeGpus:
        busy = {gpu_id for job in snapshot.running for gpu_id in job.gpu_ids}
        host_order: dict[str, int] = {}
        capacity: dict[str, int] = {}
        for rank, host in enumerate(snapshot.hosts):
            host_order[host.name] = rank
            if not host.schedulable:
                continue
            per_type: dict[str, int] = {}
            for gpu in host.gpus:
                if gpu.schedulable:
                    per_type[gpu.gpu_type] = per_type.get(gpu.gpu_type, 0) + 1
            for gpu_type, count in per_type.items():
                capacity[gpu_type] = max(capacity.get(gpu_type, 0), count)
        free = cls(host_order, capacity)
        for host in snapshot.hosts:
            if not host.schedulable:
                continue
            for gpu in host.gpus:
                if gpu.schedulable:
                    free.location[gpu.gpu_id] = (host.name, gpu.gpu_type, gpu.index)
        free.give(gpu_id for gpu_id in free.location if gpu_id not in busy)
        return free

    def copy(self) -> FreeGpus:
        clone = FreeGpus(self.host_order, self.host_capacity)
        clone.free = {t: {h: list(ids) for h, ids in hosts.items()} for t, hosts in self.free.items()}
        clone.buckets = {t: {n: dict(hosts) for n, hosts in by_n.items()} for t, by_n in self.buckets.items()}
        clone.totals = dict(self.totals)
        clone.location = self.location
        return clone

    def types(self) -> list[str]:
        return sorted(self.host_capacity)

    def count(self, gpu_type: str | None) -> int:
        if gpu_type is not None:
            return self.totals.get(gpu_type, 0)
        return sum(self.totals.values())

    def largest_block(self, gpu_type: str | None) -> int:
        """Most free GPUs of one type on a single host."""
        best = 0
        for candidate in [gpu_type] if gpu_type else self.types():
            sizes = [n for n, hosts in self.buckets.get(candidate, {}).items() if hosts]
            best = max([best, *sizes])
        return best

    def is_free(self, gpu_id: int) -> bool:
        where = self.location.get(gpu_id)
        return where is not None and gpu_id in self.free.get(where[1], {}).get(where[0], ())

    def _move_bucket(self, gpu_type: str, host: str, old: int, new: int) -> None:
        buckets = self.buckets.setdefault(gpu_type, {})
        if old:
            del buckets[old][host]
        if new:
            buckets.setdefault(new, {})[host] = None

    def take(self, gpu_ids: Iterable[int]) -> None:
        for gpu_id in gpu_ids:
            host, gpu_type, _ = self.location[gpu_id]
            ids = self.free[gpu_type][host]
            ids.remove(gpu_id)
            self._move_bucket(gpu_type, host, len(ids) + 1, len(ids))
            self.totals[gpu_type] -= 1
            if not ids:
                del self.free[gpu_type][host]

    def give(self, gpu_ids: Iterable[int]) -> None:
        """Return GPUs to the pool (ids that are not schedulable are ignored: they get no new jobs)."""
        self.version += 1
        for gpu_id in gpu_ids:
            where = self.location.get(gpu_id)
            if where is None:
                continue
            host, gpu_type, index = where
            ids = self.free.setdefault(gpu_type, {}).setdefault(host, [])
            ids.append(gpu_id)
            if len(ids) > 1 and self.location[ids[-2]][2] > index:
                ids.sort(key=lambda g: self.location[g][2])
            self._move_bucket(gpu_type, host, len(ids) - 1, len(ids))
            self.totals[gpu_type] = self.totals.get(gpu_type, 0) + 1

    def max_hosts(self, count: int, gpu_type: str, consolidate: bool) -> int | None:
        """How many hosts a gang may span: the fewest that could hold it, when consolidating."""
        if not consolidate:
            return None
        capacity = self.host_capacity.get(gpu_type, 0)
        if capacity <= 0:
            return 0
        return -(-count // capacity)


def _choose_of_type(free: FreeGpus, count: int, gpu_type: str, consolidate: bool) -> tuple[int, ...] | None:
    if free.totals.get(gpu_type, 0) < count:
        return None
    hosts = free.free[gpu_type]
    capacity = free.host_capacity.get(gpu_type, 0)
    buckets = free.buckets.get(gpu_type, {})
    # Best fit on one host: the host with the fewest free GPUs that still holds the gang keeps whole hosts free.
    for size in range(count, capacity + 1):
        bucket = buckets.get(size)
        if bucket:
            host = min(bucket, key=free.host_order.__getitem__)
            return tuple(hosts[host][:count])
    limit = free.max_hosts(count, gpu_type, consolidate)
    chosen: list[int] = []
    for used, host in enumerate(sorted(hosts, key=lambda h: (-len(hosts[h]), free.host_order[h]))):
        if limit is not None and used >= limit:
            return None
        chosen.extend(hosts[host][: count - len(chosen)])
        if len(chosen) == count:
            return tuple(chosen)
    return None


def choose_gpus(
    free: FreeGpus, count: int, gpu_type: str | None, consolidate: bool = True
) -> tuple[int, ...] | None:
    """Pick `count` free GPUs of one type, packed onto as few hosts as possible, or None.

    A gang that fits on one host goes to the host with the fewest free matching GPUs that still fits it (best
    fit). A larger gang takes the hosts with the most free GPUs first. With `consolidate`, a gang never spans more
    hosts than the fewest that could hold it (a 4-GPU job waits for one host with 4 free GPUs rather than being
    split 2+2). Without a requested type, a gang still gets GPUs of a single type.
    """
    if count <= 0:
        return ()
    if (free.totals.get(gpu_type, 0) if gpu_type else max(free.totals.values(), default=0)) < count:
        return None
    best: tuple[int, ...] | None = None
    best_hosts = 0
    for candidate in [gpu_type] if gpu_type else free.types():
        chosen = _choose_of_type(free, count, candidate, consolidate)
        if chosen is None:
            continue
        hosts_used = len({free.location[g][0] for g in chosen})
        if best is None or hosts_used < best_hosts:
            best, best_hosts = chosen, hosts_used
    return best

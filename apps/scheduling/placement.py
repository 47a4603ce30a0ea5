"""Choosing GPUs for a gang: all or nothing, on the fewest hosts, same host first; and a GPU for a fraction.

`FreeGpus` indexes the free, schedulable GPUs by type and host, and keeps hosts bucketed by how many free GPUs of
a type they have, so that a single-host fit is found in O(GPUs per host) rather than by scanning every host.
GPUs partly used by fractional jobs (sharing.py) are not free: whole and gang jobs never see them. They are
indexed apart, bucketed by the units they have left, so that a fraction finds its best fit in O(100).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from apps.scheduling.host_needs import NEEDS, host_need, meets
from apps.scheduling.sharing import FULL, held_units, is_fractional, units_on
from apps.scheduling.types import PendingJob, RunningJob, Snapshot


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
        # Fractions: gpu id -> units / memory in use, for GPUs partly (or fully) used by fractional jobs only.
        self.used: dict[int, int] = {}
        self.memory_used: dict[int, int] = {}
        # gpu id -> memory of the GPU in MB (0: unknown)
        self.memory: dict[int, int] = {}
        # gpu type -> units left -> shared GPUs with that much room (1..FULL-1)
        self.room: dict[str, dict[int, dict[int, None]]] = {}
        # gpu type -> host -> number of GPUs there used by fractions
        self.shared_hosts: dict[str, dict[str, int]] = {}
        # HostNeed key -> the schedulable hosts that meet it (the only ones a job with that need may use), and per
        # gpu type the schedulable GPUs on each host (for the widest of them).
        self.need_hosts: dict[str, frozenset[str]] = {need.key: frozenset() for need in NEEDS}
        self.host_gpus: dict[str, dict[str, int]] = {}

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> FreeGpus:
        busy = {gpu_id for job in snapshot.running if not is_fractional(job) for gpu_id in job.gpu_ids}
        host_order: dict[str, int] = {}
        capacity: dict[str, int] = {}
        host_gpus: dict[str, dict[str, int]] = {}
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
                host_gpus.setdefault(gpu_type, {})[host.name] = count
        free = cls(host_order, capacity)
        free.host_gpus = host_gpus
        free.need_hosts = {need.key: frozenset(h.name for h in snapshot.hosts if h.schedulable and meets(h, need))
                           for need in NEEDS}
        for host in snapshot.hosts:
            if not host.schedulable:
                continue
            for gpu in host.gpus:
                if gpu.schedulable:
                    free.location[gpu.gpu_id] = (host.name, gpu.gpu_type, gpu.index)
                    free.memory[gpu.gpu_id] = gpu.memory_mb
        free.give(gpu_id for gpu_id in free.location if gpu_id not in busy)
        for job in snapshot.running:
            if is_fractional(job):
                for gpu_id in job.gpu_ids:
                    if gpu_id not in busy and gpu_id in free.location:
                        free.take_share(gpu_id, held_units(job), job.gpu_memory_mb or 0)
        return free

    def copy(self) -> FreeGpus:
        clone = FreeGpus(self.host_order, self.host_capacity)
        clone.free = {t: {h: list(ids) for h, ids in hosts.items()} for t, hosts in self.free.items()}
        clone.buckets = {t: {n: dict(hosts) for n, hosts in by_n.items()} for t, by_n in self.buckets.items()}
        clone.totals = dict(self.totals)
        clone.location = self.location
        clone.memory = self.memory
        clone.used = dict(self.used)
        clone.memory_used = dict(self.memory_used)
        clone.room = {t: {n: dict(ids) for n, ids in by_n.items()} for t, by_n in self.room.items()}
        clone.shared_hosts = {t: dict(hosts) for t, hosts in self.shared_hosts.items()}
        clone.need_hosts = self.need_hosts
        clone.host_gpus = self.host_gpus
        return clone

    def hosts_for(self, job: PendingJob | RunningJob) -> frozenset[str] | None:
        """The hosts `job` may use when not all: those that meet its need (host_needs.host_need)."""
        need = host_need(job)
        return None if need is None else self.need_hosts[need.key]

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

    # -- fractions ----------------------------------------------------------------------------------------------
    def _set_room(self, gpu_id: int, old: int, new: int) -> None:
        """Move a shared GPU between room buckets (0 or FULL: in no bucket)."""
        gpu_type = self.location[gpu_id][1]
        room = self.room.setdefault(gpu_type, {})
        if 0 < old < FULL:
            del room[old][gpu_id]
        if 0 < new < FULL:
            room.setdefault(new, {})[gpu_id] = None

    def take_share(self, gpu_id: int, units: int, memory_mb: int = 0) -> None:
        """Give `units` of a GPU to a fraction: a whole free GPU becomes shared (a GPU outside the pool, e.g. held
        for a reservation, may be passed too: it is simply marked shared)."""
        host, gpu_type, _ = self.location[gpu_id]
        used = self.used.get(gpu_id)
        if used is None:
            if self.is_free(gpu_id):
                self.take((gpu_id,))
            used = 0
            hosts = self.shared_hosts.setdefault(gpu_type, {})
            hosts[host] = hosts.get(host, 0) + 1
        self.used[gpu_id] = used + units
        self.memory_used[gpu_id] = self.memory_used.get(gpu_id, 0) + memory_mb
        self._set_room(gpu_id, FULL - used if used else 0, FULL - used - units)

    def give_share(self, gpu_id: int, units: int, memory_mb: int = 0, to_pool: bool = True) -> bool:
        """A fraction leaves a GPU; True when the GPU is then empty (back in the pool unless `to_pool` is False)."""
        used = self.used.get(gpu_id)
        if used is None or gpu_id not in self.location:
            return False
        left = used - units
        self.version += 1
        self._set_room(gpu_id, FULL - used, FULL - left if left > 0 else 0)
        if left > 0:
            self.used[gpu_id] = left
            self.memory_used[gpu_id] = self.memory_used.get(gpu_id, 0) - memory_mb
            return False
        del self.used[gpu_id]
        self.memory_used.pop(gpu_id, None)
        host, gpu_type, _ = self.location[gpu_id]
        hosts = self.shared_hosts[gpu_type]
        hosts[host] -= 1
        if not hosts[host]:
            del hosts[host]
        if to_pool:
            self.give((gpu_id,))
        return True

    def _fits_share(self, job: PendingJob, gpu_id: int, room: int) -> int | None:
        units = units_on(job, self.memory.get(gpu_id, 0))
        if units is None or units > room:
            return None
        memory = self.memory.get(gpu_id, 0)
        if job.gpu_memory_mb and memory and self.memory_used.get(gpu_id, 0) + job.gpu_memory_mb > memory:
            return None
        return units

    def choose_share(
        self, job: PendingJob, least_units: int, fence: Collection[int] = ()
    ) -> tuple[int, int] | None:
        """(gpu id, units) for a fractional job, or None; GPUs in `fence` are not used.

        Best fit among shared GPUs (the one with the least room that still fits: least fragmentation); only when
        none fits, a whole free GPU, preferring hosts that already hold fractions, then the host with the fewest
        free GPUs (best fit, as for gangs), so that whole hosts stay free for gangs.
        """
        types = [job.gpu_type] if job.gpu_type else self.types()
        allowed = self.hosts_for(job)
        best: tuple[int, int, int, int, int] | None = None  # (room left, host rank, index, gpu id, units)
        for gpu_type in types:
            buckets = self.room.get(gpu_type)
            if not buckets:
                continue
            found = False
            for room in range(least_units, FULL):
                if found and job.gpu_memory_mb is None:
                    break  # same units on every GPU: the first room that fits is the best fit
                bucket = buckets.get(room)
                if not bucket:
                    continue
                for gpu_id in bucket:
                    if gpu_id in fence or allowed is not None and self.location[gpu_id][0] not in allowed:
                        continue
                    units = self._fits_share(job, gpu_id, room)
                    if units is None:
                        continue
                    found = True
                    host, _, index = self.location[gpu_id]
                    key = (room - units, self.host_order[host], index, gpu_id, units)
                    if best is None or key < best:
                        best = key
        if best is not None:
            return best[3], best[4]
        opened: tuple[int, int, int, int] | None = None  # (free on host, host rank, gpu id, units)
        for gpu_type in types:
            hosts = self.free.get(gpu_type)
            if not hosts:
                continue
            shared = self.shared_hosts.get(gpu_type, {})
            for host in [h for h in shared if h in hosts and (allowed is None or h in allowed)]:
                fit = self._first_fit(job, hosts[host], fence)
                if fit is not None:
                    rank = (len(hosts[host]), self.host_order[host], *fit)
                    opened = rank if opened is None or rank < opened else opened
        if opened is not None:
            return opened[2], opened[3]
        for gpu_type in types:
            hosts = self.free.get(gpu_type)
            if not hosts:
                continue
            for host in self._fewest_free_hosts(gpu_type):
                if allowed is not None and host not in allowed:
                    continue
                fit = self._first_fit(job, hosts[host], fence)
                if fit is not None:
                    rank = (len(hosts[host]), self.host_order[host], *fit)
                    opened = rank if opened is None or rank < opened else opened
                    break
        return (opened[2], opened[3]) if opened is not None else None

    def _first_fit(self, job: PendingJob, gpu_ids: list[int], fence: Collection[int]) -> tuple[int, int] | None:
        for gpu_id in gpu_ids:
            if gpu_id not in fence:
                units = self._fits_share(job, gpu_id, FULL)
                if units is not None:
                    return gpu_id, units
        return None

    def _fewest_free_hosts(self, gpu_type: str) -> Iterable[str]:
        """Hosts with free GPUs of the type, fewest free first (ties by rank), lazily."""
        buckets = self.buckets.get(gpu_type, {})
        for size in sorted(n for n, hosts in buckets.items() if hosts):
            yield from sorted(buckets[size], key=self.host_order.__getitem__)

    def max_hosts(self, count: int, gpu_type: str, consolidate: bool) -> int | None:
        """How many hosts a gang may span: the fewest that could hold it, when consolidating."""
        if not consolidate:
            return None
        capacity = self.host_capacity.get(gpu_type, 0)
        if capacity <= 0:
            return 0
        return -(-count // capacity)


def _choose_of_type(free: FreeGpus, count: int, gpu_type: str, consolidate: bool,
                    allowed: Collection[str] | None = None) -> tuple[int, ...] | None:
    if free.totals.get(gpu_type, 0) < count:
        return None
    if allowed is not None:
        return _choose_on_hosts(free, count, gpu_type, consolidate, allowed)
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
    return _spread(free, hosts, count, limit)


def _choose_on_hosts(free: FreeGpus, count: int, gpu_type: str, consolidate: bool,
                     allowed: Collection[str]) -> tuple[int, ...] | None:
    """_choose_of_type among some hosts only (those that meet a job's need): the same rules, by a scan of them."""
    hosts = {h: ids for h, ids in free.free.get(gpu_type, {}).items() if h in allowed and ids}
    if sum(len(ids) for ids in hosts.values()) < count:
        return None
    fits = [h for h, ids in hosts.items() if len(ids) >= count]
    if fits:
        host = min(fits, key=lambda h: (len(hosts[h]), free.host_order[h]))
        return tuple(hosts[host][:count])
    widest = max((n for h, n in free.host_gpus.get(gpu_type, {}).items() if h in allowed), default=0)
    if consolidate and widest <= 0:
        return None
    return _spread(free, hosts, count, -(-count // widest) if consolidate else None)


def _spread(free: FreeGpus, hosts: dict[str, list[int]], count: int, limit: int | None) -> tuple[int, ...] | None:
    """A gang across the hosts with the most free GPUs first, on at most `limit` hosts."""
    chosen: list[int] = []
    for used, host in enumerate(sorted(hosts, key=lambda h: (-len(hosts[h]), free.host_order[h]))):
        if limit is not None and used >= limit:
            return None
        chosen.extend(hosts[host][: count - len(chosen)])
        if len(chosen) == count:
            return tuple(chosen)
    return None


def choose_gpus(
    free: FreeGpus, count: int, gpu_type: str | None, consolidate: bool = True,
    hosts: Collection[str] | None = None,
) -> tuple[int, ...] | None:
    """Pick `count` free GPUs of one type, packed onto as few hosts as possible, or None.

    A gang that fits on one host goes to the host with the fewest free matching GPUs that still fits it (best
    fit). A larger gang takes the hosts with the most free GPUs first. With `consolidate`, a gang never spans more
    hosts than the fewest that could hold it (a 4-GPU job waits for one host with 4 free GPUs rather than being
    split 2+2). Without a requested type, a gang still gets GPUs of a single type. `hosts`: only these hosts
    (FreeGpus.hosts_for a job); None: any.
    """
    if count <= 0:
        return ()
    if (free.totals.get(gpu_type, 0) if gpu_type else max(free.totals.values(), default=0)) < count:
        return None
    best: tuple[int, ...] | None = None
    best_hosts = 0
    for candidate in [gpu_type] if gpu_type else free.types():
        chosen = _choose_of_type(free, count, candidate, consolidate, hosts)
        if chosen is None:
            continue
        hosts_used = len({free.location[g][0] for g in chosen})
        if best is None or hosts_used < best_hosts:
            best, best_hosts = chosen, hosts_used
    return best

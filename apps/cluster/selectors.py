from __future__ import annotations

import json
from dataclasses import dataclass, field

from django.db import connection
from django.db.models import QuerySet

from apps.accounts import access
from apps.accounts.access import AnyUser
from apps.cluster.models import GPU, Host
from apps.scheduling.placeability import gpu_type_key


def hosts_visible_to(user: AnyUser) -> QuerySet[Host]:
    """Admins and anyone with a role in some team see the cluster's hosts; others see nothing."""
    return access.restrict(Host.objects.prefetch_related("gpus"), user, access.Action.VIEW)


def known_gpu_types() -> set[str]:
    return {gpu_type_key(name) for name in GPU.objects.values_list("gpu_type", flat=True).distinct()}


@dataclass(frozen=True)
class GpuPools:
    """The cluster's GPUs by type: how many are not faulty and the largest memory among those."""

    counts: dict[str, int]
    memory_mb: dict[str, int]
    # Per type: the most CPUs and memory (MiB) one host with such GPUs reported (0: unknown), and the most of
    # these GPUs one host has.
    host_cpus: dict[str, int] = field(default_factory=dict)
    host_memory_mb: dict[str, int] = field(default_factory=dict)
    per_host: dict[str, int] = field(default_factory=dict)

    def known(self, gpu_type: str) -> bool:
        return gpu_type_key(gpu_type) in self.counts

    def largest_pool(self, gpu_type: str | None) -> int:
        """The most GPUs a single job could ever get (of this type, or of the most common one)."""
        return self.counts.get(gpu_type, 0) if gpu_type else max(self.counts.values(), default=0)

    def largest_memory_mb(self, gpu_type: str | None) -> int:
        return self.memory_mb.get(gpu_type, 0) if gpu_type else max(self.memory_mb.values(), default=0)

    def _largest(self, values: dict[str, int], gpu_type: str | None) -> int:
        return values.get(gpu_type, 0) if gpu_type else max(values.values(), default=0)

    def host_capacity(self, gpu_type: str | None) -> tuple[int, int, int]:
        """(CPUs, memory MiB, GPUs) of the largest host of this GPU type (of any, without one); 0: unknown."""
        return (self._largest(self.host_cpus, gpu_type), self._largest(self.host_memory_mb, gpu_type),
                self._largest(self.per_host, gpu_type))


# The GPUs by type: how many are usable (not faulty), the largest memory among those, and the largest host
# (CPUs, memory, GPUs of the type) that has them.
_POOLS_SQL = f"""
    SELECT q.gpu_type, SUM(q.n) AS n, MAX(q.memory_mb) AS memory_mb, MAX(q.host_cpus) AS host_cpus,
           MAX(q.host_memory_mb) AS host_memory_mb, MAX(q.n) AS per_host
    FROM (SELECT g.gpu_type, g.host_id, SUM(CASE WHEN g.health <> %s THEN 1 ELSE 0 END) AS n,
                 MAX(CASE WHEN g.health <> %s THEN g.memory_mb END) AS memory_mb,
                 MAX(h.cpus) AS host_cpus, MAX(h.memory_mb) AS host_memory_mb
          FROM {GPU._meta.db_table} g JOIN {Host._meta.db_table} h ON h.id = g.host_id
          GROUP BY g.gpu_type, g.host_id) q
    GROUP BY q.gpu_type"""
_POOLS_PARAMS = [GPU.Health.FAULTY, GPU.Health.FAULTY]


def _pools(rows) -> GpuPools:
    # (types are stored as gpu_type_key spells them; rows registered before that are merged into their key)
    def column(index: int, merge=max) -> dict[str, int]:
        merged: dict[str, int] = {}
        for row in rows:
            key = gpu_type_key(row[0])
            merged[key] = merge(merged[key], int(row[index] or 0)) if key in merged else int(row[index] or 0)
        return merged

    return GpuPools(counts=column(1, merge=int.__add__), memory_mb=column(2), host_cpus=column(3), host_memory_mb=column(4),
                    per_host=column(5))


def gpu_pools() -> GpuPools:
    """The GPUs by type, in one query: what a submission is checked against.

    Raw SQL because every submission runs it, and the ORM's spelling (values, annotate, filtered aggregates) cost
    three times as much Python as the query took in the database.
    """
    with connection.cursor() as cursor:
        cursor.execute(_POOLS_SQL, _POOLS_PARAMS)
        return _pools(cursor.fetchall())


def gpu_pools_subquery() -> tuple[str, list[str]]:
    """`gpu_pools` as a scalar subquery giving JSON (SQL and parameters), to read in a caller's own statement."""
    aggregate, row = (("json_agg", "json_build_array") if connection.vendor == "postgresql"
                      else ("json_group_array", "json_array"))
    columns = "p.gpu_type, p.n, p.memory_mb, p.host_cpus, p.host_memory_mb, p.per_host"
    return f"(SELECT {aggregate}({row}({columns})) FROM ({_POOLS_SQL}) p)", _POOLS_PARAMS


def gpu_pools_from_json(value: str | list | None) -> GpuPools:
    """The pools from what `gpu_pools_subquery` gave (a string, or a list where the driver decoded it)."""
    return _pools(json.loads(value) if isinstance(value, str) else value or [])

from __future__ import annotations

import json
from dataclasses import dataclass

from django.db import connection
from django.db.models import QuerySet

from apps.accounts.selectors import AnyUser, is_admin, teams_visible_to
from apps.cluster.models import GPU, Host


def hosts_visible_to(user: AnyUser) -> QuerySet[Host]:
    """Admins and anyone with a role in some team see the cluster's hosts; others see nothing."""
    if is_admin(user) or teams_visible_to(user).exists():
        return Host.objects.prefetch_related("gpus")
    return Host.objects.none()


def known_gpu_types() -> set[str]:
    return set(GPU.objects.values_list("gpu_type", flat=True).distinct())


@dataclass(frozen=True)
class GpuPools:
    """The cluster's GPUs by type: how many are not faulty and the largest memory among those."""

    counts: dict[str, int]
    memory_mb: dict[str, int]

    def known(self, gpu_type: str) -> bool:
        return gpu_type in self.counts

    def largest_pool(self, gpu_type: str | None) -> int:
        """The most GPUs a single job could ever get (of this type, or of the most common one)."""
        return self.counts.get(gpu_type, 0) if gpu_type else max(self.counts.values(), default=0)

    def largest_memory_mb(self, gpu_type: str | None) -> int:
        return self.memory_mb.get(gpu_type, 0) if gpu_type else max(self.memory_mb.values(), default=0)


# The GPUs by type: how many are usable (not faulty) and the largest memory among those.
_POOLS_SQL = f"""
    SELECT gpu_type, SUM(CASE WHEN health <> %s THEN 1 ELSE 0 END) AS n,
           MAX(CASE WHEN health <> %s THEN memory_mb END) AS memory_mb
    FROM {GPU._meta.db_table} GROUP BY gpu_type"""
_POOLS_PARAMS = [GPU.Health.FAULTY, GPU.Health.FAULTY]


def _pools(rows) -> GpuPools:
    return GpuPools(counts={gpu_type: int(n) for gpu_type, n, _ in rows},
                    memory_mb={gpu_type: memory_mb or 0 for gpu_type, _, memory_mb in rows})


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
    return f"(SELECT {aggregate}({row}(p.gpu_type, p.n, p.memory_mb)) FROM ({_POOLS_SQL}) p)", _POOLS_PARAMS


def gpu_pools_from_json(value: str | list | None) -> GpuPools:
    """The pools from what `gpu_pools_subquery` gave (a string, or a list where the driver decoded it)."""
    return _pools(json.loads(value) if isinstance(value, str) else value or [])

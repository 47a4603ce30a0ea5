from __future__ import annotations

from django.db.models import Count, Max, QuerySet

from apps.accounts.selectors import AnyUser, is_admin, teams_visible_to
from apps.cluster.models import GPU, Host


def hosts_visible_to(user: AnyUser) -> QuerySet[Host]:
    """Admins and anyone with a role in some team see the cluster's hosts; others see nothing."""
    if is_admin(user) or teams_visible_to(user).exists():
        return Host.objects.prefetch_related("gpus")
    return Host.objects.none()


def known_gpu_types() -> set[str]:
    return set(GPU.objects.values_list("gpu_type", flat=True).distinct())


def largest_pool(gpu_type: str | None) -> int:
    """GPUs registered of one type (or of the most common type): the most a single job could ever get."""
    gpus = GPU.objects.exclude(health=GPU.Health.FAULTY)
    if gpu_type:
        return gpus.filter(gpu_type=gpu_type).count()
    largest = gpus.values("gpu_type").annotate(n=Count("id")).aggregate(m=Max("n"))["m"]
    return largest or 0


def largest_gpu_memory_mb(gpu_type: str | None) -> int:
    gpus = GPU.objects.exclude(health=GPU.Health.FAULTY)
    if gpu_type:
        gpus = gpus.filter(gpu_type=gpu_type)
    return gpus.aggregate(m=Max("memory_mb"))["m"] or 0

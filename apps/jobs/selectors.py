from __future__ import annotations

from django.db.models import QuerySet

from apps.accounts.models import Role
from apps.accounts.selectors import AnyUser, has_role, is_admin, teams_visible_to
from apps.jobs.models import Job, JobEvent


def jobs_visible_to(user: AnyUser) -> QuerySet[Job]:
    """Admins see every job; others see the jobs of teams they hold any role in; nobody else sees anything."""
    jobs = Job.objects.select_related("team", "user")
    if is_admin(user):
        return jobs
    if not user.is_authenticated:
        return jobs.none()
    return jobs.filter(team__in=teams_visible_to(user))


def can_cancel(user: AnyUser, job: Job) -> bool:
    """Managers (and admins) act on any job of their team; members on their own jobs."""
    if has_role(user, job.team, Role.MANAGER):
        return True
    return job.user_id == user.pk and has_role(user, job.team, Role.MEMBER)


def job_events(job: Job) -> QuerySet[JobEvent]:
    return JobEvent.objects.filter(job=job).select_related("actor")


def jobs_to_stop_on_host(host, running: list[tuple[int, int]]) -> list[list[int]]:
    """Of the (job id, attempt) pairs an agent runs, those the console no longer wants running there."""
    from apps.jobs.models import JobAllocation

    if not running:
        return []
    wanted = set(
        JobAllocation.objects.filter(
            gpu__host=host, released_at__isnull=True, job__state__in=Job.HOLDING_STATES,
            job_id__in=[job_id for job_id, _ in running],
        ).values_list("job_id", "job__attempts")
    )
    return [[job_id, attempt] for job_id, attempt in running if (job_id, attempt) not in wanted]


def job_log_slice(job: Job, after: int, limit: int) -> tuple[str, int]:
    """Log text from character offset `after`, at most about `limit` characters, and the next offset."""
    from apps.jobs.models import JobLogChunk

    chunks = JobLogChunk.objects.filter(job=job, offset__gte=_chunk_start(job, after)).order_by("offset")
    parts: list[str] = []
    size = 0
    position = after
    for chunk in chunks.iterator():
        start = max(after - chunk.offset, 0)
        piece = chunk.data[start:]
        if not piece:
            continue
        if size and size + len(piece) > limit:
            break
        parts.append(piece)
        size += len(piece)
        position = chunk.offset + len(chunk.data)
    return "".join(parts), position


def _chunk_start(job: Job, after: int) -> int:
    from apps.jobs.models import JobLogChunk

    first = (
        JobLogChunk.objects.filter(job=job, offset__lte=after).order_by("-offset").values_list("offset", flat=True)
        .first()
    )
    return first or 0

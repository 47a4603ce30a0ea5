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

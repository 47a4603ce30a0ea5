"""The jobs table's query, for the jobs page and GET /api/v1/jobs/ alike: search by name, filters, and sorting by
submitted, name, state, priority, duration or GPUs; and the cluster-wide queue in its order.

Who sees which jobs is not decided here: callers hand in a queryset already restricted by
apps/accounts/access.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import (
    Case,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    QuerySet,
    Value,
    When,
)
from django.db.models.functions import Lower
from django.utils import timezone

from apps.jobs.models import Job
from apps.quotas.models import PRIORITY_RANK

# The public sort keys (as ?ordering=KEY or ?ordering=-KEY) and what each sorts on; ties: newest first.
ORDERINGS = ("submitted", "name", "state", "priority", "duration", "gpus")
DEFAULT_ORDERING = "-submitted"
# States in the order a job lives them: running first, then those about to run, waiting, then the ended ones.
STATE_RANK: dict[str, int] = {Job.State.RUNNING: 0, Job.State.PLACED: 1, Job.State.QUEUED: 2, Job.State.PREEMPTED: 3,
              Job.State.SUCCEEDED: 4, Job.State.FAILED: 5, Job.State.CANCELLED: 6}


def ordering_choices() -> list[tuple[str, str]]:
    """Every accepted value of `ordering`: a key ascending, or descending with a leading minus."""
    return [(f"{sign}{key}", f"{key} {'descending' if sign else 'ascending'}") for key in ORDERINGS for sign in ("", "-")]


def with_duration(jobs: QuerySet[Job], now: datetime | None = None) -> QuerySet[Job]:
    """Annotate `run_time`: a running job's time since it started, an ended job's run time; None for the others
    (waiting, or ended before it ever started)."""
    now = now or timezone.now()
    return jobs.annotate(run_time=Case(
        When(state=Job.State.RUNNING, started_at__isnull=False,
             then=ExpressionWrapper(Value(now, output_field=DateTimeField()) - F("started_at"),
                                    output_field=DurationField())),
        When(state__in=Job.FINAL_STATES, started_at__isnull=False, finished_at__isnull=False,
             then=ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())),
        default=None, output_field=DurationField()))


def _rank(field: str, ranks: dict[str, int]) -> Case:
    return Case(*[When(**{field: value}, then=Value(rank)) for value, rank in ranks.items()],
                default=Value(len(ranks)), output_field=IntegerField())


def order_jobs(jobs: QuerySet[Job], ordering: str = DEFAULT_ORDERING, now: datetime | None = None) -> QuerySet[Job]:
    """`jobs` sorted by one of ORDERINGS (a leading "-": descending); an unknown key sorts by DEFAULT_ORDERING.
    Jobs without a duration (never started) come last either way."""
    descending = ordering.startswith("-")
    key = ordering.lstrip("-")
    if key not in ORDERINGS:
        return order_jobs(jobs, DEFAULT_ORDERING, now)
    if key == "submitted":
        return jobs.order_by("-id" if descending else "id")
    if key == "duration":
        jobs = with_duration(jobs, now)
        column = F("run_time").desc(nulls_last=True) if descending else F("run_time").asc(nulls_last=True)
        return jobs.order_by(column, "-id")
    if key == "state":
        jobs, field = jobs.annotate(state_rank=_rank("state", STATE_RANK)), "state_rank"
    elif key == "priority":
        jobs, field = jobs.annotate(priority_rank=_rank("priority", {str(p): rank for p, rank in PRIORITY_RANK.items()})), "priority_rank"
    elif key == "gpus":
        # A fraction of one GPU sorts below a whole one: gpus x share (in 1/100s).
        jobs, field = jobs.annotate(gpu_units=F("gpus") * F("gpu_share_units")), "gpu_units"
    else:  # name, in any case
        jobs, field = jobs.annotate(name_key=Lower("name")), "name_key"
    return jobs.order_by(f"-{field}" if descending else field, "-id")


def filter_jobs(jobs: QuerySet[Job], *, name: str = "", states: Iterable[str] = (), team: str = "", user: str = "",
                kind: str = "", mine: Any = None, array: int | None = None) -> QuerySet[Job]:
    """The jobs whose name contains `name` (any case), in one of `states`, of `team` (a slug), of `user` (a
    username), of `kind`, tasks of job `array`; `mine`: a user, whose own jobs only are kept. Empty arguments
    filter nothing."""
    if name:
        jobs = jobs.filter(name__icontains=name)
    states = [s for s in states if s]
    if states:
        jobs = jobs.filter(state__in=states)
    if team:
        jobs = jobs.filter(team__slug=team)
    if user:
        jobs = jobs.filter(user__username=user)
    if kind:
        jobs = jobs.filter(kind=kind)
    if mine is not None:
        jobs = jobs.filter(user_id=mine.pk)
    if array is not None:
        jobs = jobs.filter(array_id=array)
    return jobs


def waiting_in_queue_order(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """The queued jobs of `jobs` in the scheduler's order: by the position its last pass gave them, then those it
    has not ranked yet, oldest first."""
    return jobs.filter(state=Job.State.QUEUED).order_by(F("queue_position").asc(nulls_last=True), "id")


def waiting_positions(excluding: Iterable[int]) -> list[int]:
    """The queue positions of the waiting jobs other than `excluding` (ids): numbers only, never which jobs."""
    positions = Job.objects.filter(state=Job.State.QUEUED, queue_position__isnull=False).exclude(
        pk__in=list(excluding)).values_list("queue_position", flat=True)
    return [position for position in positions if position is not None]

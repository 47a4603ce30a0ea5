from __future__ import annotations

from datetime import timedelta

from django.db.models import QuerySet
from django.utils import timezone

from apps.accounts import access
from apps.accounts.access import AnyUser
from apps.jobs.models import Job, JobAllocation, JobEvent
from apps.scheduling.prediction import (
    DECLARATION_WINDOW,
    FinishedRun,
    RuntimeHistory,
    declaration_error,
    declaration_fit,
)
from apps.scheduling.similarity import similarity_key, work_size

# The finished runs the scheduler learns from: the last HISTORY_RUNS of the last HISTORY_DAYS.
HISTORY_DAYS = 30
HISTORY_RUNS = 2000
# A user's record that scales their declarations by less than this (5 %) is not worth telling them of.
BELIEVED_AS_DECLARED = 0.05


def jobs_visible_to(user: AnyUser) -> QuerySet[Job]:
    """The jobs the user may see (apps/accounts/access.py decides)."""
    return access.restrict(Job.objects.select_related("team", "user"), user, access.Action.VIEW)


def attempt_allocations(job: Job) -> list[JobAllocation]:
    """The GPUs a job's record shows: those it holds now; once it ended, those of its last attempt (never every
    attempt's mixed). Reads `job.allocations.all()`, so a prefetch serves it."""
    allocations = list(job.allocations.all())
    held = [a for a in allocations if a.released_at is None]
    if held or not job.is_final:
        return held
    last = [a for a in allocations if a.attempt == job.attempts]
    return last or [a for a in allocations if a.attempt == 0]  # (rows from before attempts were kept)


def array_task_ids(array_id: int) -> list[int]:
    """The ids of a job array's tasks, by index. Not restricted to what anyone may see: for the answer to the
    submission that made the array (lists for users go through access.restrict, as the jobs API's ?array= does)."""
    return list(Job.objects.filter(array_id=array_id).order_by("array_index").values_list("id", flat=True))


def throttled_array_tasks() -> dict[int, str]:
    """Queued tasks of job arrays that may not start now, each with the reason: an array with a parallelism N
    lets its queued tasks, lowest index first, make up to N tasks holding GPUs (placed or running); the others
    wait out of the scheduler's sight (Slurm's JobArrayTaskLimit), with no position or estimated start."""
    limited: dict[int, int] = {}
    for array_id, limit in (Job.objects.filter(state=Job.State.QUEUED, array_parallelism__isnull=False,
                                               array_id__isnull=False)
                            .order_by().values_list("array_id", "array_parallelism").distinct()):
        if array_id is not None and limit is not None:
            limited[array_id] = limit
    if not limited:
        return {}
    room = dict(limited)
    for array_id in Job.objects.filter(array_id__in=limited, state__in=Job.HOLDING_STATES).values_list(
            "array_id", flat=True):
        if array_id is not None:
            room[array_id] -= 1
    held: dict[int, str] = {}
    queued = Job.objects.filter(array_id__in=limited, state=Job.State.QUEUED).order_by("array_index")
    for job_id, array_id in queued.values_list("id", "array_id"):
        if array_id is None:
            continue
        if room[array_id] > 0:
            room[array_id] -= 1
        else:
            held[job_id] = (f"job array {array_id} runs at most {limited[array_id]} of its tasks at once: "
                            "waiting for its turn (lowest index first)")
    return held


def job_events(job: Job) -> QuerySet[JobEvent]:
    return JobEvent.objects.filter(job=job).select_related("actor")


def jobs_to_stop_on_host(host, running: list[tuple[int, int]]) -> list[list[int]]:
    """Of the (job id, attempt) pairs an agent runs, those the console no longer wants running there."""
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


def runtime_history() -> RuntimeHistory:
    """The finished runs the scheduler predicts from (succeeded jobs of the last HISTORY_DAYS, at most
    HISTORY_RUNS), oldest first."""
    since = timezone.now() - timedelta(days=HISTORY_DAYS)
    finished = (
        Job.objects.filter(state=Job.State.SUCCEEDED, finished_at__gt=since, started_at__isnull=False)
        .order_by("-finished_at")
        .values_list("user__username", "workload", "gpus", "started_at", "finished_at", "steps_per_second",
                     "max_steps", "steps_done")[:HISTORY_RUNS]
    )
    history = RuntimeHistory()
    for user, workload, gpus, started, ended, steps_per_second, max_steps, steps_done in reversed(finished):
        if started is None or ended is None:  # (the filter says neither is; the row's type does not)
            continue
        # declared vs done steps: the user's declaration record, which weighs and scales their next declarations
        run = FinishedRun(gpus=gpus, runtime_s=(ended - started).total_seconds(),
                          step_s=1.0 / steps_per_second if steps_per_second else None, work=work_size(workload),
                          declared_steps=max_steps, steps=steps_done or None)
        history.record(user, similarity_key(workload), run)
    return history


def believed_max_steps(job: Job) -> tuple[int, int] | None:
    """(the steps the scheduler counts on for `job`, of the max_steps it declared, and how many of its user's
    finished runs say so: RuntimeHistory.declared_scale's fit of their record, read from those runs alone), or
    None when the job declares none, has ended, or its user's record takes nothing off (or adds nothing to) what it
    declares."""
    if not job.max_steps or job.is_final:
        return None
    since = timezone.now() - timedelta(days=HISTORY_DAYS)
    record = list(
        Job.objects.filter(user_id=job.user_id, state=Job.State.SUCCEEDED, finished_at__gt=since,
                           started_at__isnull=False, max_steps__gt=0, steps_done__gt=0)
        .order_by("-finished_at")
        .values_list("max_steps", "steps_done")[:DECLARATION_WINDOW]
    )
    if not record:
        return None
    # (the filter says max_steps is set; the row's type does not)
    scale, _ = declaration_fit([declaration_error(steps, declared or 1) for declared, steps in reversed(record)])
    if abs(scale - 1.0) < BELIEVED_AS_DECLARED:
        return None
    return round(job.max_steps * scale), len(record)

"""The job lifecycle: which state may follow which, and the one function every state change goes through.

A job is created queued (submission inserts it with its first event). From then on `transition` is the only
writer of `Job.state`: a conditional UPDATE on the state the caller read under the row lock, the JobEvent with
its reason, and, when the job leaves the states that hold GPUs, the release of its GPUs and usage segment and a
request for a scheduler pass (after commit).

A preempted job is entered as such and requeued in the same transaction (`preempt_and_requeue`): `preempted`
shows in the job's events between the run it ended and the queue it went back to.

Below the mechanism, the services that end or stop a job: start, finish, cancel (a user), release and preempt (by
policy), and a lost host's jobs.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from apps.accounts import access
from apps.cluster.models import Host
from apps.core.models import AuditEvent
from apps.core.services import audit_record
from apps.jobs.dispatch import job_hosts, send_preempt_after_commit, send_stop_after_commit
from apps.jobs.errors import JobPermissionError, JobStateError
from apps.jobs.models import Job, JobAllocation, JobEvent, UsageSegment

logger = logging.getLogger(__name__)
State = Job.State

TRANSITIONS: dict[str, frozenset[str]] = {
    State.QUEUED: frozenset({State.PLACED, State.CANCELLED}),
    State.PLACED: frozenset({State.RUNNING, State.SUCCEEDED, State.FAILED, State.CANCELLED, State.PREEMPTED,
                             State.QUEUED}),  # queued: its host was lost and a retry is left
    State.RUNNING: frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.PREEMPTED, State.QUEUED}),
    State.PREEMPTED: frozenset({State.QUEUED, State.CANCELLED}),
    State.SUCCEEDED: frozenset(),
    State.FAILED: frozenset(),
    State.CANCELLED: frozenset(),
}

# States a job may still be cancelled (by a user or by policy) from.
ACTIVE_STATES = tuple(state for state in State if State.CANCELLED in TRANSITIONS[state])


def allowed(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())


def sources(to_state: str) -> tuple[str, ...]:
    """The states `to_state` may be entered from."""
    return tuple(state for state, targets in TRANSITIONS.items() if to_state in targets)


def lock_job(job_id: int) -> Job | None:
    return Job.objects.select_for_update().filter(pk=job_id).first()


def transition(
    job: Job,
    to: str,
    reason: str,
    *,
    actor: AbstractBaseUser | None = None,
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
    **fields: Any,
) -> bool:
    """Move a (locked) job to `to`, setting `fields` with it. False, and nothing written, when the table refuses
    the move or the row is no longer in the state `job` was read in."""
    from_state = job.state
    if not allowed(from_state, to):
        return False
    now = at or timezone.now()
    updated = Job.objects.filter(pk=job.pk, state=from_state).update(state=to, updated_at=now, **fields)
    if updated != 1:
        return False
    JobEvent.objects.create(job=job, from_state=from_state, to_state=to, reason=reason[:500], actor=actor,
                            data=data or {})
    job.state = to
    for name, value in fields.items():
        setattr(job, name, value)
    if from_state in Job.HOLDING_STATES and to not in Job.HOLDING_STATES:
        release_gpus(job, now)
        request_scheduler_pass()
    return True


def release_gpus(job: Job, now: datetime) -> None:
    """End the job's allocations and its open usage segment."""
    JobAllocation.objects.filter(job=job, released_at__isnull=True).update(released_at=now)
    UsageSegment.objects.filter(job=job, ended_at__isnull=True).update(ended_at=now)


REQUEUE_FIELDS: dict[str, Any] = {"pending_reason": "requeued", "placed_at": None, "started_at": None,
                                  "borrowing": False, "preempt_requested_at": None, "runtime_info": {}}


def requeue(job: Job, reason: str, *, at: datetime | None = None) -> bool:
    """Put a job that held GPUs (or was just preempted) back in the queue, keeping its place in line."""
    return transition(job, State.QUEUED, reason, at=at, **REQUEUE_FIELDS)


def preempt_and_requeue(job: Job, reason: str, *, at: datetime | None = None, counts: bool = True) -> bool:
    """Record the preemption (`preempted`, with the GPUs released) and requeue the job, in one transaction.
    `counts`: False for a move (Preemption.moved), which is not among the job's preemptions."""
    with transaction.atomic():
        count = job.preemption_count + 1 if counts else job.preemption_count
        if not transition(job, State.PREEMPTED, reason, at=at, preemption_count=count):
            return False
        return requeue(job, "requeued after preemption; it resumes from its checkpoint", at=at)


def note(job: Job, reason: str, *, data: dict[str, Any] | None = None) -> None:
    """An event that changes no state (a preemption asked of the agent, say)."""
    JobEvent.objects.create(job=job, from_state=job.state, to_state="", reason=reason[:500], data=data or {})


_pass_enqueued_at = float("-inf")


def request_scheduler_pass() -> None:
    """Ask for a scheduler pass soon. Requests within one second share a pass (beat runs one anyway)."""

    def enqueue() -> None:
        global _pass_enqueued_at
        # A pass was requested within the second, by this process or (the shared key) another one: it runs after
        # this commit (countdown=1) and will see the job, so skip even the shared cache's round trip in a burst.
        # A job committed after that pass started waits at most for beat's pass, a second later.
        if time.monotonic() - _pass_enqueued_at < 1.0:
            return
        requested_here = cache.add("jobs:scheduler-pass-requested", 1, timeout=1)
        _pass_enqueued_at = time.monotonic()
        if not requested_here:
            return
        try:
            from apps.jobs.tasks import scheduler_pass

            scheduler_pass.apply_async(countdown=1)
        except Exception:  # noqa: BLE001 - the broker being down must not fail the request; beat retries
            logger.warning("could not enqueue a scheduler pass; the periodic pass will pick the job up", exc_info=True)

    transaction.on_commit(enqueue)


# --- the services that end or stop a job


def job_mark_running(job_id: int, *, reason: str = "process started") -> bool:
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None:
            return False
        now = timezone.now()
        return transition(job, State.RUNNING, reason, at=now, started_at=now)


def job_finish(
    job_id: int, *, succeeded: bool, exit_code: int | None, reason: str, data: dict[str, Any] | None = None
) -> bool:
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None:
            return False
        now = timezone.now()
        to_state = State.SUCCEEDED if succeeded else State.FAILED
        return transition(
            job,
            to_state,
            reason,
            data=data,
            at=now,
            exit_code=exit_code,
            finished_at=now,
            failure_reason="" if succeeded else reason[:500],
        )


def job_cancel(
    *, job: Job, actor: AbstractBaseUser, reason: str = "", request: HttpRequest | None = None
) -> Job:
    access.require(actor, access.Action.CANCEL, job, error=JobPermissionError)
    with transaction.atomic():
        locked = lock_job(job.pk)
        if locked is None or locked.state not in ACTIVE_STATES:
            raise JobStateError(f"Job {job.pk} is already {locked.state if locked else 'gone'}.")
        hosts = job_hosts(locked) if locked.state in Job.HOLDING_STATES else []
        now = timezone.now()
        text = f"cancelled by {actor.get_username()}" + (f": {reason}" if reason else "")
        transition(locked, State.CANCELLED, text, actor=actor, at=now, finished_at=now)
        if hosts:
            send_stop_after_commit(locked.pk, locked.attempts, hosts, "cancelled")
        if actor.pk != locked.user_id:
            audit_record(
                AuditEvent.Action.JOB_CANCELLED_BY_OTHER,
                actor=actor,
                target=f"job {locked.pk} of {locked.user.get_username()}",
                request=request,
                team=locked.team.slug,
            )
    return locked


def finish(job: Job, to_state: str, reason: str, now: datetime, *, exit_code: int | None,
           data: dict[str, Any] | None = None) -> None:
    """End a job that holds GPUs (its GPUs are released with the transition)."""
    transition(job, to_state, reason, data=data, at=now, exit_code=exit_code, finished_at=now,
               failure_reason="" if to_state == State.SUCCEEDED else reason[:500])


def job_host_lost(job_id: int, host: Host, reason: str = "") -> str | None:
    """A host holding this job stopped answering: requeue the job if its retries allow, else fail it."""
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None or job.state not in Job.HOLDING_STATES:
            return None
        now = timezone.now()
        hosts = job_hosts(job)
        retry = job.attempts  # attempts counts placements; the first run is not a retry
        why = reason or f"{host.name} stopped sending heartbeats"
        if retry <= job.max_retries:
            requeue(job, f"host lost: {why}; requeued, retry {retry} of {job.max_retries}", at=now)
            outcome = State.QUEUED
        else:
            finish(job, State.FAILED, f"host lost: {why}", now, exit_code=None)
            outcome = State.FAILED
        others = [name for name in hosts if name != host.name]
        if others:
            send_stop_after_commit(job.pk, job.attempts, others, f"host {host.name} of the job was lost")
        return outcome


MOVE_MARK = "move_attempt"  # in the data of the note that asks a running attempt to checkpoint for a move


def job_preempt(job_id: int, reason: str, *, move: bool = False) -> bool:
    """Stop a job to free its GPUs: it checkpoints, exits and goes back to the queue, keeping its place in line.

    A running job keeps its GPUs until its agent reports that it stopped (the checkpoint is written by then); a
    placed job that has not started is requeued at once. `move`: a move for defragmentation (Preemption.moved),
    marked on the request (MOVE_MARK) so that the report of its stop does not count it among the job's preemptions.
    """

    with transaction.atomic():
        job = lock_job(job_id)
        if job is None or job.state not in Job.HOLDING_STATES:
            return False
        now = timezone.now()
        if job.preempt_requested_at and now - job.preempt_requested_at < timedelta(seconds=60):
            return False  # already asked; the agent is checkpointing
        hosts = job_hosts(job)
        if job.state == State.PLACED:
            preempt_and_requeue(job, f"preempted before it started: {reason}", at=now, counts=not move)
        else:
            Job.objects.filter(pk=job.pk).update(preempt_requested_at=now)
            note(job, f"preemption requested: {reason}", data={MOVE_MARK: job.attempts} if move else None)
        send_preempt_after_commit(job.pk, job.attempts, hosts, reason)
        return True


def job_note(job_id: int, reason: str, *, data: dict[str, Any] | None = None) -> bool:
    """Tell the job's owner something that changes no state (a warning, say): an event on the job."""
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None:
            return False
        note(job, reason, data=data)
        return True


RELEASE_MARK = "release_attempt"  # in the data of the note that asks a running attempt to checkpoint for release


def job_checkpoint_and_release(job_id: int, reason: str) -> bool:
    """Release a job by policy after it has saved a checkpoint: a running job is asked to stop as a preemption
    (SIGTERM and the preemption's longer grace, so the runtime writes its checkpoint) and keeps its GPUs until its
    agent reports it stopped; it then ends cancelled (`agent_reports`), not requeued. A placed job that has not
    started has nothing to save and is released at once. False when there is nothing (more) to do.
    """
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None or job.state not in Job.HOLDING_STATES:
            return False
        if job.state == State.PLACED:
            return job_release(job_id, reason)
        now = timezone.now()
        if job.preempt_requested_at and now - job.preempt_requested_at < timedelta(seconds=60):
            return False  # already asked; the agent is checkpointing
        Job.objects.filter(pk=job.pk).update(preempt_requested_at=now)
        note(job, f"checkpoint requested before release: {reason}", data={RELEASE_MARK: job.attempts})
        send_preempt_after_commit(job.pk, job.attempts, job_hosts(job), f"checkpoint before release: {reason}")
        return True


def release_requested(job: Job) -> bool:
    """Was the current attempt of this (locked) job asked to checkpoint for a release?"""
    return JobEvent.objects.filter(job=job, to_state="", **{f"data__{RELEASE_MARK}": job.attempts}).exists()


def move_requested(job: Job) -> bool:
    """Was the current attempt of this (locked) job asked to checkpoint for a move (job_preempt's `move`)?"""
    return JobEvent.objects.filter(job=job, to_state="", **{f"data__{MOVE_MARK}": job.attempts}).exists()


def job_release(job_id: int, reason: str) -> bool:
    """Stop a job by policy (no user acts): it gets SIGTERM, so the runtime checkpoints, and ends cancelled."""
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None or job.state not in ACTIVE_STATES:
            return False
        now = timezone.now()
        hosts = job_hosts(job) if job.state in Job.HOLDING_STATES else []
        transition(job, State.CANCELLED, reason, at=now, finished_at=now)
        if hosts:
            send_stop_after_commit(job.pk, job.attempts, hosts, reason)
        return True

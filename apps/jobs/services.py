"""Job state changes. Every transition happens here, under a row lock, and writes a JobEvent with its reason."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import F as models_F
from django.db.models import Field, Model, Sum
from django.http import HttpRequest
from django.utils import timezone

from apps.accounts.models import ROLE_RANK, Membership, Role, Team
from apps.accounts.selectors import is_admin
from apps.cluster.models import GPU, Host
from apps.cluster.selectors import GpuPools, gpu_pools, gpu_pools_from_json, gpu_pools_subquery
from apps.core.models import AuditEvent
from apps.core.services import audit_record
from apps.jobs.attempt_tokens import attempt_token
from apps.jobs.errors import JobPermissionError, JobRateLimited, JobSpecError, JobStateError
from apps.jobs.lifecycle import (
    ACTIVE_STATES,
    lock_job,
    note,
    preempt_and_requeue,
    request_scheduler_pass,
    requeue,
    transition,
)
from apps.jobs.models import Job, JobAllocation, JobEvent, JobLogChunk, UsageSegment
from apps.jobs.selectors import can_cancel
from apps.quotas.models import PRIORITY_RANK, Priority, TeamQuota, UserQuota
from apps.quotas.selectors import budget_exhausted, units_held
from apps.quotas.services import quota_ensure, quota_lock
from apps.serving.replica_auth import replica_secret
from workers.protocol import (
    HEARTBEAT_TIMEOUT_S,
    RUN_JOB_TASK,
    STOP_JOB_TASK,
    Dispatch,
    JobStatus,
    Rendezvous,
    host_queue,
)
from workers.runtime.catalog import PRESETS, WORKLOADS, validate_params

logger = logging.getLogger(__name__)
State = Job.State


@dataclass(frozen=True)
class JobSpec:
    name: str
    kind: str
    gpus: int
    workload: dict[str, Any]
    team: str | None = None
    gpu_type: str | None = None
    priority: str = Priority.NORMAL
    preset: str | None = None
    max_steps: int | None = None
    time_limit_minutes: int | None = None
    max_retries: int = 0
    # A fraction of one GPU, in 1/100s (100: whole GPUs), or memory on one GPU.
    gpu_share_units: int = 100
    gpu_memory_mb: int | None = None
    # CPUs and host memory (the job's cgroup limits); None: the per-GPU defaults.
    cpus: float | None = None
    memory_gb: float | None = None

    @property
    def units(self) -> int:
        return self.gpus * self.gpu_share_units


def default_preset(kind: str) -> str:
    return "baseline-fp32" if kind == Job.Kind.TRAIN else "infer-fp32"


# --- submission


@dataclass(frozen=True)
class _Submitter:
    team: Team
    role: Role | None  # None: a site admin outside the team
    quota: TeamQuota
    user_cap: int | None  # the user's own GPU cap in the team, if any
    pools: GpuPools | None = None  # the cluster's GPUs, when read with the rest


def _submitter(user: AbstractBaseUser, slug: str | None) -> _Submitter:
    """The team a submission goes to, the user's role and cap there and the team's quota, read without locks.

    The quota is only read: submission queues, it admits nothing; placement re-checks every limit under the
    quota's row lock.
    """
    if not slug:
        slug = _default_team_slug(user)
    member = _member_submitter(user, slug)
    if member is not None:
        return member
    # Not a member (a site admin may still submit), or a team without its quota row: the general path.
    membership = Membership.objects.select_related("team").filter(user=user, team__slug=slug).first()
    if membership is not None:
        team, role = membership.team, Role(membership.role)
    else:
        team = Team.objects.filter(slug=slug).first() if is_admin(user) else None
        if team is None:
            raise JobSpecError({"team": [f"You are not a member of a team named '{slug}'."]})
        role = None
    user_cap = UserQuota.objects.filter(team=team, user=user).values_list("max_gpus", flat=True).first()
    return _Submitter(team=team, role=role, quota=quota_ensure(team), user_cap=user_cap)


def _member_submitter(user: AbstractBaseUser, slug: str) -> _Submitter | None:
    """`_submitter` for a member of the team, with the cluster's GPU pools, in one statement (None if the user
    is not a member).

    Submission is the hottest write path: the ORM's spelling of this join (select_related, a correlated subquery
    for the cap) and a second query for the pools cost 9 ms of Python per request on our 2-core machine.
    """
    tables = {name: model._meta.db_table for name, model in [
        ("quota", TeamQuota), ("team", Team), ("membership", Membership), ("user_quota", UserQuota)]}
    quota_fields = TeamQuota._meta.concrete_fields
    pools_sql, pools_params = gpu_pools_subquery()
    query = f"""
        SELECT {", ".join(f"q.{field.column}" for field in quota_fields)},
               t.slug, t.name, m.role, uq.max_gpus, {pools_sql}
        FROM {tables["membership"]} m
        JOIN {tables["team"]} t ON t.id = m.team_id
        JOIN {tables["quota"]} q ON q.team_id = t.id
        LEFT JOIN {tables["user_quota"]} uq ON uq.team_id = t.id AND uq.user_id = m.user_id
        WHERE m.user_id = %s AND t.slug = %s"""
    with connection.cursor() as cursor:
        cursor.execute(query, [*pools_params, user.pk, slug])
        row = cursor.fetchone()
    if row is None:
        return None
    *quota_values, team_slug, team_name, role, cap, pools = row
    quota = _model_from_row(TeamQuota, quota_fields, quota_values)
    quota.team = Team.from_db(connection.alias, ["id", "slug", "name"], [quota.team_id, team_slug, team_name])
    return _Submitter(team=quota.team, role=Role(role), quota=quota, user_cap=cap, pools=gpu_pools_from_json(pools))


def _model_from_row(model: type[Model], fields: Sequence[Field], values: Sequence[Any]) -> Model:
    """An instance from its fields' raw column values, converted as the ORM converts them (a RawQuerySet cost
    twice as much Python for the one row)."""
    converted = []
    for field, value in zip(fields, values, strict=True):
        column = field.get_col(model._meta.db_table)
        for convert in [*connection.ops.get_db_converters(column), *field.get_db_converters(connection)]:
            value = convert(value, column, connection)
        converted.append(value)
    return model.from_db(connection.alias, [field.attname for field in fields], converted)


def _default_team_slug(user: AbstractBaseUser) -> str:
    """The one team the user may submit to, when the spec names none."""
    memberships = Membership.objects.select_related("team").filter(user=user)
    submittable = [m for m in memberships if ROLE_RANK[Role(m.role)] >= ROLE_RANK[Role.MEMBER]]
    if len(submittable) == 1:
        return submittable[0].team.slug
    if not submittable:
        raise JobSpecError({"team": ["You are not a member of any team that may submit jobs."]})
    names = ", ".join(sorted(m.team.slug for m in submittable))
    raise JobSpecError({"team": [f"You belong to several teams; name one of: {names}."]})


def _check_role_and_priority(user: AbstractBaseUser, team: Team, role: Role | None, priority: str,
                             max_priority: str) -> None:
    if is_admin(user):
        return
    if role is None or ROLE_RANK[role] < ROLE_RANK[Role.MEMBER]:
        raise JobPermissionError(f"Viewers of team {team.slug} cannot submit jobs.")
    if priority == Priority.URGENT:
        raise JobSpecError({"priority": ["Only site admins may submit urgent jobs."]})
    if priority == Priority.HIGH and role != Role.MANAGER:
        raise JobSpecError({"priority": [f"Only managers of team {team.slug} may submit high-priority jobs."]})
    if PRIORITY_RANK[Priority(priority)] > PRIORITY_RANK[Priority(max_priority)]:
        raise JobSpecError({"priority": [f"Team {team.slug} may use priorities up to '{max_priority}'."]})


def _check_workload(kind: str, preset_name: str, workload: dict[str, Any]) -> dict[str, object]:
    errors: dict[str, object] = {}
    preset = PRESETS.get(preset_name)
    if preset is None:
        errors["preset"] = [f"Unknown preset '{preset_name}'; GET /api/v1/presets/ lists them."]
    elif preset.kind != kind:
        errors["preset"] = [f"Preset '{preset_name}' is for {preset.kind} jobs, not {kind} jobs."]
    serve = workload.get("serve")
    if serve is not None:  # a service replica: built by apps.serving, never taken from users as is
        if kind != Job.Kind.INFERENCE or serve.get("workload") not in WORKLOADS:
            errors["workload"] = {"serve": ["A replica serves a built-in workload's model in an inference job."]}
        return errors
    builtin = workload.get("builtin")
    if builtin is not None:
        spec = WORKLOADS.get(builtin)
        if spec is None:
            errors["workload"] = {"builtin": [f"Unknown built-in workload '{builtin}'; GET /api/v1/workloads/ lists them."]}
        elif kind not in spec.kinds:
            errors["workload"] = {"builtin": [f"Workload '{builtin}' does not support {kind} jobs."]}
        else:
            param_errors = validate_params(spec, workload.get("params") or {})
            if param_errors:
                errors["workload"] = {"params": {name: [msg] for name, msg in param_errors.items()}}
    return errors


def _check_gpus(spec: JobSpec, submitter: _Submitter) -> dict[str, object]:
    team, quota = submitter.team, submitter.quota
    pools = submitter.pools or gpu_pools()
    errors: dict[str, object] = {}
    if spec.gpu_type:
        if not pools.known(spec.gpu_type):
            known = ", ".join(sorted(pools.counts)) or "none registered yet"
            errors["gpu_type"] = [f"Unknown GPU type '{spec.gpu_type}'; registered types: {known}."]
        elif quota.allowed_gpu_types and spec.gpu_type not in quota.allowed_gpu_types:
            allowed = ", ".join(quota.allowed_gpu_types)
            errors["gpu_type"] = [f"Team {team.slug} may use only these GPU types: {allowed}."]
    gpu_errors: list[str] = []
    if spec.gpu_memory_mb is not None and "gpu_type" not in errors:
        largest = pools.largest_memory_mb(spec.gpu_type)
        if spec.gpu_memory_mb > largest:
            kind = f"{spec.gpu_type} GPU" if spec.gpu_type else "GPU"
            errors["gpu_memory_gb"] = [f"The largest {kind} has {largest / 1024:.0f} GB of memory."]
    if quota.max_gpus == 0:
        gpu_errors.append(f"Team {team.slug} has no GPU quota.")
    elif spec.gpus > quota.max_gpus:
        gpu_errors.append(f"Team {team.slug} may hold at most {quota.max_gpus} GPUs at once.")
    if submitter.user_cap is not None and spec.gpus > submitter.user_cap:
        gpu_errors.append(f"You may hold at most {submitter.user_cap} GPUs at once in team {team.slug}.")
    if "gpu_type" not in errors:
        pool = pools.largest_pool(spec.gpu_type)
        if spec.gpus > pool:
            kind = f"{spec.gpu_type} GPUs" if spec.gpu_type else "GPUs of one type"
            gpu_errors.append(f"The cluster has only {pool} {kind}.")
    if gpu_errors:
        errors["gpus"] = gpu_errors
    return errors


# A job's default CPUs and memory never go below these (a fraction of a GPU times the per-GPU figure can be tiny).
MIN_DEFAULT_CPUS = 1.0
MIN_DEFAULT_MEMORY_GB = 4.0


def _resources(spec: JobSpec, pools: GpuPools, errors: dict[str, object]) -> tuple[float, float]:
    """The job's CPUs and memory: what it asked for (refused above what its hosts can give, where known), or
    the per-GPU defaults (at least 1 CPU and 4 GB, at most what its hosts have)."""
    host_cpus, host_memory_mb, per_host = pools.host_capacity(spec.gpu_type)
    # A gang spans hosts: it may get what the fewest hosts that hold its GPUs have together.
    hosts = max(1, -(-spec.gpus // per_host)) if per_host else 1
    kind = f"{spec.gpu_type} host" if spec.gpu_type else "host"
    granted: list[float] = []
    for name, asked, per_gpu, floor, capacity, unit in (
        ("cpus", spec.cpus, settings.JOBS_CPUS_PER_GPU, MIN_DEFAULT_CPUS, host_cpus, "CPUs"),
        ("memory_gb", spec.memory_gb, settings.JOBS_MEMORY_GB_PER_GPU, MIN_DEFAULT_MEMORY_GB,
         host_memory_mb / 1024, "GB of memory"),
    ):
        most = capacity * hosts
        if asked is not None:
            if capacity and asked > most:
                spread = f" ({hosts} hosts)" if hosts > 1 else ""
                errors[name] = [f"At most {most:g} {unit}{spread}: the largest {kind} has {capacity:g}."]
            granted.append(asked)
            continue
        value = max(floor, round(spec.units / 100 * per_gpu, 3))
        granted.append(min(value, most) if capacity else value)
    return granted[0], granted[1]


def job_submit(*, user: AbstractBaseUser, spec: JobSpec, request: HttpRequest | None = None) -> Job:
    """Queue a job after checking the spec, the user's role and the team's limits.

    The checks only read. The write is the part that must be exact under concurrency, and it is kept as short as
    the bare insert it is benchmarked against (benchmarks/submit_load.py): the user's row lock, one statement
    that inserts the job and its event and counts the user's recent submissions, and the commit. Holding the
    lock through the checks (as before) made one user's concurrent submissions queue behind it with the CPU idle.
    """
    preset = spec.preset or default_preset(spec.kind)
    submitter = _submitter(user, spec.team)
    team, quota = submitter.team, submitter.quota
    _check_role_and_priority(user, team, submitter.role, spec.priority, quota.max_priority)
    errors = _check_workload(spec.kind, preset, spec.workload)
    errors.update(_check_gpus(spec, submitter))
    cpus, memory_gb = _resources(spec, submitter.pools or gpu_pools(), errors)
    if not errors and budget_exhausted(team, quota):
        errors["team"] = [f"Team {team.slug} has used its {quota.gpu_hours_per_month} GPU-hour budget this month."]
    if errors:
        raise JobSpecError(errors)
    job = Job(
        name=spec.name,
        team=team,
        user=user,
        kind=spec.kind,
        gpus=spec.gpus,
        gpu_type=spec.gpu_type or "",
        priority=spec.priority,
        preset=preset,
        workload=spec.workload,
        max_steps=spec.max_steps,
        time_limit_minutes=spec.time_limit_minutes or _default_time_limit(),
        max_retries=spec.max_retries,
        gpu_share_units=spec.gpu_share_units,
        gpu_memory_mb=spec.gpu_memory_mb,
        cpus=cpus,
        memory_gb=memory_gb,
        # The pass requested below replaces this with the job's real standing (quota, position) within a second.
        pending_reason="waiting for the scheduler",
    )
    event = JobEvent(to_state=State.QUEUED, reason=f"submitted by {user.get_username()}", actor=user)
    limit = settings.JOBS_SUBMIT_PER_MINUTE
    with transaction.atomic():
        _lock_user(user)
        recent = _insert_submission(job, event, since=timezone.now() - timedelta(minutes=1))
        if recent >= limit:  # raised inside the transaction: the insert is rolled back
            raise JobRateLimited(f"You submitted {recent} jobs in the last minute; the limit is {limit} per minute.")
        request_scheduler_pass()
    return job


def _lock_user(user: AbstractBaseUser) -> None:
    """Hold the user's row until commit: one user's submissions (across teams) then happen one at a time.

    So the rate count that follows sees every earlier submission committed (the limit holds under
    concurrency), and created_at, set after the lock, follows commit order (the queue's order). NO KEY UPDATE
    lets other transactions' foreign-key checks on the user row through (an event or audit row naming the
    user), so it cannot deadlock with them.
    """
    features = connection.features
    lock = ("FOR NO KEY UPDATE" if features.has_select_for_no_key_update
            else "FOR UPDATE" if features.has_select_for_update else "")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {get_user_model()._meta.db_table} WHERE id = %s {lock}", [user.pk])


def _insert_submission(job: Job, event: JobEvent, *, since: Any) -> int:
    """Insert the job and its event; return how many jobs the user submitted since `since`, before this one.

    On PostgreSQL one statement does all three. Its snapshot is taken after `_lock_user` returned, so the count
    sees every submission committed before; it does not see the job the same statement inserts. Elsewhere
    (SQLite, the embedded default) the ORM does it in three.
    """
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_RECENT_SUBMISSIONS_SQL.format(job=Job._meta.db_table), [job.user_id, since])
            recent = cursor.fetchone()[0]
        job.save(force_insert=True)
        event.job = job
        event.save(force_insert=True)
        return recent
    sql, job_fields, event_fields = _submission_insert_sql()
    params = [field.get_db_prep_save(field.pre_save(obj, add=True), connection)
              for obj, fields in ((job, job_fields), (event, event_fields)) for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, job.user_id, since])
        job.pk, recent = cursor.fetchone()
    job._state.adding, job._state.db = False, connection.alias
    event.job = job
    return recent


_RECENT_SUBMISSIONS_SQL = "SELECT count(*) FROM {job} WHERE user_id = %s AND created_at >= %s"


@functools.cache
def _submission_insert_sql() -> tuple[str, list[Field], list[Field]]:
    """The statement behind `_insert_submission` on PostgreSQL, and the fields its parameters come from, in order.

    The ORM's two inserts and a count cost three round trips and a millisecond of Python while the user's row
    was locked; this costs one, and builds its parameters as the ORM does (pre_save, get_db_prep_save).
    """
    quote = connection.ops.quote_name
    job_fields = [field for field in Job._meta.concrete_fields if not field.primary_key]
    event_fields = [field for field in JobEvent._meta.concrete_fields
                    if not field.primary_key and field.attname != "job_id"]

    def columns(fields: list[Field]) -> str:
        return ", ".join(quote(field.column) for field in fields)

    def placeholders(fields: list[Field]) -> str:
        return ", ".join(["%s"] * len(fields))

    job_table, event_table = quote(Job._meta.db_table), quote(JobEvent._meta.db_table)
    recent = _RECENT_SUBMISSIONS_SQL.format(job=job_table)
    sql = f"""
        WITH new_job AS (
            INSERT INTO {job_table} ({columns(job_fields)}) VALUES ({placeholders(job_fields)}) RETURNING id
        ), new_event AS (
            INSERT INTO {event_table} (job_id, {columns(event_fields)})
            VALUES ((SELECT id FROM new_job), {placeholders(event_fields)})
        )
        SELECT id, ({recent}) FROM new_job"""
    return sql, job_fields, event_fields


def _default_time_limit() -> int:
    return settings.JOBS_DEFAULT_TIME_LIMIT_MINUTES


# --- transitions


def job_place(
    job_id: int,
    gpu_ids: tuple[int, ...],
    *,
    reason: str = "placed by the scheduler",
    borrowing: bool = False,
    share_units: int | None = None,
) -> bool:
    """Give a queued job its GPUs, atomically. False (and nothing changed) if anything no longer holds.

    Within quota, a team's own borrowers do not count against it; a borrowing placement needs a team that may
    borrow, and runs as preemptible capacity beyond the quota.
    """
    try:
        with transaction.atomic():
            job = Job.objects.select_related("team").filter(pk=job_id).first()
            if job is None or job.state != State.QUEUED or len(gpu_ids) != job.gpus:
                return False
            quota = quota_lock(job.team)
            job = lock_job(job_id)
            if job is None or job.state != State.QUEUED:
                return False
            share = 100 if not job.is_fractional else (share_units or job.gpu_share_units)
            if not 1 <= share <= 100:
                return False
            units = job.gpus * share
            if borrowing:
                if not quota.may_borrow:
                    return False
            elif units_held(job.team, guaranteed_only=True) + units > quota.max_gpus * 100:
                return False
            user_cap = UserQuota.objects.filter(team=job.team, user_id=job.user_id).values_list("max_gpus", flat=True)
            if user_cap and units_held(job.team, user=job.user) + units > user_cap[0] * 100:
                return False
            gpus = list(GPU.objects.select_for_update().filter(pk__in=gpu_ids).select_related("host").order_by("pk"))
            if len(gpus) != len(gpu_ids) or not all(_placeable(gpu, job) for gpu in gpus):
                return False
            # Under the GPUs' row locks: what is left of each GPU must hold this job's share.
            taken = dict(
                JobAllocation.objects.filter(gpu_id__in=gpu_ids, released_at__isnull=True)
                .values_list("gpu_id").annotate(units=Sum("share_units"))
            )
            if any(taken.get(gpu.pk, 0) + share > 100 for gpu in gpus):
                return False
            if job.gpu_memory_mb is not None and any(job.gpu_memory_mb > gpu.memory_mb for gpu in gpus):
                return False
            now = timezone.now()
            where = ", ".join(f"{gpu.host.name}:{gpu.index}" for gpu in gpus)
            if share < 100:
                where += f" ({share}% of the GPU, shared)"
            if borrowing:
                where += " (borrowing idle GPUs beyond the team's quota; preemptible)"
            if not transition(
                job,
                State.PLACED,
                f"{reason} on {where}",
                at=now,
                placed_at=now,
                pending_reason="",
                queue_position=None,
                estimated_start=None,
                attempts=job.attempts + 1,
                borrowing=borrowing,
                data={"gpus": [gpu.uuid for gpu in gpus]},
            ):
                return False
            JobAllocation.objects.bulk_create([JobAllocation(job=job, gpu=gpu, share_units=share) for gpu in gpus])
            Job.objects.filter(pk=job.pk).update(node_results={})
            UsageSegment.objects.create(job=job, team=job.team, user_id=job.user_id, gpus=job.gpus,
                                        share_units=share, started_at=now)
            if share != job.gpu_share_units:
                Job.objects.filter(pk=job.pk).update(gpu_share_units=share)
            transaction.on_commit(lambda: _dispatch(job.pk))
            return True
    except IntegrityError:
        # Another pass took one of these GPUs between our check and insert: the constraint held the line.
        logger.info("placement of job %s lost a race for GPUs %s", job_id, gpu_ids)
        return False


def _placeable(gpu: GPU, job: Job) -> bool:
    if gpu.health != GPU.Health.OK or gpu.host.state != Host.State.UP:
        return False
    return not job.gpu_type or gpu.gpu_type == job.gpu_type


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
    if not can_cancel(actor, job):
        raise JobPermissionError("You may not cancel this job.")
    with transaction.atomic():
        locked = lock_job(job.pk)
        if locked is None or locked.state not in ACTIVE_STATES:
            raise JobStateError(f"Job {job.pk} is already {locked.state if locked else 'gone'}.")
        hosts = _job_hosts(locked) if locked.state in Job.HOLDING_STATES else []
        now = timezone.now()
        text = f"cancelled by {actor.get_username()}" + (f": {reason}" if reason else "")
        transition(locked, State.CANCELLED, text, actor=actor, at=now, finished_at=now)
        if hosts:
            _send_stop_after_commit(locked.pk, locked.attempts, hosts, "cancelled")
        if actor.pk != locked.user_id:
            audit_record(
                AuditEvent.Action.JOB_CANCELLED_BY_OTHER,
                actor=actor,
                target=f"job {locked.pk} of {locked.user.get_username()}",
                request=request,
                team=locked.team.slug,
            )
    return locked


def jobs_set_pending_info(infos: dict[int, tuple[str, int | None, Any]]) -> int:
    """Store each waiting job's (reason, position, estimated start); writes only rows that changed.

    Each pass changes the rows of every job submitted since the last one (a hundred a second under load). One
    statement run for all of them (executemany: a single pipeline on PostgreSQL) took a twentieth of the time
    of an ORM update per row, and a tenth of bulk_update's CASE. Only jobs still queued are written: one placed
    or cancelled meanwhile keeps its own.
    """
    if not infos:
        return 0
    changed = [
        (new[0][:300], new[1], new[2], pk)
        for pk, *current in Job.objects.filter(state=State.QUEUED).values_list(
            "pk", "pending_reason", "queue_position", "estimated_start")
        if (new := infos.get(pk)) is not None and tuple(current) != new
    ]
    if changed:
        with connection.cursor() as cursor:
            cursor.executemany(
                f"UPDATE {Job._meta.db_table} SET pending_reason = %s, queue_position = %s, estimated_start = %s"
                f" WHERE id = %s AND state = '{State.QUEUED}'", changed)
    return len(changed)


# --- asynchronous follow-ups, always after commit


# --- dispatch to hosts and what the agents report


def _job_hosts(job: Job) -> list[str]:
    names = JobAllocation.objects.filter(job=job, released_at__isnull=True).values_list("gpu__host__name", flat=True)
    return sorted(set(names))


def dispatch_messages(job: Job) -> list[tuple[str, Dispatch]]:
    """One Dispatch per host the job was placed on, with its GPU indices and (multi-host) rendezvous."""
    allocations = (
        JobAllocation.objects.filter(job=job, released_at__isnull=True)
        .select_related("gpu__host")
        .order_by("gpu__host__name", "gpu__index")
    )
    by_host: dict[str, list[int]] = {}
    addresses: dict[str, str] = {}
    for allocation in allocations:
        host = allocation.gpu.host
        by_host.setdefault(host.name, []).append(allocation.gpu.index)
        addresses[host.name] = host.address or host.name
    # The host with the most GPUs is node rank 0 and hosts the rendezvous store.
    order = sorted(by_host, key=lambda name: (-len(by_host[name]), name))
    preset = PRESETS.get(job.preset)
    multi_process = bool(preset and preset.multi_process)
    messages = []
    for rank, host_name in enumerate(order):
        rendezvous = None
        if len(order) > 1:
            port = 20000 + (job.pk * 7 + job.attempts) % 20000
            rendezvous = Rendezvous(
                endpoint=f"{addresses[order[0]]}:{port}", nnodes=len(order), node_rank=rank,
                run_id=f"job-{job.pk}-a{job.attempts}",
            )
        messages.append(
            (
                host_name,
                Dispatch(
                    job_id=job.pk,
                    attempt=job.attempts,
                    host=host_name,
                    gpu_indices=tuple(by_host[host_name]),
                    kind=job.kind,
                    preset=job.preset,
                    workload=job.workload,
                    time_limit_s=job.time_limit_minutes * 60,
                    max_steps=job.max_steps,
                    multi_process=multi_process or len(order) > 1,
                    rendezvous=rendezvous,
                    gpu_share=job.gpu_share_units / 100,
                    gpu_memory_mb=job.gpu_memory_mb,
                    job_token=attempt_token(job.pk, job.attempts),
                    # A gang's CPUs and memory are split between its hosts as its GPUs are.
                    cpus=_host_part(job.cpus, len(by_host[host_name]), job.gpus),
                    memory_gb=_host_part(job.memory_gb, len(by_host[host_name]), job.gpus),
                    replica_secret=_replica_secret(job),
                ),
            )
        )
    return messages


def _host_part(total: float | None, host_gpus: int, gpus: int) -> float | None:
    if total is None:
        return None
    return total if host_gpus >= gpus else round(total * host_gpus / gpus, 3)


def _replica_secret(job: Job) -> str:
    """An inference replica's secret travels in its dispatch (the broker, which jobs cannot read)."""
    return replica_secret(job.pk, job.attempts) if "serve" in job.workload else ""


def _dispatch(job_id: int) -> None:
    """Send a placed job to the queue of each of its hosts (after commit). Agents ignore stale messages."""
    from celery import current_app

    job = Job.objects.filter(pk=job_id, state=State.PLACED).first()
    if job is None:
        return
    for host_name, message in dispatch_messages(job):
        try:
            current_app.send_task(RUN_JOB_TASK, args=[message.to_message()], queue=host_queue(host_name))
        except Exception:  # noqa: BLE001 - a broker outage must not fail the pass; the reaper re-sends
            logger.warning("could not dispatch job %s to %s; it will be re-sent", job_id, host_name, exc_info=True)


def _send_stop_after_commit(job_id: int, attempt: int, hosts: list[str], reason: str) -> None:
    def send() -> None:
        from celery import current_app

        for host_name in hosts:
            try:
                current_app.send_task(STOP_JOB_TASK, args=[job_id, attempt, reason], queue=host_queue(host_name))
            except Exception:  # noqa: BLE001 - the heartbeat reply tells the agent too
                logger.warning("could not send stop for job %s to %s", job_id, host_name, exc_info=True)

    transaction.on_commit(send)


# What an agent's "running" report tells about how the attempt runs, kept in the job's runtime_info: how it is
# isolated (workers.protocol.JobIsolation), how a fractional job's GPU share is held, the limits applied.
RUNTIME_INFO_KEYS = ("isolation", "isolation_uid", "isolation_note", "gpu_share", "gpu_memory_limit_mb", "limits")


class AgentReportError(Exception):
    """A report that does not apply: the job is not on this host, or the report is from an older attempt."""


def _job_for_host(job_id: int, host: Host, attempt: int) -> Job:
    """The job, locked, if `host` runs its current attempt `attempt`: only the hosts that hold its GPUs now may
    report on it (a host that ran an earlier attempt, or was never given the job, may not)."""
    job = lock_job(job_id)
    if job is None:
        raise AgentReportError(f"job {job_id} does not run on host {host.name}")
    if attempt != job.attempts:
        raise AgentReportError(f"report for attempt {attempt}, but job {job_id} is at attempt {job.attempts}")
    if not JobAllocation.objects.filter(job=job, gpu__host=host, released_at__isnull=True).exists():
        raise AgentReportError(f"job {job_id} attempt {attempt} does not run on host {host.name}")
    return job


def job_report_status(*, host: Host, job_id: int, status: JobStatus) -> tuple[Job, bool]:
    """Apply what an agent reports about its part of a job. Returns the job and whether the report counted.

    A "running" report is the agent's claim to start its node of the attempt: only the first claim per node
    counts, so a redelivered dispatch message starts nothing. Repeated final reports are no-ops.
    """
    with transaction.atomic():
        job = _job_for_host(job_id, host, status.attempt)
        now = timezone.now()
        if job.state not in Job.HOLDING_STATES:
            return job, False  # cancelled, requeued or finished meanwhile: nothing to do
        results = dict(job.node_results)
        node = str(status.node_rank)
        if status.state == "running":
            if node in results:
                return job, False
            results[node] = {"state": "running", "host": host.name}
            fields: dict[str, Any] = {"node_results": results}
            reported = {key: status.details[key] for key in RUNTIME_INFO_KEYS if key in status.details}
            if "limits" in reported:
                reported["limits"] = _reported_limits(reported["limits"])
            if isinstance(reported.get("isolation_note"), str):
                reported["isolation_note"] = reported["isolation_note"][:500]
            if reported:
                fields["runtime_info"] = {**job.runtime_info, **reported}
            Job.objects.filter(pk=job.pk).update(**fields)
            if job.state == State.PLACED:
                transition(job, State.RUNNING, f"process started on {host.name}", at=now, started_at=now,
                           data=status.details)
            return job, True
        if results.get(node, {}).get("state") not in (None, "running"):
            return job, False
        results[node] = {"state": status.state, "exit_code": status.exit_code, "reason": status.reason,
                         "host": host.name}
        Job.objects.filter(pk=job.pk).update(node_results=results)
        if status.state == "preempted":
            preempt_and_requeue(job, f"preempted on {host.name}: {status.reason or 'checkpoint saved'}", at=now)
        elif status.state == "failed":
            hosts = _job_hosts(job)
            reason = status.reason or f"exited with code {status.exit_code}"
            if len(hosts) > 1:
                reason = f"{reason} (on {host.name})"
            _finish(job, State.FAILED, reason, now, exit_code=status.exit_code, data=status.details)
            others = [name for name in hosts if name != host.name]
            if others:
                _send_stop_after_commit(job.pk, job.attempts, others, "another node of the job failed")
        elif status.state == "succeeded":
            nodes = len(_job_hosts(job))
            done = sum(1 for r in results.values() if r["state"] == "succeeded")
            if done >= nodes:
                _finish(job, State.SUCCEEDED, status.reason or "exited with code 0", now, exit_code=0,
                        data=status.details)
        return job, True


_LIMIT_KEYS = {"applied": bool, "reason": str, "cgroup": str, "cpus": (int, float), "memory_gb": (int, float),
               "pids": int, "devices": str}


def _reported_limits(value: Any) -> dict[str, Any] | None:
    """What the host says of a job's cgroup limits (runtime_info.limits): the known keys, scalar values only."""
    if not isinstance(value, dict):
        return None
    return {key: (item[:300] if isinstance(item, str) else item) for key, item in value.items()
            if key in _LIMIT_KEYS and (item is None or isinstance(item, _LIMIT_KEYS[key]))}


def _finish(job: Job, to_state: str, reason: str, now, *, exit_code: int | None, data: dict | None = None) -> None:
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
        hosts = _job_hosts(job)
        retry = job.attempts  # attempts counts placements; the first run is not a retry
        why = reason or f"{host.name} stopped sending heartbeats"
        if retry <= job.max_retries:
            requeue(job, f"host lost: {why}; requeued, retry {retry} of {job.max_retries}", at=now)
            outcome = State.QUEUED
        else:
            _finish(job, State.FAILED, f"host lost: {why}", now, exit_code=None)
            outcome = State.FAILED
        others = [name for name in hosts if name != host.name]
        if others:
            _send_stop_after_commit(job.pk, job.attempts, others, f"host {host.name} of the job was lost")
        return outcome


def job_append_log(*, host: Host, job_id: int, attempt: int, data: str) -> int:
    """Append output to the job's log, capped at JOBS_LOG_MAX_CHARS. Returns the log's size."""

    limit = settings.JOBS_LOG_MAX_CHARS
    with transaction.atomic():
        job = _job_for_host(job_id, host, attempt)
        if job.log_truncated or not data:
            return job.log_size
        data = data.replace("\x00", "\ufffd")
        room = limit - job.log_size
        truncated = len(data) > room
        if truncated:
            data = data[:max(room, 0)] + f"\n[log truncated at {limit} characters; the job keeps running]\n"
        JobLogChunk.objects.create(job=job, offset=job.log_size, data=data)
        size = job.log_size + len(data)
        Job.objects.filter(pk=job.pk).update(log_size=size, log_truncated=truncated)
        return size


def job_record_progress(*, host: Host, job_id: int, attempt: int, progress: dict[str, Any]) -> None:
    with transaction.atomic():
        job = _job_for_host(job_id, host, attempt)
        if progress.get("type") == "serving":
            port = progress.get("port")
            # Only the port comes from the job; the address is the reporting host's registered one. The
            # serving reconciler builds the URL it calls again from the placement's host and this port.
            if type(port) is int and 0 < port < 65536:
                address = host.address or host.name
                Job.objects.filter(pk=job.pk).update(
                    runtime_info={**job.runtime_info, "endpoint": f"http://{address}:{port}", "port": port,
                                  "attempt": attempt})
            return
        _record_training_progress(job, progress)


def job_record_own_progress(*, job: Job, progress: dict[str, Any]) -> None:
    """Progress a running job reports itself, with its attempt token (the job API)."""
    with transaction.atomic():
        locked = lock_job(job.pk)
        if locked is not None and locked.state == State.RUNNING and locked.attempts == job.attempts:
            _record_training_progress(locked, progress)


def _record_training_progress(job: Job, progress: dict[str, Any]) -> None:
    fields: dict[str, Any] = {}
    if isinstance(progress.get("step"), int) and progress["step"] >= 0:
        fields["steps_done"] = progress["step"]
        fields["progress_at"] = timezone.now()
    for source, target in [("steps_per_s", "steps_per_second"), ("samples_per_s", "samples_per_second"),
                           ("loss", "last_loss")]:
        value = progress.get(source)
        if isinstance(value, int | float) and value == value and abs(value) < 1e30:
            fields[target] = float(value)
    if fields:
        Job.objects.filter(pk=job.pk).update(**fields)


REAPER_LAST_RUN_KEY = "jobs:reaper-last-run"
REAPER_GRACE_UNTIL_KEY = "jobs:reaper-grace-until"


def reaper_outage_grace(interval_s: float) -> bool:
    """True while hosts must not be declared lost because the console itself was not listening.

    When the reaper has not completed for several intervals (the database or the worker was down), the agents'
    heartbeats had nowhere to go: every host looks silent. Each gets one full heartbeat timeout to report again
    before it counts as lost. An empty cache (first start, Redis restarted) counts as such a gap.
    """
    now = time.time()
    last_run = cache.get(REAPER_LAST_RUN_KEY)
    if last_run is None or now - last_run > max(3 * interval_s, 15.0):
        cache.set(REAPER_GRACE_UNTIL_KEY, now + HEARTBEAT_TIMEOUT_S, timeout=int(HEARTBEAT_TIMEOUT_S) + 60)
        logger.warning("the reaper has not run since %s: hosts get %.0f s to send a heartbeat before they count "
                       "as lost", "the start" if last_run is None else f"{now - last_run:.0f} s ago",
                       HEARTBEAT_TIMEOUT_S)
        return True
    grace_until = cache.get(REAPER_GRACE_UNTIL_KEY)
    return grace_until is not None and now < grace_until


def reaper_completed() -> None:
    cache.set(REAPER_LAST_RUN_KEY, time.time(), timeout=None)


def jobs_on_lost_hosts() -> list[tuple[int, str]]:
    """Mark hosts without heartbeats down and fail or requeue their jobs. Returns (job id, outcome) pairs."""
    from apps.cluster.services import hosts_mark_lost

    outcomes = []
    lost = hosts_mark_lost()
    if lost:
        from apps.telemetry.alerts import check_hosts

        check_hosts(lost, [])
    for host in lost:
        job_ids = (
            Job.objects.filter(state__in=Job.HOLDING_STATES, allocations__gpu__host=host,
                               allocations__released_at__isnull=True)
            .values_list("pk", flat=True)
            .distinct()
        )
        for job_id in job_ids:
            outcome = job_host_lost(job_id, host)
            if outcome:
                outcomes.append((job_id, outcome))
    return outcomes


def jobs_redispatch_stale(older_than_s: float = 60.0) -> list[int]:
    """Re-send dispatch for jobs placed a while ago whose process never started (a lost message)."""

    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    stale = list(Job.objects.filter(state=State.PLACED, placed_at__lt=cutoff).values_list("pk", flat=True))
    for job_id in stale:
        _dispatch(job_id)
    return stale


def jobs_missing_on_host(host: Host, running: list[tuple[int, int]], *, grace_s: float = 20.0) -> list[int]:
    """Jobs the console believes run on `host` that its agent no longer lists (say, the agent restarted).

    Each is requeued or failed like a job on a lost host. A node that already reported its end is not missing.
    """

    listed = set(running)
    cutoff = timezone.now() - timedelta(seconds=grace_s)
    candidates = (
        Job.objects.filter(state=State.RUNNING, started_at__lt=cutoff, allocations__gpu__host=host,
                           allocations__released_at__isnull=True)
        .distinct()
        .values_list("pk", "attempts", "node_results")
    )
    missing = []
    for job_id, attempt, results in candidates:
        if (job_id, attempt) in listed:
            continue
        mine = [r for r in results.values() if r.get("host") == host.name]
        if any(r.get("state") != "running" for r in mine):
            continue  # this host's node finished and reported; other nodes still run
        if job_host_lost(job_id, host, reason=f"its process is gone: the agent on {host.name} no longer runs it"):
            missing.append(job_id)
    return missing


def job_preempt(job_id: int, reason: str) -> bool:
    """Stop a job to free its GPUs: it checkpoints, exits and goes back to the queue, keeping its place in line.

    A running job keeps its GPUs until its agent reports that it stopped (the checkpoint is written by then); a
    placed job that has not started is requeued at once.
    """

    with transaction.atomic():
        job = lock_job(job_id)
        if job is None or job.state not in Job.HOLDING_STATES:
            return False
        now = timezone.now()
        if job.preempt_requested_at and now - job.preempt_requested_at < timedelta(seconds=60):
            return False  # already asked; the agent is checkpointing
        hosts = _job_hosts(job)
        if job.state == State.PLACED:
            preempt_and_requeue(job, f"preempted before it started: {reason}", at=now)
        else:
            Job.objects.filter(pk=job.pk).update(preempt_requested_at=now)
            note(job, f"preemption requested: {reason}")
        _send_preempt_after_commit(job.pk, job.attempts, hosts, reason)
        return True


def _send_preempt_after_commit(job_id: int, attempt: int, hosts: list[str], reason: str) -> None:
    def send() -> None:
        from celery import current_app

        for host_name in hosts:
            try:
                current_app.send_task(STOP_JOB_TASK, args=[job_id, attempt, reason],
                                      kwargs={"state": "preempted"}, queue=host_queue(host_name))
            except Exception:  # noqa: BLE001 - the next pass asks again after a minute
                logger.warning("could not send preemption of job %s to %s", job_id, host_name, exc_info=True)

    transaction.on_commit(send)


def job_release(job_id: int, reason: str) -> bool:
    """Stop a job by policy (no user acts): it gets SIGTERM, so the runtime checkpoints, and ends cancelled."""
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None or job.state not in ACTIVE_STATES:
            return False
        now = timezone.now()
        hosts = _job_hosts(job) if job.state in Job.HOLDING_STATES else []
        transition(job, State.CANCELLED, reason, at=now, finished_at=now)
        if hosts:
            _send_stop_after_commit(job.pk, job.attempts, hosts, reason)
        return True


def ledger_reconcile() -> dict[str, int]:
    """Check (and repair) that held GPUs are exactly those of placed and running jobs.

    Usage is always derived from job records, so a team's GPUs held is the sum over its placed and running jobs by
    construction; what can drift after a crash is the allocation and ledger rows beside them. Anything found is
    repaired here and reported as an alert.
    """
    now = timezone.now()
    found = {"stray_allocations": 0, "open_segments": 0, "jobs_without_gpus": 0}
    with transaction.atomic():
        stray = JobAllocation.objects.filter(released_at__isnull=True).exclude(job__state__in=Job.HOLDING_STATES)
        found["stray_allocations"] = stray.update(released_at=now)
        segments = UsageSegment.objects.filter(ended_at__isnull=True).exclude(job__state__in=Job.HOLDING_STATES)
        found["open_segments"] = segments.update(ended_at=now)
    from django.db.models import Count, Q

    short = (Job.objects.filter(state__in=Job.HOLDING_STATES)
             .annotate(held=Count("allocations", filter=Q(allocations__released_at__isnull=True)))
             .exclude(held=models_F("gpus")).values_list("pk", flat=True))
    for job_id in list(short):
        with transaction.atomic():
            job = lock_job(job_id)
            if job is not None and job.state in Job.HOLDING_STATES:
                _finish(job, State.FAILED, "its GPU allocation was lost (repaired by the ledger check)", now,
                        exit_code=None)
                found["jobs_without_gpus"] += 1
    if any(found.values()):
        logger.warning("ledger check repaired: %s", found)
        from apps.telemetry.alerts import report_inconsistency

        report_inconsistency(found)
    return found

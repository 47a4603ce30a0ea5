"""Submission: a spec checked against the user's role, the team's limits and the cluster, then queued."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import Field, Model
from django.http import HttpRequest
from django.utils import timezone

from apps.accounts import access
from apps.accounts.access import Action
from apps.accounts.models import Membership, Role, Team
from apps.cluster.selectors import GpuPools, gpu_pools, gpu_pools_from_json, gpu_pools_subquery
from apps.jobs.bulk import MAX_BULK_CANCEL
from apps.jobs.container_spec import checked_environment
from apps.jobs.errors import JobPermissionError, JobRateLimited, JobSpecError
from apps.jobs.lifecycle import request_scheduler_pass
from apps.jobs.models import Job, JobEvent
from apps.jobs.usage import budget_exhausted
from apps.jobs.workload_shape import checked_workload
from apps.quotas.models import PRIORITY_RANK, Priority, TeamQuota, UserQuota
from apps.quotas.services import quota_ensure
from apps.scheduling.placeability import gpu_type_key
from workers.runtime.catalog import PRESETS, WORKLOADS, validate_params

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
    # May share its one GPU with another shareable job when both leave it mostly idle (apps/jobs/colocating.py);
    # None: the team's default (settings.COLOCATION_SHAREABLE_TEAMS), for the jobs that may share.
    shareable: bool | None = None
    # A fraction of one GPU, in 1/100s (100: whole GPUs), or memory on one GPU.
    gpu_share_units: int = 100
    gpu_memory_mb: int | None = None
    # CPUs and host memory (the job's cgroup limits); None: the per-GPU defaults.
    cpus: float | None = None
    memory_gb: float | None = None
    # Its environment (apps/jobs/container_spec.py): an OCI image (none: the job runs on the host), plain
    # variables, names of team secrets and volumes, code ({"snapshot": ID} or {"git": {"url", "ref"}}), /dev/shm.
    image: str = ""
    env: Any = None
    secrets: Any = None
    mounts: Any = None
    code: Any = None
    shm_gb: float | None = None
    # A job array: this many tasks, alike but for their index (None: one job, not an array), at most
    # `array_parallelism` of them holding GPUs at once (None: no limit of the array's own).
    array_size: int | None = None
    array_parallelism: int | None = None

    @property
    def units(self) -> int:
        return self.gpus * self.gpu_share_units


def default_preset(kind: str) -> str:
    return "baseline-fp32" if kind == Job.Kind.TRAIN else "infer-fp32"


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
        team = Team.objects.filter(slug=slug).first() if access.is_admin(user) else None
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
    submittable = [m for m in memberships if access.role_may(m.role, Action.SUBMIT)]
    if len(submittable) == 1:
        return submittable[0].team.slug
    if not submittable:
        raise JobSpecError({"team": ["You are not a member of any team that may submit jobs."]})
    names = ", ".join(sorted(m.team.slug for m in submittable))
    raise JobSpecError({"team": [f"You belong to several teams; name one of: {names}."]})


def _check_role_and_priority(user: AbstractBaseUser, team: Team, role: Role | None, priority: str,
                             max_priority: str) -> None:
    """Who may submit at which priority is the access policy's; how high the team may go is its quota's."""
    admin = access.is_admin(user)
    if admin:
        return
    if not access.role_may(role, Action.SUBMIT):
        raise JobPermissionError(f"Viewers of team {team.slug} cannot submit jobs.")
    if priority == Priority.URGENT and not access.role_may(role, Action.SUBMIT_URGENT):
        raise JobSpecError({"priority": ["Only site admins may submit urgent jobs."]})
    if priority == Priority.HIGH and not access.role_may(role, Action.SUBMIT_HIGH):
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
        # A built-in workload's model, or a service's own server in its image (its command, checked there).
        if kind != Job.Kind.INFERENCE or (serve.get("workload") not in WORKLOADS and not serve.get("command")):
            errors["workload"] = {"serve": ["A replica serves a built-in workload's model or runs a service's own "
                                            "server, in an inference job."]}
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


def may_share(spec: JobSpec) -> bool:
    """Whether the job may be shareable: a training job of one whole GPU."""
    return spec.gpus == 1 and spec.gpu_share_units == 100 and spec.gpu_memory_mb is None and spec.kind == "train"


def _check_gpus(spec: JobSpec, submitter: _Submitter) -> dict[str, object]:
    team, quota = submitter.team, submitter.quota
    pools = submitter.pools or gpu_pools()
    errors: dict[str, object] = {}
    if spec.gpu_type:
        if not pools.known(spec.gpu_type):
            known = ", ".join(sorted(pools.counts)) or "none registered yet"
            errors["gpu_type"] = [f"Unknown GPU type '{spec.gpu_type}'; registered types: {known}."]
        elif quota.allowed_gpu_types and spec.gpu_type not in {gpu_type_key(t) for t in quota.allowed_gpu_types}:
            allowed = ", ".join(quota.allowed_gpu_types)
            errors["gpu_type"] = [f"Team {team.slug} may use only these GPU types: {allowed}."]
    if spec.shareable and not may_share(spec):
        errors["shareable"] = ["Only a training job of one whole GPU may share it (gpus 1, no gpu_memory_gb): the "
                               "console sizes the shares once it has measured the job."]
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


def _check_array(spec: JobSpec) -> dict[str, object]:
    size = spec.array_size
    if size is None:
        if spec.array_parallelism is not None:
            return {"array_parallelism": ["Only for a job array: give array_size too."]}
        return {}
    if spec.array_parallelism is not None and not 1 <= spec.array_parallelism <= MAX_ARRAY_SIZE:
        return {"array_parallelism": [f"At most 1 to {MAX_ARRAY_SIZE} tasks at once."]}
    if not 1 <= size <= MAX_ARRAY_SIZE:
        return {"array_size": [f"An array has 1 to {MAX_ARRAY_SIZE} tasks."]}
    if spec.kind != Job.Kind.TRAIN:
        return {"array_size": ["Arrays are of training jobs (an inference service scales its own replicas)."]}
    return {}


# The most tasks of one job array: as many as one request cancels (apps/jobs/bulk.py).
MAX_ARRAY_SIZE = MAX_BULK_CANCEL
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


def job_submit(*, user: AbstractBaseUser, spec: JobSpec, request: HttpRequest | None = None,
               replica: bool = False, service_group: str = "") -> Job:
    """Queue a job after checking the spec, the user's role and the team's limits.

    Every check of a spec is here, so the API, the pages and the CLI get the same answers. `replica`: the serving
    app submits a replica of a service, whose workload ({"serve": ...}) it built itself, naming the service's
    replicas' `service_group`; users never may.

    The checks only read. The write is the part that must be exact under concurrency, and it is kept as short as
    the bare insert it is benchmarked against (benchmarks/submit_load.py): the user's row lock, one statement
    that inserts the job and its event and counts the user's recent submissions, and the commit. Holding the
    lock through the checks (as before) made one user's concurrent submissions queue behind it with the CPU idle.
    """
    preset = spec.preset or default_preset(spec.kind)
    if spec.gpu_type:
        spec = replace(spec, gpu_type=gpu_type_key(spec.gpu_type))
    submitter = _submitter(user, spec.team)
    team, quota = submitter.team, submitter.quota
    _check_role_and_priority(user, team, submitter.role, spec.priority, quota.max_priority)
    workload, problem = checked_workload(spec.workload, replica=replica)
    errors: dict[str, object] = {"workload": problem} if problem else _check_workload(spec.kind, preset, workload)
    errors.update(_check_gpus(spec, submitter))
    errors.update(_check_array(spec))
    cpus, memory_gb = _resources(spec, submitter.pools or gpu_pools(), errors)
    environment = checked_environment(image=spec.image, env=spec.env, secrets=spec.secrets, mounts=spec.mounts,
                                      code=spec.code, shm_gb=spec.shm_gb, team=team, memory_gb=memory_gb,
                                      errors=errors)
    if not errors and budget_exhausted(team, quota):
        errors["team"] = [f"Team {team.slug} has used its {quota.gpu_hours_per_month} GPU-hour budget this month."]
    if errors:
        raise JobSpecError(errors)
    job = Job(
        name=spec.name,
        team=team,
        user=user,
        kind=spec.kind,
        service_group=service_group if replica else "",
        gpus=spec.gpus,
        gpu_type=spec.gpu_type or "",
        priority=spec.priority,
        preset=preset,
        workload=workload,
        max_steps=spec.max_steps,
        time_limit_minutes=spec.time_limit_minutes or _default_time_limit(),
        max_retries=spec.max_retries,
        shareable=spec.shareable if spec.shareable is not None else (
            team.slug in settings.COLOCATION_SHAREABLE_TEAMS and may_share(spec)),
        gpu_share_units=spec.gpu_share_units,
        gpu_memory_mb=spec.gpu_memory_mb,
        cpus=cpus,
        memory_gb=memory_gb,
        image=environment.image,
        env=environment.env,
        secrets=environment.secrets,
        mounts=environment.mounts,
        code_snapshot=environment.code.snapshot,
        git_url=environment.code.git_url,
        git_ref=environment.code.git_ref,
        git_commit=environment.code.git_commit,
        shm_gb=environment.shm_gb,
        # The pass requested below replaces this with the job's real standing (quota, position) within a second.
        pending_reason="waiting for the scheduler",
        array_index=None if spec.array_size is None else 0,
        array_size=spec.array_size,
        array_parallelism=spec.array_parallelism,
    )
    limit = settings.JOBS_SUBMIT_PER_MINUTE
    tasks = spec.array_size or 1
    with transaction.atomic():
        _lock_user(user)
        recent = _insert_submission(job, _submitted_event(user), since=timezone.now() - timedelta(minutes=1))
        if recent + tasks > limit:  # raised inside the transaction: the insert is rolled back
            asked = f" and asked for {tasks} more" if tasks > 1 else ""
            raise JobRateLimited(f"You submitted {recent} jobs in the last minute{asked}; the limit is {limit} per "
                                 "minute.")
        if spec.array_size is not None:
            _insert_array_tasks(job, user)
        request_scheduler_pass()
    return job


def _submitted_event(user: AbstractBaseUser) -> JobEvent:
    return JobEvent(to_state=State.QUEUED, reason=f"submitted by {user.get_username()}", actor=user)


def _insert_array_tasks(first: Job, user: AbstractBaseUser) -> None:
    """The array's other tasks, copies of its first (inserted already) but for their index; every task's
    array_id is the first's id. In the submission's transaction, under the user's lock."""
    first.array_id = first.pk
    Job.objects.filter(pk=first.pk).update(array_id=first.pk)
    fields = [field.attname for field in Job._meta.concrete_fields if not field.primary_key]
    tasks = [Job(**{name: getattr(first, name) for name in fields}) for _ in range(1, first.array_size or 1)]
    for index, task in enumerate(tasks, start=1):
        task.array_index = index
    # (one statement each for the tasks and their events: one by one, 500 tasks held the user's lock 2-3 s)
    events = [_submitted_event(user) for _ in tasks]
    for task, event in zip(Job.objects.bulk_create(tasks), events, strict=True):
        event.job = task
    JobEvent.objects.bulk_create(events)


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

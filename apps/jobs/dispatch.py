"""Messages to the hosts' queues, always after commit: run a placed job, stop or preempt one."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from apps.accounts.secrets import validate_secret_names
from apps.cluster.volumes import resolve_mounts
from apps.core.errors import InvalidInput
from apps.jobs.attempt_tokens import attempt_token, replica_secret
from apps.jobs.models import Job, JobAllocation
from workers.protocol import (
    JOB_CODE_PATH,
    RUN_JOB_TASK,
    STOP_JOB_TASK,
    ArrayTask,
    CodeSnapshot,
    ContainerSpec,
    Dispatch,
    Rendezvous,
    host_queue,
)
from workers.runtime.catalog import PRESETS

logger = logging.getLogger(__name__)
State = Job.State
# How far back a dispatch names the jobs that held its GPUs: well past an agent's SIGTERM grace (5 s by default).
RELEASED_LATELY_S = 120


def job_hosts(job: Job) -> list[str]:
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
    gpu_ids: dict[str, list[int]] = {}
    addresses: dict[str, str] = {}
    for allocation in allocations:
        host = allocation.gpu.host
        by_host.setdefault(host.name, []).append(allocation.gpu.index)
        gpu_ids.setdefault(host.name, []).append(allocation.gpu_id)
        addresses[host.name] = host.address or host.name
    # The host with the most GPUs is node rank 0 and hosts the rendezvous store.
    order = sorted(by_host, key=lambda name: (-len(by_host[name]), name))
    preset = PRESETS.get(job.preset)
    multi_process = bool(preset and preset.multi_process)
    container = container_spec(job)
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
                    replica_secret=replica_secret_of(job),
                    container=container,
                    array=array_task_of(job),
                    after=released_lately(job, gpu_ids[host_name]),
                ),
            )
        )
    return messages


def released_lately(job: Job, gpu_ids: list[int]) -> tuple[tuple[int, int], ...]:
    """(job, attempt) of the other jobs whose hold on any of these GPUs ended in the last RELEASED_LATELY_S: a
    cancelled one may still be stopping on its host (its SIGTERM grace), and the agent starts `job` after it."""
    since = timezone.now() - timedelta(seconds=RELEASED_LATELY_S)
    rows = (JobAllocation.objects.filter(gpu_id__in=gpu_ids, released_at__gte=since).exclude(job=job)
            .values_list("job_id", "attempt").distinct().order_by("job_id", "attempt"))
    return tuple((job_id, attempt) for job_id, attempt in rows)


def array_task_of(job: Job) -> ArrayTask | None:
    if job.array_id is None or job.array_index is None or job.array_size is None:
        return None
    return ArrayTask(array_id=job.array_id, index=job.array_index, size=job.array_size)


def container_spec(job: Job) -> ContainerSpec:
    """The job's environment for its agent. Volume paths are read now, at each dispatch (a moved volume reaches
    the next attempt without editing the job). Secrets travel by name only, checked to exist now: the message
    crosses the broker, so the agent fetches their values over the agent API just before the container starts
    (apps/jobs/job_api.py JobSecretsView), and a rotated secret reaches the next attempt."""
    code = None
    snapshot = job.code_snapshot if job.code_snapshot_id is not None else None
    if snapshot is not None:
        code = CodeSnapshot(kind="upload", url=JOB_CODE_PATH, sha256=snapshot.sha256, size=snapshot.size)
    elif job.git_url:
        code = CodeSnapshot(kind="git", url=job.git_url, ref=job.git_ref, commit=job.git_commit)
    return ContainerSpec(
        image=job.image,
        env=dict(job.env or {}),
        secrets=_existing_secrets(job),
        mounts=tuple(resolve_mounts(job.team_id, list(job.mounts))) if job.mounts else (),
        code=code,
        shm_gb=job.shm_gb,
    )


def _existing_secrets(job: Job) -> tuple[str, ...]:
    names = [str(name) for name in job.secrets or ()]
    validate_secret_names(job.team_id, names)  # one deleted since submission: InvalidInput, the job cannot start
    return tuple(names)


def _host_part(total: float | None, host_gpus: int, gpus: int) -> float | None:
    if total is None:
        return None
    return total if host_gpus >= gpus else round(total * host_gpus / gpus, 3)


def replica_secret_of(job: Job) -> str:
    """An inference replica's secret travels in its dispatch (the broker, which jobs cannot read)."""
    return replica_secret(job.pk, job.attempts) if "serve" in job.workload else ""


def dispatch_job(job_id: int) -> None:
    """Send a placed job to the queue of each of its hosts (after commit). Agents ignore stale messages."""
    from celery import current_app

    job = Job.objects.select_related("code_snapshot").filter(pk=job_id, state=State.PLACED).first()
    if job is None:
        return
    try:
        messages = dispatch_messages(job)
    except InvalidInput as refusal:
        # A secret or volume the job names is gone (or unreadable) since it was submitted: it cannot run.
        from apps.jobs.lifecycle import job_finish  # (lifecycle sends its stops through this module)

        problems = "; ".join(f"{field}: {' '.join(map(str, msgs)) if isinstance(msgs, list) else msgs}"
                             for field, msgs in refusal.errors.items())
        job_finish(job.pk, succeeded=False, exit_code=None, reason=f"cannot start: {problems}"[:500])
        return
    for host_name, message in messages:
        try:
            current_app.send_task(RUN_JOB_TASK, args=[message.to_message()], queue=host_queue(host_name))
        except Exception:  # noqa: BLE001 - a broker outage must not fail the pass; the reaper re-sends
            logger.warning("could not dispatch job %s to %s; it will be re-sent", job_id, host_name, exc_info=True)


def send_stop_after_commit(job_id: int, attempt: int, hosts: list[str], reason: str) -> None:
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


def jobs_redispatch_stale(older_than_s: float = 60.0) -> list[int]:
    """Re-send dispatch for jobs placed a while ago whose process never started (a lost message)."""

    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    stale = list(Job.objects.filter(state=State.PLACED, placed_at__lt=cutoff).values_list("pk", flat=True))
    for job_id in stale:
        dispatch_job(job_id)
    return stale


def send_preempt_after_commit(job_id: int, attempt: int, hosts: list[str], reason: str) -> None:
    def send() -> None:
        from celery import current_app

        for host_name in hosts:
            try:
                current_app.send_task(STOP_JOB_TASK, args=[job_id, attempt, reason],
                                      kwargs={"state": "preempted"}, queue=host_queue(host_name))
            except Exception:  # noqa: BLE001 - the next pass asks again after a minute
                logger.warning("could not send preemption of job %s to %s", job_id, host_name, exc_info=True)

    transaction.on_commit(send)

"""What agents report about the jobs they run (status, log output, progress, the jobs they still run), applied;
and the one thing an agent fetches for a job it is about to start: its secret values."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.accounts.secrets import secret_values
from apps.cluster.models import Host
from apps.core.errors import WrongState
from apps.jobs import colocating
from apps.jobs.dispatch import job_hosts, send_stop_after_commit
from apps.jobs.lifecycle import (
    finish,
    job_host_lost,
    lock_job,
    move_requested,
    preempt_and_requeue,
    release_requested,
    transition,
)
from apps.jobs.metrics import db_step, record_metrics
from apps.jobs.models import Job, JobAllocation, JobLogChunk
from workers.protocol import (
    JobStatus,
    ResultRecord,
    ServingProgress,
    TrainingProgress,
    decode_progress_message,
    unseen_output,
)

State = Job.State


class AgentReportError(WrongState):
    """A report that does not apply: the job is not on this host, or the report is from an older attempt (409)."""


# A job cancelled (or ended by the console) while it ran has its GPUs released at once, while its processes still
# get SIGTERM and their grace: what they print meanwhile ("checkpoint saved at step N") is still taken from the
# hosts that ran that last attempt, for this long after the end.
LATE_OUTPUT_S = 300


def _job_for_host(job_id: int, host: Host, attempt: int, *, late_output: bool = False) -> Job:
    """The job, locked, if `host` runs its current attempt `attempt`: only the hosts that hold its GPUs now may
    report on it (a host that ran an earlier attempt, or was never given the job, may not). `late_output`: also
    a job whose last attempt ended on `host` less than LATE_OUTPUT_S ago (its output only)."""
    job = lock_job(job_id)
    if job is None:
        raise AgentReportError(f"job {job_id} does not run on host {host.name}")
    if attempt != job.attempts:
        raise AgentReportError(f"report for attempt {attempt}, but job {job_id} is at attempt {job.attempts}")
    if not JobAllocation.objects.filter(job=job, gpu__host=host, released_at__isnull=True).exists() and not (
        late_output and _ended_here_lately(job, host, attempt)
    ):
        raise AgentReportError(f"job {job_id} attempt {attempt} does not run on host {host.name}")
    return job


def _ended_here_lately(job: Job, host: Host, attempt: int) -> bool:
    return (
        job.state in Job.FINAL_STATES
        and job.finished_at is not None
        and timezone.now() - job.finished_at < timedelta(seconds=LATE_OUTPUT_S)
        and JobAllocation.objects.filter(job=job, gpu__host=host, attempt=attempt).exists()
    )


def job_secret_values(*, host: Host, job_id: int, attempt: int) -> dict[str, str]:
    """The values of the team secrets job `job_id` names, for the agent of `host` to hand its attempt `attempt`:
    only while that attempt is the job's current one, placed or running, with GPUs on `host` (AgentReportError
    otherwise: another host, an older attempt, a job that ended). A secret gone since: InvalidInput (`secrets`)."""
    with transaction.atomic():
        job = _job_for_host(job_id, host, attempt)
        if job.state not in (State.PLACED, State.RUNNING):
            raise AgentReportError(f"job {job_id} attempt {attempt} is {job.state}: its secrets are not handed out")
        if not job.image and host.job_isolation != "own-uid":  # (placement keeps such jobs off it: host_needs)
            raise AgentReportError(f"host {host.name} does not run each job under a uid of its own: job {job_id} "
                                   "has no image, so its secrets are not handed out there")
        return secret_values(job.team_id, [str(name) for name in job.secrets or ()])


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
            details = status.running_details()  # only what the console can use of the agent's report
            reported = details.runtime_info()
            if reported:
                fields["runtime_info"] = {**job.runtime_info, **reported}
            Job.objects.filter(pk=job.pk).update(**fields)
            if job.state == State.PLACED:
                transition(job, State.RUNNING, f"process started on {host.name}", at=now, started_at=now,
                           data=details.to_details())
            return job, True
        if results.get(node, {}).get("state") not in (None, "running"):
            return job, False
        results[node] = {"state": status.state, "exit_code": status.exit_code, "reason": status.reason,
                         "host": host.name}
        Job.objects.filter(pk=job.pk).update(node_results=results)
        if status.state == "preempted" and release_requested(job):
            hosts = job_hosts(job)
            transition(job, State.CANCELLED, f"released by policy after its checkpoint on {host.name}: "
                       f"{status.reason or 'checkpoint saved'}", at=now, finished_at=now, exit_code=status.exit_code)
            others = [name for name in hosts if name != host.name]
            if others:
                send_stop_after_commit(job.pk, job.attempts, others, "the job was released")
        elif status.state == "preempted":
            preempt_and_requeue(job, f"preempted on {host.name}: {status.reason or 'checkpoint saved'}", at=now,
                                counts=not move_requested(job))
        elif status.state == "failed":
            hosts = job_hosts(job)
            reason = status.reason or f"exited with code {status.exit_code}"
            if len(hosts) > 1:
                reason = f"{reason} (on {host.name})"
            finish(job, State.FAILED, reason, now, exit_code=status.exit_code, data=status.details)
            others = [name for name in hosts if name != host.name]
            if others:
                send_stop_after_commit(job.pk, job.attempts, others, "another node of the job failed")
        elif status.state == "succeeded":
            nodes = len(job_hosts(job))
            done = sum(1 for r in results.values() if r["state"] == "succeeded")
            if done >= nodes:
                finish(job, State.SUCCEEDED, status.reason or "exited with code 0", now, exit_code=0,
                        data=status.details)
        return job, True


def job_append_log(*, host: Host, job_id: int, attempt: int, data: str, offset: int | None = None,
                   stream: str = "") -> int:
    """Append output to the job's log, capped at JOBS_LOG_MAX_CHARS. Returns the log's size.

    `offset`: where `data` starts in the output the agent's sender `stream` has sent for the attempt; what the
    console already holds of it (a chunk sent again) is not stored twice. Without it (an older agent) the chunk is
    appended as it comes."""

    limit = settings.JOBS_LOG_MAX_CHARS
    with transaction.atomic():
        job = _job_for_host(job_id, host, attempt, late_output=True)
        changes: dict[str, Any] = {}
        if offset is not None:
            key = f"{attempt}/{host.pk}/{stream}"  # (streams of earlier attempts are dropped)
            received = int(job.log_streams.get(key, 0))
            streams = {k: n for k, n in job.log_streams.items() if k.split("/")[0] == str(attempt)}
            changes["log_streams"] = {**streams, key: max(received, offset + len(data))}
            data = unseen_output(received, offset, data)
        if not job.log_truncated and data:
            data = data.replace("\x00", "\ufffd")
            room = limit - job.log_size
            truncated = len(data) > room
            if truncated:
                data = data[:max(room, 0)] + f"\n[log truncated at {limit} characters; the job keeps running]\n"
            JobLogChunk.objects.create(job=job, offset=job.log_size, data=data)
            changes.update(log_size=job.log_size + len(data), log_truncated=truncated)
        if changes:
            Job.objects.filter(pk=job.pk).update(**changes)
        return int(changes.get("log_size", job.log_size))


def job_record_progress(*, host: Host, job_id: int, attempt: int, progress: dict[str, Any] | None = None,
                        records: list[dict[str, Any]] | None = None) -> None:
    """One record (`progress`), or the training records the job wrote since the last report, in order."""
    with transaction.atomic():
        job = _job_for_host(job_id, host, attempt)
        messages = ([] if progress is None else [progress]) + (records or [])
        training: list[TrainingProgress] = []
        for message in messages:
            # The job wrote it: malformed fields are dropped. A report without a type is training progress.
            record = decode_progress_message(message) if "type" in message else TrainingProgress.from_message(message)
            if isinstance(record, ServingProgress):
                # Only the port comes from the job; the address is the reporting host's registered one. The
                # serving reconciler builds the URL it calls again from the placement's host and this port.
                address = host.address or host.name
                Job.objects.filter(pk=job.pk).update(
                    runtime_info={**job.runtime_info, "endpoint": f"http://{address}:{record.port}",
                                  "port": record.port, "attempt": attempt})
            elif isinstance(record, TrainingProgress):
                training.append(record)
            elif isinstance(record, ResultRecord):
                _record_result(job, record)
        if training:
            _record_training_progress(job, attempt, training)


def job_record_own_progress(*, job: Job, progress: dict[str, Any]) -> None:
    """Progress a running job reports itself, with its attempt token (the job API)."""
    with transaction.atomic():
        locked = lock_job(job.pk)
        if locked is not None and locked.state == State.RUNNING and locked.attempts == job.attempts:
            _record_training_progress(locked, locked.attempts, [TrainingProgress.from_message(progress)])


def _record_training_progress(job: Job, attempt: int, records: list[TrainingProgress]) -> None:
    """Keep every record's values as the job's metrics; the job's row shows the newest of each field."""
    record_metrics(job, attempt, records)
    newest: dict[str, Any] = {}
    for record in records:
        for name in ("step", "loss", "steps_per_s", "samples_per_s", "avg_steps_per_s", "avg_samples_per_s"):
            value = db_step(record.step) if name == "step" else getattr(record, name)
            if value is not None:
                newest[name] = value
    progress = TrainingProgress(**newest)
    fields: dict[str, Any] = {}
    if progress.step is not None:
        fields["steps_done"] = progress.step
        fields["progress_at"] = timezone.now()
    # The record shows the run's rates; a runtime that sends only the interval's has them stand in.
    steps = progress.avg_steps_per_s if progress.avg_steps_per_s is not None else progress.steps_per_s
    samples = progress.avg_samples_per_s if progress.avg_samples_per_s is not None else progress.samples_per_s
    for value, target in [(steps, "steps_per_second"), (samples, "samples_per_second"),
                          (progress.steps_per_s, "last_steps_per_second"),
                          (progress.samples_per_s, "last_samples_per_second"), (progress.loss, "last_loss")]:
        if value is not None:
            fields[target] = value
    waits = [record.wait_fraction for record in records if record.wait_fraction is not None]
    if waits:
        fields["wait_fraction"] = waits[-1]
    if fields:
        Job.objects.filter(pk=job.pk).update(**fields)
    if job.shareable:
        colocating.record_steps(job, records)


def _record_result(job: Job, result: ResultRecord) -> None:
    """The run's final figures (inference jobs report only these)."""
    steps, samples = result.run_rates()
    fields = {name: value for name, value in (("steps_per_second", steps), ("samples_per_second", samples))
              if value is not None}
    if fields:
        Job.objects.filter(pk=job.pk).update(**fields)


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

"""The jobs app's services, by concern; this module re-exports them so `apps.jobs.services.X` keeps working.

- submission: a spec checked and queued (`job_submit`)
- lifecycle: the table of allowed state changes and `transition`, through which every change goes; finishing,
  cancelling, releasing and preempting jobs, and a lost host's jobs
- placement: a queued job gets its GPUs (`job_place`); the pass's notes on waiting jobs
- dispatch: messages to the hosts' queues (run, stop, preempt), after commit
- agent_reports: what agents report about their jobs (status, log, progress, jobs they still run), and
  the secret values an agent fetches for a job it starts
- ledger: the check that held GPUs match placed and running jobs
- usage: GPUs held and GPU-hours, derived from job records

The reapers and host liveness, which meet cluster and telemetry, live above in apps.operations.
"""

from __future__ import annotations

from apps.jobs.agent_reports import (
    AgentReportError,
    job_append_log,
    job_record_own_progress,
    job_record_progress,
    job_report_status,
    job_secret_values,
    jobs_missing_on_host,
)
from apps.jobs.dispatch import dispatch_messages, jobs_redispatch_stale
from apps.jobs.ledger import ledger_reconcile
from apps.jobs.lifecycle import (
    ACTIVE_STATES,
    TRANSITIONS,
    job_cancel,
    job_checkpoint_and_release,
    job_finish,
    job_host_lost,
    job_mark_running,
    job_note,
    job_preempt,
    job_release,
    request_scheduler_pass,
    transition,
)
from apps.jobs.placement import job_place, jobs_set_pending_info
from apps.jobs.submission import MIN_DEFAULT_CPUS, MIN_DEFAULT_MEMORY_GB, JobSpec, default_preset, job_submit

__all__ = [
    "ACTIVE_STATES", "MIN_DEFAULT_CPUS", "MIN_DEFAULT_MEMORY_GB", "TRANSITIONS",
    "AgentReportError", "JobSpec", "default_preset", "dispatch_messages", "job_append_log", "job_cancel",
    "job_checkpoint_and_release", "job_note",
    "job_finish", "job_host_lost", "job_mark_running", "job_place", "job_preempt", "job_record_own_progress",
    "job_record_progress", "job_release", "job_report_status", "job_secret_values", "job_submit",
    "jobs_missing_on_host",
    "jobs_redispatch_stale", "jobs_set_pending_info", "ledger_reconcile", "request_scheduler_pass", "transition",
]

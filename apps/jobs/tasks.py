"""The jobs app's own task; the reaper (`jobs.reap`) spans apps and lives in apps.operations.tasks."""

from __future__ import annotations

from celery import shared_task

from apps.jobs.scheduler import scheduler_pass as run_scheduler_pass


@shared_task(name="jobs.scheduler_pass", ignore_result=True)
def scheduler_pass() -> dict[str, float]:
    result = run_scheduler_pass()
    return {"pending": result.pending, "placed": result.placed, "seconds": result.seconds}

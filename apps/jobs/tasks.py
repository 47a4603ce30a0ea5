from __future__ import annotations

from celery import shared_task

from apps.jobs.scheduler import scheduler_pass as run_scheduler_pass


@shared_task(name="jobs.scheduler_pass", ignore_result=True)
def scheduler_pass() -> dict[str, float]:
    result = run_scheduler_pass()
    return {"pending": result.pending, "placed": result.placed, "seconds": result.seconds}


@shared_task(name="jobs.reap", ignore_result=True)
def reap() -> dict[str, int]:
    """Hosts without heartbeats: mark down, fail or requeue their jobs. Placed jobs never started: re-send."""
    from django.conf import settings

    from apps.jobs import services

    grace = services.reaper_outage_grace(settings.REAPER_INTERVAL_S)
    lost = [] if grace else services.jobs_on_lost_hosts()
    resent = services.jobs_redispatch_stale(settings.JOBS_REDISPATCH_AFTER_S)
    repaired = services.ledger_reconcile()
    services.reaper_completed()
    return {"lost": len(lost), "resent": len(resent), "grace": int(grace), **repaired}

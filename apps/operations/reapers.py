"""The reaper: beat's periodic sweep over hosts, stale dispatches, the ledger and the alerts that follow the
records (the task `jobs.reap`)."""

from __future__ import annotations

from django.conf import settings

from apps.jobs.services import jobs_redispatch_stale, ledger_reconcile
from apps.operations.liveness import jobs_on_lost_hosts, reaper_completed, reaper_outage_grace
from apps.telemetry.alerts import report_inconsistency, sweep


def ledger_check() -> dict[str, int]:
    """The ledger check (apps.jobs.ledger), with what it repaired reported as an alert."""
    found = ledger_reconcile()
    if any(found.values()):
        report_inconsistency(found)
    return found


def reap() -> dict[str, int]:
    """Hosts without heartbeats: mark down, fail or requeue their jobs. Placed jobs never started: re-send."""
    grace = reaper_outage_grace(settings.REAPER_INTERVAL_S)
    lost = [] if grace else jobs_on_lost_hosts()
    resent = jobs_redispatch_stale(settings.JOBS_REDISPATCH_AFTER_S)
    repaired = ledger_check()
    alerts = sweep()
    reaper_completed()
    return {"lost": len(lost), "resent": len(resent), "grace": int(grace), **repaired, **alerts}

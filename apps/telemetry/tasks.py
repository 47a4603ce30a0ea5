from __future__ import annotations

from celery import shared_task

from apps.telemetry import alerts, retention


@shared_task(name="telemetry.notify_alert", ignore_result=True)
def notify_alert(alert_id: int) -> dict[str, int]:
    return alerts.notify(alert_id)


@shared_task(name="telemetry.housekeeping", ignore_result=True)
def housekeeping() -> dict[str, int]:
    """Minute rollups, retention, and the alert checks that are not driven by samples."""
    return {
        "rolled_up": retention.roll_up_minutes(),
        "pruned": retention.prune(),
        "overrunning": alerts.check_overrunning_jobs(),
        "resolved": alerts.resolve_alerts_of_finished_jobs(),
    }

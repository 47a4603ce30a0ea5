from __future__ import annotations

from celery import shared_task

from apps.telemetry import alerts, history, retention


@shared_task(name="telemetry.notify_alert", ignore_result=True)
def notify_alert(alert_id: int) -> dict[str, int]:
    return alerts.notify(alert_id)


@shared_task(name="telemetry.housekeeping", ignore_result=True)
def housekeeping() -> dict[str, int]:
    """Minute rollups, retention, and the alert checks that are not driven by samples."""
    return {
        "rolled_up": retention.roll_up_minutes(),
        "cluster_rolled_up": retention.roll_up_cluster_minutes(),
        "pruned": retention.prune(),
        "overrunning": alerts.check_overrunning_jobs(),
        "resolved": alerts.resolve_alerts_of_finished_jobs(),
    }


@shared_task(name="telemetry.cluster_snapshot", ignore_result=True)
def cluster_snapshot() -> dict[str, int]:
    """GPU counts, each team's allocation and queue, every TELEMETRY_SNAPSHOT_S (history.py)."""
    history.snapshot_cluster()
    return {"written": 1}

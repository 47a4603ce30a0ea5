"""The console's own Celery app: scheduler passes, reapers and dispatch to host queues."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def _schedule_periodic_tasks(sender: Celery, **_: object) -> None:
    from django.conf import settings

    sender.add_periodic_task(
        float(settings.SCHEDULER_PASS_INTERVAL_S), sender.signature("jobs.scheduler_pass"), name="scheduler pass"
    )
    sender.add_periodic_task(float(settings.REAPER_INTERVAL_S), sender.signature("jobs.reap"), name="reaper")
    sender.add_periodic_task(float(settings.SCHEDULER_PASS_INTERVAL_S), sender.signature("jobs.colocate"),
                             name="packing of shareable jobs")
    sender.add_periodic_task(60.0, sender.signature("telemetry.housekeeping"), name="telemetry housekeeping")
    sender.add_periodic_task(float(settings.TELEMETRY_SNAPSHOT_S), sender.signature("telemetry.cluster_snapshot"),
                             name="cluster snapshot")
    sender.add_periodic_task(float(settings.SERVING_RECONCILE_S), sender.signature("serving.reconcile"),
                             name="inference services")

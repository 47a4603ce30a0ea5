"""The periodic tasks that span apps. Their names are those beat schedules (console/celery.py) and older
workers know: `jobs.reap` and `serving.reconcile`."""

from __future__ import annotations

from celery import shared_task

from apps.operations import colocation, inference, reapers


@shared_task(name="jobs.reap", ignore_result=True)
def reap() -> dict[str, int]:
    return reapers.reap()


@shared_task(name="serving.reconcile", ignore_result=True)
def reconcile() -> int:
    return inference.reconcile_all()


@shared_task(name="jobs.colocate", ignore_result=True)
def colocate() -> dict[str, int]:
    return colocation.colocation_pass()

from __future__ import annotations

from celery import shared_task

from apps.serving.services import reconcile_all


@shared_task(name="serving.reconcile", ignore_result=True)
def reconcile() -> int:
    return reconcile_all()

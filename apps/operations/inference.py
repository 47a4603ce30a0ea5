"""Where serving and telemetry meet: each reconcile pass of the inference services is watched by their alert
rules (latency above target, error rate), and a deleted service's alerts resolve."""

from __future__ import annotations

from typing import Any

from apps.serving import services as serving
from apps.serving.models import InferenceService
from apps.telemetry.alerts import evaluate_service, resolve_alerts_of_deleted_services


def reconcile(service: InferenceService, now: float | None = None) -> dict[str, Any]:
    return serving.reconcile(service, now, observe=evaluate_service)


def reconcile_all() -> int:
    """Each live service's pass, watched by its rules; then the alerts of services deleted since the last pass
    resolve (a deleted service is no longer reconciled, so no rule would ever see it within target again)."""
    reconciled = serving.reconcile_all(observe=evaluate_service)
    resolve_alerts_of_deleted_services()
    return reconciled

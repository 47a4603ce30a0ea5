"""Where serving and telemetry meet: each reconcile pass of the inference services is watched by their alert
rules (latency above target, error rate)."""

from __future__ import annotations

from typing import Any

from apps.serving import services as serving
from apps.serving.models import InferenceService
from apps.telemetry.alerts import evaluate_service


def reconcile(service: InferenceService, now: float | None = None) -> dict[str, Any]:
    return serving.reconcile(service, now, observe=evaluate_service)


def reconcile_all() -> int:
    return serving.reconcile_all(observe=evaluate_service)

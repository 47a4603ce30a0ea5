"""Small state changes the console pages need that have no home service yet (alerts move to telemetry later)."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from apps.dashboard.selectors import can_acknowledge
from apps.telemetry.models import Alert


class AlertPermissionError(Exception):
    pass


def alert_acknowledge(*, alert: Alert, actor: AbstractBaseUser) -> bool:
    """Mark a firing alert acknowledged. False when it was no longer firing."""
    if not can_acknowledge(actor, alert):
        raise AlertPermissionError("Only site admins and the team's managers may acknowledge this alert.")
    with transaction.atomic():
        updated = Alert.objects.filter(pk=alert.pk, state=Alert.State.FIRING).update(
            state=Alert.State.ACKNOWLEDGED, acknowledged_at=timezone.now(), acknowledged_by=actor
        )
    return updated == 1

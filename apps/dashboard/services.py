"""State changes the console pages need. Alerts are acknowledged through the telemetry app's service."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from apps.dashboard.selectors import can_acknowledge
from apps.telemetry.models import Alert


class AlertPermissionError(Exception):
    pass


def alert_acknowledge(*, alert: Alert, actor: AbstractBaseUser) -> bool:
    """Mark a firing alert acknowledged (checking who may). False when it was no longer firing."""
    from apps.telemetry.alerts import acknowledge

    if not can_acknowledge(actor, alert):
        raise AlertPermissionError("Only site admins and the team's managers may acknowledge this alert.")
    return acknowledge(alert, actor)

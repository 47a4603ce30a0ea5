"""State changes the console pages need. Alerts are acknowledged through the telemetry app's service."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from apps.accounts.access import AccessDenied
from apps.telemetry.models import Alert

AlertPermissionError = AccessDenied  # the name the pages and their tests used


def alert_acknowledge(*, alert: Alert, actor: AbstractBaseUser) -> bool:
    """Mark a firing alert acknowledged (the service checks who may). False when it was no longer firing."""
    from apps.telemetry.alerts import acknowledge

    return acknowledge(alert, actor)

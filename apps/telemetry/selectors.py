from __future__ import annotations

from django.db.models import QuerySet

from apps.accounts import access
from apps.accounts.access import AnyUser
from apps.telemetry.models import Alert


def alerts_visible_to(user: AnyUser) -> QuerySet[Alert]:
    """Cluster-wide alerts and those of the user's teams (apps/accounts/access.py decides)."""
    return access.restrict(Alert.objects.select_related("rule", "host", "gpu__host", "job", "team"), user,
                           access.Action.VIEW)


def can_acknowledge(user: AnyUser, alert: Alert) -> bool:
    return access.can(user, access.Action.ACK_ALERT, alert)

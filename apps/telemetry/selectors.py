from __future__ import annotations

from django.db.models import Q, QuerySet

from apps.accounts.models import Role
from apps.accounts.selectors import AnyUser, has_role, is_admin, teams_visible_to
from apps.telemetry.models import Alert


def alerts_visible_to(user: AnyUser) -> QuerySet[Alert]:
    """Admins see every alert; others see cluster-wide alerts and those about their teams' jobs."""
    alerts = Alert.objects.select_related("rule", "host", "gpu__host", "job", "team")
    if is_admin(user):
        return alerts
    teams = teams_visible_to(user)
    if not teams.exists():
        return alerts.none()
    return alerts.filter(Q(team__isnull=True) | Q(team__in=teams))


def can_acknowledge(user: AnyUser, alert: Alert) -> bool:
    if is_admin(user):
        return True
    return alert.team is not None and has_role(user, alert.team, Role.MANAGER)

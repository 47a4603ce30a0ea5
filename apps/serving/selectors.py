from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from apps.accounts import access
from apps.accounts.access import AnyUser
from apps.serving.models import InferenceService


def services_visible_to(user: AnyUser) -> QuerySet[InferenceService]:
    services = InferenceService.objects.exclude(state=InferenceService.State.DELETED).select_related("team", "owner")
    return access.restrict(services, user, access.Action.VIEW)


def service_for_gateway(user_id: int, team: str, name: str) -> InferenceService | None:
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return None
    active = InferenceService.objects.filter(team__slug=team, name=name, state=InferenceService.State.ACTIVE)
    return access.restrict(active.select_related("team", "owner"), user, access.Action.VIEW).first()

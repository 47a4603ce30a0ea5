from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest

from apps.accounts.models import Team
from apps.core.models import AuditEvent
from apps.core.services import audit_record
from apps.quotas.models import TeamQuota

QUOTA_FIELDS = ("max_gpus", "gpu_hours_per_month", "max_priority", "allowed_gpu_types", "may_borrow", "share")


def quota_ensure(team: Team) -> TeamQuota:
    quota, _ = TeamQuota.objects.get_or_create(team=team)
    return quota


def quota_lock(team: Team) -> TeamQuota:
    """Lock the team's quota row for the rest of the transaction (serialises quota checks per team)."""
    quota_ensure(team)
    return TeamQuota.objects.select_for_update().get(team=team)


def quota_update(
    *, team: Team, changes: dict[str, Any], actor: AbstractBaseUser, request: HttpRequest | None = None
) -> TeamQuota:
    with transaction.atomic():
        quota = quota_lock(team)
        before = {name: _plain(getattr(quota, name)) for name in QUOTA_FIELDS}
        for name, value in changes.items():
            if name in QUOTA_FIELDS:
                setattr(quota, name, value)
        quota.full_clean()
        quota.save()
        quota.refresh_from_db()
        quota_audit_changes(quota=quota, before=before, actor=actor, request=request)
    return quota


def quota_audit_changes(
    *, quota: TeamQuota, before: dict[str, Any], actor: AbstractBaseUser, request: HttpRequest | None = None
) -> None:
    after = {name: _plain(getattr(quota, name)) for name in QUOTA_FIELDS}
    changed = {name: {"old": before[name], "new": after[name]} for name in QUOTA_FIELDS if before[name] != after[name]}
    if changed:
        audit_record(
            AuditEvent.Action.QUOTA_CHANGED, actor=actor, target=f"team {quota.team.slug}", request=request, **changed
        )


def quota_snapshot(quota: TeamQuota) -> dict[str, Any]:
    return {name: _plain(getattr(quota, name)) for name in QUOTA_FIELDS}


def _plain(value: Any) -> Any:
    from decimal import Decimal

    return str(value) if isinstance(value, Decimal) else value

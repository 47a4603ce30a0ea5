from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest

from apps.accounts import access
from apps.accounts.models import Team
from apps.core.errors import DomainError
from apps.core.models import AuditEvent
from apps.core.services import audit_record
from apps.quotas.models import QuotaRequest, TeamQuota

QUOTA_FIELDS = ("max_gpus", "gpu_hours_per_month", "when_budget_spent", "max_priority", "allowed_gpu_types",
                "may_borrow", "share")


def quota_ensure(team: Team) -> TeamQuota:
    quota, _ = TeamQuota.objects.get_or_create(team=team)
    return quota


def quota_lock(team: Team) -> TeamQuota:
    """Lock the team's quota row for the rest of the transaction (serialises quota checks per team)."""
    try:
        return TeamQuota.objects.select_for_update().get(team=team)
    except TeamQuota.DoesNotExist:  # the team has no quota row yet: it is created on first use
        quota_ensure(team)
        return TeamQuota.objects.select_for_update().get(team=team)


def quota_update(
    *, team: Team, changes: dict[str, Any], actor: AbstractBaseUser, request: HttpRequest | None = None
) -> TeamQuota:
    access.require(actor, access.Action.CHANGE_QUOTA, team)
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


# --- quota requests


class QuotaRequestError(DomainError):
    """The request does not apply: nothing asked for, already decided, or the actor may not decide it."""


class QuotaRequestDecided(QuotaRequestError):
    status = 409


class QuotaRequestDenied(QuotaRequestError, access.AccessDenied):
    """The actor may not ask for (or decide) this team's quota."""

    status = 403


def quota_request_create(
    *,
    team: Team,
    requested_by: AbstractBaseUser,
    reason: str,
    max_gpus: int | None = None,
    gpu_hours_per_month: Any = None,
    request: HttpRequest | None = None,
) -> QuotaRequest:
    """A manager (or admin) asks for more quota."""
    access.require(requested_by, access.Action.REQUEST_QUOTA, team, error=QuotaRequestDenied)
    if max_gpus is None and gpu_hours_per_month is None:
        raise QuotaRequestError("Ask for more GPUs, more GPU-hours, or both.")
    if not reason.strip():
        raise QuotaRequestError("Give a reason.")
    with transaction.atomic():
        quota_request = QuotaRequest.objects.create(
            team=team, requested_by=requested_by, reason=reason.strip(), max_gpus=max_gpus,
            gpu_hours_per_month=gpu_hours_per_month,
        )
        audit_record(
            AuditEvent.Action.QUOTA_REQUESTED, actor=requested_by, target=f"team {team.slug}", request=request,
            quota_request=quota_request.pk, max_gpus=max_gpus,
            gpu_hours_per_month=None if gpu_hours_per_month is None else _plain(gpu_hours_per_month),
        )
    return quota_request


def quota_request_decide(
    *,
    quota_request: QuotaRequest,
    approve: bool,
    actor: AbstractBaseUser,
    note: str = "",
    request: HttpRequest | None = None,
) -> QuotaRequest:
    """Approve (applying the change through quota_update) or reject a pending request. Site admins only."""
    from django.utils import timezone

    access.require(actor, access.Action.DECIDE_QUOTA, quota_request, error=QuotaRequestDenied)
    with transaction.atomic():
        locked = QuotaRequest.objects.select_for_update().select_related("team").get(pk=quota_request.pk)
        if locked.state != QuotaRequest.State.PENDING:
            raise QuotaRequestDecided(f"Quota request {locked.pk} is already {locked.state}.")
        if approve:
            changes: dict[str, Any] = {}
            if locked.max_gpus is not None:
                changes["max_gpus"] = locked.max_gpus
            if locked.gpu_hours_per_month is not None:
                changes["gpu_hours_per_month"] = locked.gpu_hours_per_month
            quota_update(team=locked.team, changes=changes, actor=actor, request=request)
        locked.state = QuotaRequest.State.APPROVED if approve else QuotaRequest.State.REJECTED
        locked.decided_by = actor
        locked.decided_at = timezone.now()
        locked.decision_note = note.strip()[:500]
        locked.save(update_fields=["state", "decided_by", "decided_at", "decision_note"])
        audit_record(
            AuditEvent.Action.QUOTA_REQUEST_DECIDED, actor=actor, target=f"team {locked.team.slug}", request=request,
            quota_request=locked.pk, decision=locked.state, note=locked.decision_note,
        )
    return locked

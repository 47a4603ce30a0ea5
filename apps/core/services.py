from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.http import HttpRequest

from apps.core.client_address import client_ip
from apps.core.models import AuditEvent

__all__ = ["audit_record", "client_ip"]


def audit_record(
    action: str,
    *,
    actor: AbstractBaseUser | AnonymousUser | None,
    target: str = "",
    request: HttpRequest | None = None,
    **details: Any,
) -> AuditEvent:
    user = actor if actor is not None and actor.is_authenticated else None
    return AuditEvent.objects.create(
        action=action,
        actor=user,
        actor_name=getattr(user, "username", "") if user else details.pop("username", ""),
        target=target[:200],
        ip_address=client_ip(request),
        details=details,
    )

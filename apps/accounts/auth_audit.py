from __future__ import annotations

from typing import Any

from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.dispatch import receiver

from apps.core.models import AuditEvent
from apps.core.services import audit_record


@receiver(user_logged_in)
def _audit_login(sender: Any, request: Any, user: Any, **_: Any) -> None:
    audit_record(AuditEvent.Action.LOGIN, actor=user, target=f"user {user.get_username()}", request=request)


@receiver(user_logged_out)
def _audit_logout(sender: Any, request: Any, user: Any, **_: Any) -> None:
    if user is not None:
        audit_record(AuditEvent.Action.LOGOUT, actor=user, target=f"user {user.get_username()}", request=request)


@receiver(user_login_failed)
def _audit_login_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **_: Any) -> None:
    username = str(credentials.get("username", ""))[:150]
    audit_record(AuditEvent.Action.LOGIN_FAILED, actor=None, target=f"user {username}", request=request)

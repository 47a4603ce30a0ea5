from __future__ import annotations

from django.conf import settings
from django.db import models


class AuditEvent(models.Model):
    """A security-relevant action: who did what to which object, and when."""

    class Action(models.TextChoices):
        LOGIN = "login", "login"
        LOGIN_FAILED = "login_failed", "login failed"
        LOGOUT = "logout", "logout"
        TOKEN_CREATED = "token_created", "token created"
        TOKEN_REVOKED = "token_revoked", "token revoked"
        QUOTA_CHANGED = "quota_changed", "quota changed"
        ROLE_CHANGED = "role_changed", "role changed"
        MEMBER_REMOVED = "member_removed", "member removed"
        JOB_CANCELLED_BY_OTHER = "job_cancelled_by_other", "job cancelled by someone else"
        USER_CHANGED = "user_changed", "user created or changed"
        TEAM_CHANGED = "team_changed", "team created or changed"
        HOST_TOKEN_CREATED = "host_token_created", "host token created"
        QUOTA_REQUESTED = "quota_requested", "quota increase requested"
        QUOTA_REQUEST_DECIDED = "quota_request_decided", "quota request approved or rejected"
        SECRET_CREATED = "secret_created", "team secret created"
        SECRET_ROTATED = "secret_rotated", "team secret rotated"
        SECRET_DELETED = "secret_deleted", "team secret deleted"
        VOLUME_CHANGED = "volume_changed", "volume created, changed or deleted"
        ADMIN_CHANGED = "admin_changed", "object added, changed or deleted in the admin site"
        HOST_DRAIN = "host_drain", "host drain started or ended"

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=40, choices=Action.choices, db_index=True)
    target = models.CharField(max_length=200, blank=True)
    ip_address = models.GenericIPAddressField(null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_name or '-'} {self.action} {self.target}"

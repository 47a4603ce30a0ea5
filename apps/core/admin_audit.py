"""Every change made in the Django admin site goes into the security audit log.

The console's admin site (ConsoleAdminConfig.default_site) gives every ModelAdmin registered on it, the project's
and Django's own (users, groups), the audit hooks below: the admin calls log_addition, log_change and
log_deletions for each object a form or the delete action touches. Admin actions that change state through a
service (drain, quota decisions) are audited by that service.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Model
from django.http import HttpRequest

from apps.core.models import AuditEvent
from apps.core.services import audit_record


def _audit(request: HttpRequest, obj: Model, what: str, message: Any = "") -> None:
    # The admin's change message: a list of {"changed": {"fields": [...]}} whose labels may be lazy strings.
    change = json.loads(json.dumps(message, cls=DjangoJSONEncoder)) if message else []
    audit_record(AuditEvent.Action.ADMIN_CHANGED, actor=request.user, target=f"{obj._meta.label_lower} {obj.pk}: {obj}",
                 request=request, model=obj._meta.label_lower, object_id=str(obj.pk), operation=what, change=change)


class AuditedAdminMixin:
    def log_addition(self, request: HttpRequest, obj: Model, message: Any) -> Any:
        entry = super().log_addition(request, obj, message)  # type: ignore[misc]
        _audit(request, obj, "added", message)
        return entry

    def log_change(self, request: HttpRequest, obj: Model, message: Any) -> Any:
        entry = super().log_change(request, obj, message)  # type: ignore[misc]
        _audit(request, obj, "changed", message)
        return entry

    def log_deletions(self, request: HttpRequest, queryset: Any) -> Any:
        for obj in queryset:  # (called before the deletion)
            _audit(request, obj, "deleted")
        return super().log_deletions(request, queryset)  # type: ignore[misc]


class AuditedAdminSite(admin.AdminSite):
    """The admin site: each ModelAdmin registered on it gets AuditedAdminMixin."""

    def register(self, model_or_iterable: Any, admin_class: Any = None, **options: Any) -> None:
        admin_class = admin_class or admin.ModelAdmin
        if not issubclass(admin_class, AuditedAdminMixin):
            admin_class = type(admin_class.__name__, (AuditedAdminMixin, admin_class),
                               {"__module__": admin_class.__module__, "__qualname__": admin_class.__qualname__})
        super().register(model_or_iterable, admin_class, **options)

from __future__ import annotations

from datetime import UTC

import django_filters
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import page_not_found
from django_filters.fields import IsoDateTimeField
from rest_framework import viewsets

from apps.accounts.api import IsSiteAdmin
from apps.core.models import AuditEvent
from apps.core.serializers import AuditEventSerializer


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 time with any offset, as UTC: PostgreSQL refuses offsets beyond ±15:59 (a 500, not a 400)."""

    def to_python(self, value):
        parsed = super().to_python(value)
        if parsed is None or parsed.tzinfo is None:
            return parsed
        try:
            return parsed.astimezone(UTC)
        except OverflowError:  # 9999-12-31T23:00-05:00: past the last datetime once in UTC
            raise ValidationError(self.error_messages["invalid"], code="invalid") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField


class AuditFilter(django_filters.FilterSet):
    since = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    actor = django_filters.CharFilter(field_name="actor_name")

    class Meta:
        model = AuditEvent
        fields = ["action", "actor", "since"]


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """The audit log of security-relevant actions (site admins only)."""

    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer
    permission_classes = [IsSiteAdmin]
    filterset_class = AuditFilter


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """A URL that matches no route: JSON under /api/ and /serve/ (what API clients parse), the HTML page elsewhere.

    e.g. /api/v1/teams/a.b/: the router's slugs exclude dots, so no view, and so no DRF, ever sees it."""
    if request.path.startswith(("/api/", "/serve/")):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)

"""GET /api/v1/audit/: the audit log, for site admins (beside the permission that guards it)."""

from __future__ import annotations

import django_filters
from rest_framework import viewsets

from apps.accounts.api import IsSiteAdmin
from apps.core.filters import UtcIsoDateTimeFilter
from apps.core.models import AuditEvent
from apps.core.serializers import AuditEventSerializer


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

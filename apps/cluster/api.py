from __future__ import annotations

from rest_framework import viewsets

from apps.accounts import access
from apps.cluster.models import Host
from apps.cluster.serializers import HostSerializer


class HostViewSet(viewsets.ReadOnlyModelViewSet):
    """GPU hosts and their GPUs (read-only; agents register them)."""

    serializer_class = HostSerializer
    lookup_field = "name"
    lookup_value_regex = r"[\w.-]+"
    filterset_fields = ["state", "simulated"]

    def get_queryset(self):
        return access.restrict(Host.objects.prefetch_related("gpus"), self.request.user)

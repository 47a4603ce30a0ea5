"""/api/v1/volumes/: admins define volumes; everyone else lists the volumes one of their teams may use."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts import access
from apps.cluster import volumes
from apps.cluster.models import Volume
from apps.cluster.serializers import VolumeSerializer


class AdminWritesOnly(permissions.BasePermission):
    def has_permission(self, request: Request, view: object) -> bool:
        return request.method in permissions.SAFE_METHODS or access.can(request.user, access.Action.ADMINISTER)


class VolumeViewSet(viewsets.ModelViewSet):
    """Named volumes jobs may mount (`mounts` in a job spec)."""

    serializer_class = VolumeSerializer
    permission_classes = [permissions.IsAuthenticated, AdminWritesOnly]
    lookup_field = "name"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return volumes.volumes_visible_to(self.request.user).prefetch_related("teams")

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = serializer.validated_data
        serializer.instance = volumes.volume_create(
            actor=self.request.user, name=data["name"], host_path=data["host_path"], target=data.get("target", ""),
            read_only=data.get("read_only", True), teams=data.get("teams", []), all_teams=data.get("all_teams", False),
            description=data.get("description", ""), request=self.request._request)

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        volume = serializer.instance
        assert isinstance(volume, Volume)
        changes = dict(serializer.validated_data)
        changes.pop("name", None)
        if changes.get("target") == "":
            changes["target"] = volumes.default_target(volume.name)
        serializer.instance = volumes.volume_update(volume=volume, actor=self.request.user,
                                                    request=self.request._request, **changes)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, *args, **kwargs) -> Response:
        volumes.volume_delete(volume=self.get_object(), actor=request.user, request=request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)


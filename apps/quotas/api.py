from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts import access
from apps.accounts.api import visible_team
from apps.quotas import services
from apps.quotas.serializers import TeamQuotaSerializer


class TeamQuotaView(APIView):
    """A team's quota: visible to its members, changed by site admins only."""

    @extend_schema(responses=TeamQuotaSerializer)
    def get(self, request: Request, slug: str) -> Response:
        team = visible_team(request, slug)
        return Response(TeamQuotaSerializer(services.quota_ensure(team)).data)

    def _write(self, request: Request, slug: str, partial: bool) -> Response:
        team = visible_team(request, slug)
        access.require(request.user, access.Action.CHANGE_QUOTA, team)  # before reading the body: 403, not 400
        form = TeamQuotaSerializer(services.quota_ensure(team), data=request.data, partial=partial)
        form.is_valid(raise_exception=True)
        quota = services.quota_update(
            team=team, changes=dict(form.validated_data), actor=request.user, request=request._request
        )
        return Response(TeamQuotaSerializer(quota).data)

    @extend_schema(request=TeamQuotaSerializer, responses=TeamQuotaSerializer)
    def put(self, request: Request, slug: str) -> Response:
        return self._write(request, slug, partial=False)

    @extend_schema(request=TeamQuotaSerializer, responses=TeamQuotaSerializer)
    def patch(self, request: Request, slug: str) -> Response:
        return self._write(request, slug, partial=True)

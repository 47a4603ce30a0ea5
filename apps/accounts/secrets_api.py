"""/api/v1/teams/<slug>/secrets/: a team's secrets. Anyone with a role in the team lists the names (jobs name them);
managers and admins create, rotate and delete them. A value appears only in the answer that set it."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts import access, secrets
from apps.accounts.access import Action
from apps.accounts.api import visible_team
from apps.accounts.models import TeamSecret
from apps.accounts.serializers import (
    NewSecretSerializer,
    SecretCreateSerializer,
    SecretRotateSerializer,
    TeamSecretSerializer,
)


def _shown_once(secret: TeamSecret, value: str) -> dict:
    data = dict(TeamSecretSerializer(secret).data)
    data["value"] = value
    return data


class TeamSecretsView(APIView):
    serializer_class = TeamSecretSerializer

    @extend_schema(responses=TeamSecretSerializer(many=True))
    def get(self, request: Request, slug: str) -> Response:
        team = visible_team(request, slug)
        rows = secrets.secrets_visible_to(request.user, team).select_related("created_by")
        return Response(TeamSecretSerializer(rows, many=True).data)

    @extend_schema(request=SecretCreateSerializer, responses={201: NewSecretSerializer})
    def post(self, request: Request, slug: str) -> Response:
        team = visible_team(request, slug)
        access.require(request.user, Action.MANAGE_SECRETS, team)  # before reading the body: 403, not 400
        form = SecretCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        value = form.validated_data["value"]
        secret = secrets.secret_create(team=team, name=form.validated_data["name"], value=value,
                                       actor=request.user, request=request._request)
        return Response(_shown_once(secret, value), status=status.HTTP_201_CREATED)


class TeamSecretView(APIView):
    serializer_class = TeamSecretSerializer

    def _secret(self, request: Request, slug: str, name: str) -> TeamSecret:
        team = visible_team(request, slug)
        return get_object_or_404(secrets.secrets_visible_to(request.user, team).select_related("team", "created_by"),
                                 name=name)

    @extend_schema(responses=TeamSecretSerializer)
    def get(self, request: Request, slug: str, name: str) -> Response:
        return Response(TeamSecretSerializer(self._secret(request, slug, name)).data)

    @extend_schema(request=SecretRotateSerializer, responses=NewSecretSerializer)
    def put(self, request: Request, slug: str, name: str) -> Response:
        """Rotate: a new value (version + 1); the jobs that name the secret get it at their next dispatch."""
        secret = self._secret(request, slug, name)
        access.require(request.user, Action.MANAGE_SECRETS, secret)
        form = SecretRotateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        value = form.validated_data["value"]
        secret = secrets.secret_rotate(secret=secret, value=value, actor=request.user, request=request._request)
        return Response(_shown_once(secret, value))

    def delete(self, request: Request, slug: str, name: str) -> Response:
        secrets.secret_delete(secret=self._secret(request, slug, name), actor=request.user,
                              request=request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)

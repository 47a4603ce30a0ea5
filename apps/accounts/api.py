from __future__ import annotations

from django.contrib.auth import authenticate, get_user_model
from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts import access, services
from apps.accounts.access import Action
from apps.accounts.models import ApiToken, Membership, Role, Team
from apps.accounts.serializers import (
    MembershipSerializer,
    MembershipWriteSerializer,
    NewTokenSerializer,
    RoleSerializer,
    TeamSerializer,
    TokenCreateSerializer,
    TokenRequestSerializer,
    TokenSerializer,
    UserSerializer,
)
from apps.core.models import AuditEvent
from apps.core.schema import ErrorSerializer
from apps.core.services import audit_record

User = get_user_model()


class IsSiteAdmin(permissions.BasePermission):
    def has_permission(self, request: Request, view: object) -> bool:
        return access.can(request.user, Action.ADMINISTER)


class AdminWritesOnly(permissions.BasePermission):
    def has_permission(self, request: Request, view: object) -> bool:
        return request.method in permissions.SAFE_METHODS or access.can(request.user, Action.ADMINISTER)


def _token_payload(token: ApiToken, secret: str) -> dict:
    data = NewTokenSerializer(token).data
    data["token"] = secret
    return data


class ObtainTokenView(APIView):
    """Exchange a username and password for a new API token."""

    permission_classes = [permissions.AllowAny]
    authentication_classes: list = []
    throttle_scope = "login"

    @extend_schema(request=TokenRequestSerializer, responses={201: NewTokenSerializer, 429: ErrorSerializer})
    def post(self, request: Request) -> Response:
        form = TokenRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        user = authenticate(
            request._request, username=form.validated_data["username"], password=form.validated_data["password"]
        )
        if user is None:
            raise serializers.ValidationError({"non_field_errors": ["Unknown username or wrong password."]})
        token, secret = services.token_create(
            user=user,
            name=form.validated_data["name"],
            expires_in_days=form.validated_data.get("expires_in_days"),
            request=request._request,
        )
        return Response(_token_payload(token, secret), status=status.HTTP_201_CREATED)


class TokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Your own API tokens. Creating one shows its secret once; deleting revokes it."""

    serializer_class = TokenSerializer

    def get_queryset(self):
        return access.restrict(ApiToken.objects.all(), self.request.user)

    @extend_schema(request=TokenCreateSerializer, responses={201: NewTokenSerializer})
    def create(self, request: Request) -> Response:
        form = TokenCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        token, secret = services.token_create(
            user=request.user,
            name=form.validated_data["name"],
            expires_in_days=form.validated_data.get("expires_in_days"),
            request=request._request,
        )
        return Response(_token_payload(token, secret), status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: ApiToken) -> None:
        services.token_revoke(token=instance, actor=self.request.user, request=self.request._request)

    @extend_schema(request=None, responses=TokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        token = services.token_revoke(token=self.get_object(), actor=request.user, request=request._request)
        return Response(TokenSerializer(token).data)


class UserViewSet(viewsets.ModelViewSet):
    """Users. Admins manage everyone; other users see only themselves."""

    serializer_class = UserSerializer
    permission_classes = [permissions.IsAuthenticated, AdminWritesOnly]
    lookup_field = "username"
    lookup_value_regex = r"[\w.@+-]+"

    def get_queryset(self):
        return access.restrict(User.objects.order_by("username"), self.request.user).prefetch_related(
            "memberships__team")

    def perform_create(self, serializer: UserSerializer) -> None:
        with transaction.atomic():
            user = serializer.save()
            audit_record(AuditEvent.Action.USER_CHANGED, actor=self.request.user, target=f"user {user.username}",
                         request=self.request._request, created=True, is_staff=user.is_staff)

    def perform_update(self, serializer: UserSerializer) -> None:
        with transaction.atomic():
            user = serializer.save()
            changed = sorted(k if k != "password" else "password" for k in serializer.validated_data)
            audit_record(AuditEvent.Action.USER_CHANGED, actor=self.request.user, target=f"user {user.username}",
                         request=self.request._request, fields=changed)

    def perform_destroy(self, instance) -> None:
        # Users own jobs (kept as records): deactivate instead of deleting.
        with transaction.atomic():
            instance.is_active = False
            instance.save(update_fields=["is_active"])
            instance.api_tokens.filter(revoked_at__isnull=True).update(revoked_at=instance.date_joined.now())
            audit_record(AuditEvent.Action.USER_CHANGED, actor=self.request.user, target=f"user {instance.username}",
                         request=self.request._request, deactivated=True)

    @action(detail=False, methods=["get"], permission_classes=[permissions.IsAuthenticated])
    def me(self, request: Request) -> Response:
        user = User.objects.prefetch_related("memberships__team").get(pk=request.user.pk)
        return Response(UserSerializer(user).data)


class TeamViewSet(viewsets.ModelViewSet):
    """Teams you hold a role in (admins: all). Admins create, rename and delete teams."""

    serializer_class = TeamSerializer
    permission_classes = [permissions.IsAuthenticated, AdminWritesOnly]
    lookup_field = "slug"

    def get_queryset(self):
        return access.restrict(Team.objects.all(), self.request.user)

    def perform_create(self, serializer: TeamSerializer) -> None:
        serializer.instance = services.team_create(
            slug=serializer.validated_data["slug"],
            name=serializer.validated_data.get("name", ""),
            actor=self.request.user,
            request=self.request._request,
        )

    def perform_update(self, serializer: TeamSerializer) -> None:
        with transaction.atomic():
            team = serializer.save()
            audit_record(AuditEvent.Action.TEAM_CHANGED, actor=self.request.user, target=f"team {team.slug}",
                         request=self.request._request)

    @extend_schema(responses={204: None, 409: ErrorSerializer})
    def destroy(self, request: Request, *args, **kwargs) -> Response:
        team = self.get_object()
        if team.jobs.exists():
            return Response({"detail": "A team with jobs cannot be deleted; remove its members instead."},
                            status=status.HTTP_409_CONFLICT)
        with transaction.atomic():
            audit_record(AuditEvent.Action.TEAM_CHANGED, actor=request.user, target=f"team {team.slug}",
                         request=request._request, deleted=True)
            team.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


def visible_team(request: Request, slug: str) -> Team:
    return get_object_or_404(access.restrict(Team.objects.all(), request.user), slug=slug)


def visible_memberships(request: Request, team: Team):
    return access.restrict(Membership.objects.filter(team=team), request.user).select_related("user")


class TeamMembersView(APIView):
    """Members of a team and their roles. Managers and admins add members or change roles."""

    serializer_class = MembershipSerializer

    @extend_schema(responses=MembershipSerializer(many=True))
    def get(self, request: Request, slug: str) -> Response:
        team = visible_team(request, slug)
        return Response(MembershipSerializer(visible_memberships(request, team), many=True).data)

    @extend_schema(request=MembershipWriteSerializer, responses={201: MembershipSerializer})
    def post(self, request: Request, slug: str) -> Response:
        team = visible_team(request, slug)
        access.require(request.user, Action.MANAGE_MEMBERS, team)  # before reading the body: 403, not 400
        form = MembershipWriteSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        membership = services.membership_set(
            team=team,
            user=form.validated_data["username"],
            role=Role(form.validated_data["role"]),
            actor=request.user,
            request=request._request,
        )
        return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)


class TeamMemberView(APIView):
    serializer_class = MembershipSerializer
    def _membership(self, request: Request, slug: str, username: str) -> Membership:
        team = visible_team(request, slug)
        return get_object_or_404(visible_memberships(request, team), user__username=username)

    @extend_schema(responses=MembershipSerializer)
    def get(self, request: Request, slug: str, username: str) -> Response:
        return Response(MembershipSerializer(self._membership(request, slug, username)).data)

    @extend_schema(request=RoleSerializer, responses=MembershipSerializer)
    def patch(self, request: Request, slug: str, username: str) -> Response:
        membership = self._membership(request, slug, username)
        access.require(request.user, Action.MANAGE_MEMBERS, membership.team)  # before reading the body
        form = RoleSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        membership = services.membership_set(
            team=membership.team, user=membership.user, role=Role(form.validated_data["role"]),
            actor=request.user, request=request._request,
        )
        return Response(MembershipSerializer(membership).data)

    def delete(self, request: Request, slug: str, username: str) -> Response:
        membership = self._membership(request, slug, username)
        services.membership_remove(membership=membership, actor=request.user, request=request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)

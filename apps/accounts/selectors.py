"""Who may see and do what. Every API view and consumer restricts its querysets through these."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from apps.accounts.models import ROLE_RANK, ApiToken, Membership, Role, Team

User = get_user_model()
AnyUser = AbstractBaseUser | AnonymousUser


def is_admin(user: AnyUser) -> bool:
    return bool(user.is_authenticated and user.is_active and user.is_staff)


def role_in_team(user: AnyUser, team: Team) -> Role | None:
    if not user.is_authenticated:
        return None
    role = Membership.objects.filter(user=user, team=team).values_list("role", flat=True).first()
    return Role(role) if role else None


def has_role(user: AnyUser, team: Team, minimum: Role) -> bool:
    """Admins have every role; others need a membership of at least `minimum`."""
    if is_admin(user):
        return True
    role = role_in_team(user, team)
    return role is not None and ROLE_RANK[role] >= ROLE_RANK[minimum]


def teams_visible_to(user: AnyUser) -> QuerySet[Team]:
    if is_admin(user):
        return Team.objects.all()
    if not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user).distinct()


def teams_with_role(user: AnyUser, minimum: Role) -> QuerySet[Team]:
    if is_admin(user):
        return Team.objects.all()
    if not user.is_authenticated:
        return Team.objects.none()
    roles = [role for role, rank in ROLE_RANK.items() if rank >= ROLE_RANK[minimum]]
    return Team.objects.filter(memberships__user=user, memberships__role__in=roles).distinct()


def users_visible_to(user: AnyUser) -> QuerySet:
    if is_admin(user):
        return User.objects.all().order_by("username")
    if not user.is_authenticated:
        return User.objects.none()
    return User.objects.filter(pk=user.pk).order_by("username")


def memberships_visible_to(user: AnyUser, team: Team) -> QuerySet[Membership]:
    if not teams_visible_to(user).filter(pk=team.pk).exists():
        return Membership.objects.none()
    return Membership.objects.filter(team=team).select_related("user")


def tokens_of(user: AnyUser) -> QuerySet[ApiToken]:
    if not user.is_authenticated:
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user)

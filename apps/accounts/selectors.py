"""Querysets of the accounts app, read through the access policy (apps/accounts/access.py), which decides."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from apps.accounts import access
from apps.accounts.access import AnyUser, is_admin
from apps.accounts.models import ApiToken, Membership, Role, Team

User = get_user_model()
__all__ = ["AnyUser", "has_role", "is_admin", "memberships_visible_to", "role_in_team", "teams_visible_to",
           "teams_with_role", "tokens_of", "users_visible_to"]

# The least role that each action of `teams_with_role` stands for.
_ACTION_OF_ROLE = {Role.VIEWER: access.Action.VIEW, Role.MEMBER: access.Action.SUBMIT,
                   Role.MANAGER: access.Action.MANAGE_MEMBERS}


def role_in_team(user: AnyUser, team: Team) -> Role | None:
    return access.role_in_team(user, team.pk)


def has_role(user: AnyUser, team: Team, minimum: Role) -> bool:
    """Admins have every role; others need a membership of at least `minimum`."""
    return access.can(user, _ACTION_OF_ROLE[Role(minimum)], team)


def teams_visible_to(user: AnyUser) -> QuerySet[Team]:
    return access.restrict(Team.objects.all(), user, access.Action.VIEW)


def teams_with_role(user: AnyUser, minimum: Role) -> QuerySet[Team]:
    return access.restrict(Team.objects.all(), user, _ACTION_OF_ROLE[Role(minimum)])


def users_visible_to(user: AnyUser) -> QuerySet:
    return access.restrict(User.objects.all(), user, access.Action.VIEW).order_by("username")


def memberships_visible_to(user: AnyUser, team: Team) -> QuerySet[Membership]:
    return access.restrict(Membership.objects.filter(team=team), user, access.Action.VIEW).select_related("user")


def tokens_of(user: AnyUser) -> QuerySet[ApiToken]:
    return access.restrict(ApiToken.objects.all(), user, access.Action.VIEW)

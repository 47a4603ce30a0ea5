"""The console's one access policy: who may see what, who may do what, and who hears a live event.

- `restrict(queryset, user, action)`: the rows of the queryset the user may act on (VIEW: may see). API viewsets,
  pages, the websocket consumers and the serving gateway read every object through it.
- `can(user, action, obj)` / `require(...)`: a decision about one object; services call `require`, which raises
  `AccessDenied` (apps.core.errors.NotAllowed, a Django PermissionDenied too: DRF answers 403, pages too).
- `viewer(user)` → `Viewer`: what a live subscriber may see (the audience of an event about a team), and
  `visible_gpu(gpu, viewer)`: what of a GPU's jobs it may see. The websocket hub and the home page both use them.

How it decides about other apps' models without importing them (accounts sits below quotas, cluster, jobs, …):
every model the policy knows has a `Scope` in `SCOPES`, keyed by its model label ("jobs.job"), that names the
field holding the owning team's id and the field holding the owning user's id. The rules then work on roles and
ids only: `restrict` filters on those fields, `can` reads them from the instance. One table here rather than a
registry each app fills at start-up, so the whole policy reads in one file and nothing can change it from
elsewhere; a model without a scope is refused to everyone (fail closed).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeGuard

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Exists, Model, Q, QuerySet

from apps.accounts.models import ROLE_RANK, Membership, Role
from apps.core.errors import NotAllowed

AnyUser = AbstractBaseUser | AnonymousUser


class Action(enum.StrEnum):
    VIEW = "view"
    SUBMIT = "submit"  # queue a job in a team, create an inference service
    SUBMIT_HIGH = "submit_high"  # a high-priority job
    SUBMIT_URGENT = "submit_urgent"  # an urgent job
    CANCEL = "cancel"  # cancel (or requeue) a job
    MANAGE_SERVICE = "manage_service"  # scale or delete an inference service
    MANAGE_MEMBERS = "manage_members"  # add members, change roles, remove members
    MANAGE_SECRETS = "manage_secrets"  # create, rotate and delete the team's secrets
    REQUEST_QUOTA = "request_quota"
    VIEW_REPORT = "view_report"  # the usage report of a team
    ACK_ALERT = "ack_alert"
    RESOLVE_ALERT = "resolve_alert"
    CHANGE_QUOTA = "change_quota"
    DECIDE_QUOTA = "decide_quota"
    ADMINISTER = "administer"  # users, teams, the audit log, alert rules


# The least team role each action needs; None: site admins only.
NEEDS: dict[Action, Role | None] = {
    Action.VIEW: Role.VIEWER,
    Action.SUBMIT: Role.MEMBER,
    Action.MANAGE_SERVICE: Role.MEMBER,
    Action.SUBMIT_HIGH: Role.MANAGER,
    Action.CANCEL: Role.MANAGER,
    Action.MANAGE_MEMBERS: Role.MANAGER,
    Action.MANAGE_SECRETS: Role.MANAGER,
    Action.REQUEST_QUOTA: Role.MANAGER,
    Action.VIEW_REPORT: Role.MANAGER,
    Action.ACK_ALERT: Role.MANAGER,
    Action.SUBMIT_URGENT: None,
    Action.RESOLVE_ALERT: None,
    Action.CHANGE_QUOTA: None,
    Action.DECIDE_QUOTA: None,
    Action.ADMINISTER: None,
}
# What the object's owner needs instead (members cancel their own jobs).
OWNER_NEEDS: dict[Action, Role] = {Action.CANCEL: Role.MEMBER}


class AccessDenied(NotAllowed):
    """The user may see the object but not do this to it: 403 in the API and in the pages."""


@dataclass(frozen=True)
class Scope:
    """How a model's rows belong: to a team (`team`: the field of the team's id), to a user (`owner`), or neither.

    A row without a team (no `team` field, or a null one) is cluster-wide: everyone who holds a role in some team
    sees it, and only admins act on it. `owner_only`: only the owner sees the row (admins see all); `private`: only
    the owner, admins included (API tokens). `admin_only`: site admins only.

    `teams`: the rows belong to a set of teams instead (a many-to-many field, e.g. the teams that may use a volume),
    or to every team when the boolean field `shared` is true. Whoever holds a role in one of those teams sees the row
    (in every team, for a shared row); only admins act on it.
    """

    team: str | None = None
    owner: str | None = None
    owner_only: bool = False
    private: bool = False
    admin_only: bool = False
    teams: str | None = None
    shared: str | None = None


SCOPES: dict[str, Scope] = {
    "accounts.team": Scope(team="pk"),
    "accounts.membership": Scope(team="team_id"),
    "accounts.apitoken": Scope(owner="user_id", private=True),
    "accounts.teamsecret": Scope(team="team_id"),
    settings.AUTH_USER_MODEL.lower(): Scope(owner="pk", owner_only=True),
    "core.auditevent": Scope(admin_only=True),
    "quotas.teamquota": Scope(team="team_id"),
    "quotas.quotarequest": Scope(team="team_id"),
    "cluster.host": Scope(),
    "cluster.gpu": Scope(),
    "cluster.volume": Scope(teams="teams", shared="all_teams"),
    "jobs.job": Scope(team="team_id", owner="user_id"),
    "jobs.jobevent": Scope(team="job__team_id"),
    "jobs.codesnapshot": Scope(team="team_id", owner="user_id"),
    "serving.inferenceservice": Scope(team="team_id"),
    "telemetry.alert": Scope(team="team_id"),
    "telemetry.alertrule": Scope(admin_only=True),
}


def scope_of(model: type[Model] | Model) -> Scope | None:
    return SCOPES.get(model._meta.label_lower)


def is_admin(user: AnyUser | None) -> bool:
    return _active(user) and bool(getattr(user, "is_staff", False))


def _active(user: AnyUser | None) -> TypeGuard[AbstractBaseUser]:
    return bool(user is not None and user.is_authenticated and user.is_active)


def _roles_at_least(minimum: Role) -> list[str]:
    return [role for role, rank in ROLE_RANK.items() if rank >= ROLE_RANK[minimum]]


def _team_ids(user: AnyUser, minimum: Role) -> QuerySet:
    """The ids of the teams where the user holds at least `minimum`, as a subquery."""
    if not _active(user):
        return Membership.objects.none().values("team_id")
    memberships = Membership.objects.filter(user_id=user.pk)
    if minimum != Role.VIEWER:
        memberships = memberships.filter(role__in=_roles_at_least(minimum))
    return memberships.values("team_id")


def role_in_team(user: AnyUser | None, team_id: int | None) -> Role | None:
    if not _active(user) or team_id is None:
        return None
    role = Membership.objects.filter(user_id=user.pk, team_id=team_id).values_list("role", flat=True).first()
    return Role(role) if role else None


def _holds(role: Role | None, minimum: Role | None) -> bool:
    return role is not None and minimum is not None and ROLE_RANK[role] >= ROLE_RANK[minimum]


def _in_some_team(user: AnyUser) -> bool:
    return _active(user) and Membership.objects.filter(user_id=user.pk).exists()


def restrict(queryset: QuerySet, user: AnyUser | None, action: Action = Action.VIEW) -> QuerySet:
    """The rows of `queryset` on which `user` may do `action` (VIEW: the rows the user may see)."""
    scope = scope_of(queryset.model)
    if scope is None or not _active(user):
        return queryset.none()
    owner = scope.owner or "pk"
    if scope.private:
        return queryset.filter(**{owner: user.pk})
    if is_admin(user):
        return queryset
    if scope.admin_only:
        return queryset.none()
    if scope.owner_only:
        return queryset.filter(**{owner: user.pk}) if action == Action.VIEW else queryset.none()
    if scope.teams is not None:
        return _restrict_team_set(queryset, scope, user) if action == Action.VIEW else queryset.none()
    minimum = NEEDS[action]
    allowed = Q(pk__in=[])
    if scope.team is not None and minimum is not None:
        allowed = Q(**{f"{scope.team}__in": _team_ids(user, minimum)})
        owner_minimum = OWNER_NEEDS.get(action)
        if scope.owner is not None and owner_minimum is not None:
            allowed |= Q(**{scope.owner: user.pk, f"{scope.team}__in": _team_ids(user, owner_minimum)})
    if action == Action.VIEW:  # cluster-wide rows, for whoever holds a role in some team
        in_some_team = Exists(Membership.objects.filter(user_id=user.pk))
        allowed |= Q(in_some_team) if scope.team is None else Q(in_some_team, **{f"{scope.team}__isnull": True})
    return queryset.filter(allowed)


def _restrict_team_set(queryset: QuerySet, scope: Scope, user: AbstractBaseUser) -> QuerySet:
    """The rows of a team-set scope the user sees (a subquery on the many-to-many, so no row comes twice)."""
    assert scope.teams is not None
    listed = queryset.model._default_manager.filter(**{f"{scope.teams}__in": _team_ids(user, Role.VIEWER)})
    allowed = Q(pk__in=listed.values("pk"))
    if scope.shared is not None:
        allowed |= Q(Exists(Membership.objects.filter(user_id=user.pk)), **{scope.shared: True})
    return queryset.filter(allowed)


def _value(obj: Any, path: str) -> Any:
    for name in path.split("__"):
        if obj is None:
            return None
        obj = getattr(obj, name)
    return obj


def can(user: AnyUser | None, action: Action, obj: Model | None = None) -> bool:
    """May `user` do `action` to `obj`? None: a site-wide action (only admins)."""
    if not _active(user):
        return False
    scope = scope_of(obj) if obj is not None else Scope(admin_only=True)
    if scope is None:
        return False
    owner = scope.owner or "pk"
    if scope.private:
        return _value(obj, owner) == user.pk
    if is_admin(user):
        return True
    if scope.admin_only:
        return False
    if scope.owner_only:
        return action == Action.VIEW and _value(obj, owner) == user.pk
    if scope.teams is not None:
        if action != Action.VIEW:
            return False
        if scope.shared is not None and getattr(obj, scope.shared):
            return _in_some_team(user)
        return getattr(obj, scope.teams).filter(pk__in=_team_ids(user, Role.VIEWER)).exists()
    team_id = _value(obj, scope.team) if scope.team is not None else None
    if team_id is None:  # cluster-wide
        return action == Action.VIEW and _in_some_team(user)
    role = role_in_team(user, team_id)
    if role_may(role, action):
        return True
    owner_minimum = OWNER_NEEDS.get(action)
    return (scope.owner is not None and owner_minimum is not None and _value(obj, scope.owner) == user.pk
            and _holds(role, owner_minimum))


def role_may(role: Role | str | None, action: Action, *, admin: bool = False) -> bool:
    """`can`'s answer for a team's object from a role the caller already read (the submit path reads the role
    with the team's quota in one query): admins may; others need the action's role."""
    return admin or _holds(Role(role) if role else None, NEEDS[action])


MESSAGES: dict[Action, str] = {
    Action.SUBMIT: "Only the team's members (not its viewers) may do this.",
    Action.SUBMIT_HIGH: "Only the team's managers may submit high-priority jobs.",
    Action.SUBMIT_URGENT: "Only site admins may submit urgent jobs.",
    Action.CANCEL: "You may not cancel this job.",
    Action.MANAGE_SERVICE: "Only the team's members may change its services.",
    Action.MANAGE_MEMBERS: "Only the team's managers and site admins may change its members.",
    Action.MANAGE_SECRETS: "Only the team's managers and site admins may change its secrets.",
    Action.REQUEST_QUOTA: "Only the team's managers and site admins may request quota.",
    Action.VIEW_REPORT: "Only the team's managers and site admins see its usage report.",
    Action.ACK_ALERT: "Only site admins and the team's managers may acknowledge this alert.",
    Action.RESOLVE_ALERT: "Only site admins may resolve alerts.",
    Action.CHANGE_QUOTA: "Only site admins may change quotas.",
    Action.DECIDE_QUOTA: "Only site admins may approve or reject quota requests.",
    Action.ADMINISTER: "Only site admins may do this.",
}


def require(user: AnyUser | None, action: Action, obj: Model | None = None, message: str | None = None,
            error: type[AccessDenied] = AccessDenied) -> None:
    """Raise `error` (an AccessDenied) unless `can(user, action, obj)`."""
    if not can(user, action, obj):
        raise error(message or MESSAGES.get(action, "You may not do this."))


# --- live streams


@dataclass(frozen=True)
class Viewer:
    """What one live subscriber may see: every team (admins) or the slugs of the teams it holds a role in."""

    user_id: int | None
    is_admin: bool
    teams: frozenset[str]

    @property
    def audience(self) -> tuple[bool, frozenset[str]]:
        """Viewers with equal audiences see the same frames (the hub builds each once)."""
        return self.is_admin, self.teams

    @property
    def sees_cluster(self) -> bool:
        return self.is_admin or bool(self.teams)

    def sees_team(self, team: str | None) -> bool:
        """May this viewer see what belongs to `team` (a job, its queue)? Never what belongs to no team."""
        return self.is_admin or (team is not None and team in self.teams)

    def sees(self, team: str | None) -> bool:
        """Is this viewer in the audience of a live event about `team` (None: a cluster-wide event)?"""
        return self.sees_cluster if team is None else self.sees_team(team)


NOBODY = Viewer(user_id=None, is_admin=False, teams=frozenset())


def viewer(user: AnyUser | None) -> Viewer:
    if not _active(user):
        return NOBODY
    slugs = Membership.objects.filter(user_id=user.pk).values_list("team__slug", flat=True)
    return Viewer(user_id=user.pk, is_admin=is_admin(user), teams=frozenset(slugs))


def live_audience(viewers: Iterable[Viewer], team: str | None) -> list[Viewer]:
    """The viewers who hear a live event about `team` (None: a cluster-wide one)."""
    return [v for v in viewers if v.sees(team)]


def visible_gpu(gpu: dict[str, Any], viewer: Viewer) -> dict[str, Any]:
    """A GPU as this viewer may see it (a live frame's entry, or the home page's cell).

    Another team's job shows as busy (`other_team`), without its id, its team or its processes. `gpu` has
    "job" and "team" (the first job on it) and "jobs" (each job's {"job", "team", ...}).
    """
    sample = {k: v for k, v in gpu.items() if k != "processes"}
    if viewer.is_admin:
        return sample
    jobs = gpu.get("jobs", [])
    mine = [j for j in jobs if viewer.sees_team(j["team"])]
    if len(mine) != len(jobs):
        sample["jobs"] = mine
        sample["other_team"] = True
    if gpu.get("team") is not None and not viewer.sees_team(gpu["team"]):
        first = mine[0] if mine else None
        sample["job"] = first["job"] if first else None
        sample["team"] = first["team"] if first else None
        sample["other_team"] = True
    return sample


def visible_queue(queue: dict[str, int], viewer: Viewer) -> dict[str, int]:
    """Queued jobs per team, of the teams this viewer sees."""
    return {team: n for team, n in queue.items() if viewer.sees_team(team)}

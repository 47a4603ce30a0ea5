from __future__ import annotations

import contextlib
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from apps.accounts import access, tokens
from apps.accounts.models import ApiToken, Membership, Role, Team
from apps.core.errors import WrongState
from apps.core.models import AuditEvent
from apps.core.services import audit_record

User = get_user_model()
# The gateway's token cache: an active token's user id, shared by every console process (Django's cache: Redis,
# or the file cache in development), bounded by its short TTL (and MAX_ENTRIES). A revocation leaves a
# tombstone there that outlives any entry written before it, and entries are only ever added, never
# overwritten, so a lookup racing the revocation cannot put the token back.
TOKEN_CACHE_S = 10
TOKEN_TOMBSTONE_S = 120
_REVOKED = "revoked"


def _token_cache_key(digest: str) -> str:
    return f"accounts:token-user:{digest}"


def token_create(
    *, user: AbstractBaseUser, name: str, expires_in_days: int | None = None, request: HttpRequest | None = None
) -> tuple[ApiToken, str]:
    """Create a token; returns the row and the secret, which is never stored nor shown again."""
    days = expires_in_days or settings.API_TOKEN_DEFAULT_DAYS
    if not 1 <= days <= settings.API_TOKEN_MAX_DAYS:  # the callers' validation says so first, naming the field
        raise ValueError(f"a token lives 1 to {settings.API_TOKEN_MAX_DAYS} days, not {days}")
    secret = tokens.new_secret("gpc")
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user,
            name=name,
            prefix=secret[:12],
            digest=tokens.digest(secret),
            expires_at=timezone.now() + timedelta(days=days),
        )
        audit_record(AuditEvent.Action.TOKEN_CREATED, actor=user, target=f"token {token.pk} {name}", request=request)
    return token, secret


def token_revoke(*, token: ApiToken, actor: AbstractBaseUser, request: HttpRequest | None = None) -> ApiToken:
    # Before the update commits: a gateway lookup from now on either sees the tombstone or the revoked row.
    cache.set(_token_cache_key(token.digest), _REVOKED, timeout=TOKEN_TOMBSTONE_S)
    with transaction.atomic():
        updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        if updated:
            audit_record(
                AuditEvent.Action.TOKEN_REVOKED, actor=actor, target=f"token {token.pk} {token.name}", request=request
            )
    token.refresh_from_db()
    return token


def token_authenticate(secret: str) -> ApiToken | None:
    """The active token with this secret, or None (unknown, revoked or expired)."""
    token = ApiToken.objects.select_related("user").filter(digest=tokens.digest(secret)).first()
    if token is None or not token.is_active or not token.user.is_active:
        return None
    now = timezone.now()
    # Writing last_used on every request would make each API call a write; once a minute is enough.
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def token_user_id_cached(secret: str) -> int | None:
    """The user id of the active token with this secret, from the shared token cache when it is there."""
    key = _token_cache_key(tokens.digest(secret))
    cached = cache.get(key)
    if type(cached) is int:
        return cached
    token = token_authenticate(secret)
    if token is None:
        return None  # unknown secrets are not cached: they would fill the cache
    # Not past a revocation (tombstone), nor past the token's own expiry.
    if cached is None and token.expires_at - timezone.now() > timedelta(seconds=TOKEN_CACHE_S):
        cache.add(key, token.user_id, timeout=TOKEN_CACHE_S)
    return token.user_id


class LastManager(WrongState):
    """The change would leave a team that has a manager without one."""


def _lock_team(team_id: int) -> None:
    """Serialize the team's membership changes (first, before any membership row), so that two managers demoting
    each other at once cannot both succeed."""
    Team.objects.select_for_update().filter(pk=team_id).first()


def _keep_a_manager(membership: Membership) -> None:
    """Refuse to demote or remove a team's last manager (under _lock_team)."""
    if membership.role != Role.MANAGER:
        return
    others = Membership.objects.filter(team_id=membership.team_id, role=Role.MANAGER).exclude(pk=membership.pk)
    if not others.exists():
        raise LastManager(
            f"{membership.user.get_username()} is the last manager of team {membership.team.slug}: "
            f"make another member a manager first"
        )


def membership_set(
    *, team: Team, user: AbstractBaseUser, role: Role, actor: AbstractBaseUser, request: HttpRequest | None = None
) -> Membership:
    """Give `user` the role in the team (the team's managers and site admins)."""
    access.require(actor, access.Action.MANAGE_MEMBERS, team)
    with transaction.atomic():
        _lock_team(team.pk)
        membership, created = Membership.objects.select_for_update().get_or_create(
            team=team, user=user, defaults={"role": role}
        )
        old_role = None if created else membership.role
        if not created and membership.role != role:
            _keep_a_manager(membership)
            membership.role = role
            membership.save(update_fields=["role"])
        if created or old_role != role:
            notify_access_changed(user.pk)
            audit_record(
                AuditEvent.Action.ROLE_CHANGED,
                actor=actor,
                target=f"{user.get_username()} in {team.slug}",
                request=request,
                old_role=old_role,
                new_role=str(role),
            )
    return membership


def notify_access_changed(user_id: int) -> None:
    """After commit, tell the user's open websockets to re-check what they may see (and close if nothing)."""

    def send() -> None:
        from asgiref.sync import async_to_sync
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is not None:
            # Best effort: sockets also re-check on their own every few seconds.
            with contextlib.suppress(Exception):
                async_to_sync(layer.group_send)(f"user.{user_id}", {"type": "access.changed"})

    transaction.on_commit(send)


def membership_remove(*, membership: Membership, actor: AbstractBaseUser, request: HttpRequest | None = None) -> None:
    access.require(actor, access.Action.MANAGE_MEMBERS, membership)
    with transaction.atomic():
        _lock_team(membership.team_id)
        _keep_a_manager(membership)
        notify_access_changed(membership.user_id)
        target = f"{membership.user.get_username()} in {membership.team.slug}"
        old_role = membership.role
        membership.delete()
        audit_record(AuditEvent.Action.MEMBER_REMOVED, actor=actor, target=target, request=request, old_role=old_role)


def team_create(*, slug: str, name: str, actor: AbstractBaseUser, request: HttpRequest | None = None) -> Team:
    """A new team; its quota row (apps.quotas, which sits above accounts) is created where first used."""
    with transaction.atomic():
        team = Team.objects.create(slug=slug, name=name or slug)
        audit_record(AuditEvent.Action.TEAM_CHANGED, actor=actor, target=f"team {slug}", request=request, created=True)
    return team


def ensure_demo_admin(username: str, password: str | None) -> tuple[AbstractBaseUser, str | None]:
    """Create the demo admin if missing. Returns the user and the password to print when one was generated."""
    import secrets

    user = User.objects.filter(username=username).first()
    if user is not None:
        if password:
            user.set_password(password)
            user.save(update_fields=["password"])
        return user, None
    generated = None
    if not password:
        generated = password = secrets.token_urlsafe(12)
    user = User.objects.create_superuser(username=username, email=f"{username}@localhost", password=password)
    return user, generated

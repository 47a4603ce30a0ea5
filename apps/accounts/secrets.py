"""Team secrets: managers create, rotate and delete them; jobs name them and get their values at dispatch.

The value is encrypted at rest (secret_box) and shown once, in the answer to its creation or rotation; the audit
log records who did what to which name, never the value. A job names secrets rather than holding values, so a
rotation reaches every job that names the secret at its next dispatch without editing the job.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from apps.accounts import access, secret_box
from apps.accounts.access import AnyUser
from apps.accounts.models import SECRET_NAME, Team, TeamSecret
from apps.core.errors import InvalidInput
from apps.core.models import AuditEvent
from apps.core.services import audit_record

__all__ = ["SECRET_VALUE_MAX_CHARS", "name_problem", "secret_create", "secret_delete", "secret_rotate",
           "secret_values", "secrets_reencrypt", "secrets_visible_to", "validate_secret_names", "value_problem"]

SECRET_VALUE_MAX_CHARS = 32 * 1024
# Variables the agent and the runtime set for every job: a secret of the same name would override them.
RESERVED_PREFIXES = ("CONSOLE_",)
RESERVED_NAMES = frozenset({
    "PATH", "HOME", "USER", "SHELL", "PWD", "HOSTNAME", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME",
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK",
    "WORLD_SIZE", "LOCAL_WORLD_SIZE",
})


def name_problem(name: object) -> str | None:
    """Why `name` cannot name a secret, or None."""
    if not isinstance(name, str) or not SECRET_NAME.match(name):
        return "Use 1-64 capital letters, digits and underscores, not starting with a digit."
    if name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES):
        return f"{name} is a variable the console sets for every job; choose another name."
    return None


def value_problem(value: object) -> str | None:
    if not isinstance(value, str) or value == "":
        return "A secret needs a value."
    if len(value) > SECRET_VALUE_MAX_CHARS:
        return f"A secret's value is at most {SECRET_VALUE_MAX_CHARS} characters."
    if "\x00" in value:
        return "A secret's value cannot hold a NUL character (it becomes an environment variable)."
    return None


def _check(**fields: object) -> None:
    checks = {"name": name_problem, "value": value_problem}
    errors = {field: [problem] for field, value in fields.items() if (problem := checks[field](value))}
    if errors:
        raise InvalidInput(errors)


def secrets_visible_to(user: AnyUser, team: Team) -> QuerySet[TeamSecret]:
    """The team's secrets (names and versions) the user may see: anyone with a role in the team, and admins."""
    return access.restrict(TeamSecret.objects.filter(team=team), user, access.Action.VIEW)


def secret_create(*, team: Team, name: str, value: str, actor: AnyUser,
                  request: HttpRequest | None = None) -> TeamSecret:
    access.require(actor, access.Action.MANAGE_SECRETS, team)
    _check(name=name, value=value)
    try:
        with transaction.atomic():
            secret = TeamSecret.objects.create(team=team, name=name, ciphertext=secret_box.encrypt(value),
                                               created_by_id=actor.pk)
            audit_record(AuditEvent.Action.SECRET_CREATED, actor=actor, target=f"secret {team.slug}/{name}",
                         request=request, version=secret.version)
    except IntegrityError:
        raise InvalidInput({"name": [f"The team already has a secret named {name}; rotate it instead."]}) from None
    return secret


def secret_rotate(*, secret: TeamSecret, value: str, actor: AnyUser,
                  request: HttpRequest | None = None) -> TeamSecret:
    """A new value for the secret (version + 1); jobs that name it get it at their next dispatch."""
    access.require(actor, access.Action.MANAGE_SECRETS, secret)
    _check(value=value)
    with transaction.atomic():
        locked = TeamSecret.objects.select_for_update().select_related("team").get(pk=secret.pk)
        locked.ciphertext = secret_box.encrypt(value)
        locked.version += 1
        locked.rotated_at = timezone.now()
        locked.save(update_fields=["ciphertext", "version", "rotated_at"])
        audit_record(AuditEvent.Action.SECRET_ROTATED, actor=actor,
                     target=f"secret {locked.team.slug}/{locked.name}", request=request, version=locked.version)
    return locked


def secret_delete(*, secret: TeamSecret, actor: AnyUser, request: HttpRequest | None = None) -> None:
    """Delete the secret; a queued job that still names it is refused at dispatch (secret_values)."""
    access.require(actor, access.Action.MANAGE_SECRETS, secret)
    with transaction.atomic():
        audit_record(AuditEvent.Action.SECRET_DELETED, actor=actor,
                     target=f"secret {secret.team.slug}/{secret.name}", request=request, version=secret.version)
        secret.delete()


def _unknown(found: Iterable[str], names: list[str]) -> None:
    missing = sorted(set(names) - set(found))
    if missing:
        raise InvalidInput({"secrets": [f"Unknown secret(s) for this team: {', '.join(missing)}."]})


def validate_secret_names(team_id: int, names: list[str]) -> None:
    """Refuse (InvalidInput naming `secrets`) names the team has no secret of; decrypts nothing."""
    if not names:
        return
    found = TeamSecret.objects.filter(team_id=team_id, name__in=set(names)).values_list("name", flat=True)
    _unknown(found, names)


def secret_values(team_id: int, names: list[str]) -> dict[str, str]:
    """The current values of the team's secrets `names` (at dispatch, to hand to the job, never to log).

    Refuses (InvalidInput naming `secrets`) names the team lacks, as validate_secret_names does. A value that no
    key decrypts (the key that encrypted it was removed from CONSOLE_SECRETS_KEY) is refused the same way, naming it.
    """
    if not names:
        return {}
    rows = dict(TeamSecret.objects.filter(team_id=team_id, name__in=set(names)).values_list("name", "ciphertext"))
    _unknown(rows, names)
    values, unreadable = {}, []
    for name, ciphertext in rows.items():
        try:
            values[name] = secret_box.decrypt(ciphertext)
        except secret_box.InvalidToken:
            unreadable.append(name)
    if unreadable:
        raise InvalidInput({"secrets": [
            f"Secret(s) {', '.join(sorted(unreadable))} cannot be decrypted with the console's keys "
            "(CONSOLE_SECRETS_KEY); a manager sets them again."]})
    return values


def secrets_reencrypt() -> tuple[int, list[str]]:
    """Encrypt every secret again with the first key of CONSOLE_SECRETS_KEY (after a key rotation, before the old
    key is removed). Returns how many rows were rewritten and the team/name of those no key opens. Values and
    versions are unchanged: jobs see no difference."""
    done, unreadable = 0, []
    for pk in TeamSecret.objects.order_by("pk").values_list("pk", flat=True):
        with transaction.atomic():
            secret = TeamSecret.objects.select_for_update().select_related("team").filter(pk=pk).first()
            if secret is None:  # deleted meanwhile
                continue
            try:
                secret.ciphertext = secret_box.reencrypt(secret.ciphertext)
            except secret_box.InvalidToken:
                unreadable.append(f"{secret.team.slug}/{secret.name}")
                continue
            secret.save(update_fields=["ciphertext"])
            done += 1
    return done, unreadable

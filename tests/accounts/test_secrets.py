"""Team secrets: encrypted at rest, shown once, rotated without editing jobs, audited without their value."""

from __future__ import annotations

import base64
import io
import os

import pytest
from django.db import connection
from django.test import override_settings

from apps.accounts import secret_box
from apps.accounts.access import AccessDenied
from apps.accounts.models import TeamSecret
from apps.accounts.secrets import (
    secret_create,
    secret_delete,
    secret_rotate,
    secret_values,
    validate_secret_names,
)
from apps.core.errors import InvalidInput
from apps.core.models import AuditEvent

VALUE = "wandb-key-4f1c9e2a77d0"


def new_key() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


def stored(secret: TeamSecret) -> str:
    """The secret's row as the database holds it, every column as text."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {TeamSecret._meta.db_table} WHERE id = %s", [secret.pk])
        return " ".join(str(column) for column in cursor.fetchone())


def test_the_database_holds_no_plain_value_and_the_console_reads_it_back(world):
    secret = secret_create(team=world.vision, name="WANDB_API_KEY", value=VALUE, actor=world.manager)
    assert VALUE not in stored(secret)
    assert base64.urlsafe_b64encode(VALUE.encode()).decode()[:12] not in stored(secret)
    assert secret_values(world.vision.pk, ["WANDB_API_KEY"]) == {"WANDB_API_KEY": VALUE}


def test_rotation_bumps_the_version_and_the_next_read_gets_the_new_value(world):
    secret = secret_create(team=world.vision, name="HF_TOKEN", value="old-value", actor=world.manager)
    rotated = secret_rotate(secret=secret, value="new-value", actor=world.admin)
    assert (rotated.version, rotated.rotated_at is not None) == (2, True)
    assert secret_values(world.vision.pk, ["HF_TOKEN"]) == {"HF_TOKEN": "new-value"}
    assert "new-value" not in stored(rotated) and "old-value" not in stored(rotated)


def test_every_change_is_audited_without_the_value(world):
    secret = secret_create(team=world.vision, name="S3_KEY", value=VALUE, actor=world.manager)
    secret_rotate(secret=secret, value=VALUE + "2", actor=world.manager)
    secret_delete(secret=TeamSecret.objects.get(pk=secret.pk), actor=world.manager)
    events = list(AuditEvent.objects.filter(target="secret vision/S3_KEY").order_by("pk"))
    assert [e.action for e in events] == ["secret_created", "secret_rotated", "secret_deleted"]
    assert all(e.actor_name == "manny" for e in events)
    assert [e.details["version"] for e in events] == [1, 2, 2]
    assert all(VALUE not in str(e.details) for e in events)


@pytest.mark.parametrize("persona", ["member", "viewer", "other", "noteam"])
def test_only_managers_and_admins_change_secrets(world, persona):
    with pytest.raises(AccessDenied):
        secret_create(team=world.vision, name="X", value="v", actor=world.persona(persona))
    secret = secret_create(team=world.vision, name="Y", value="v", actor=world.manager)
    with pytest.raises(AccessDenied):
        secret_rotate(secret=secret, value="w", actor=world.persona(persona))
    with pytest.raises(AccessDenied):
        secret_delete(secret=secret, actor=world.persona(persona))
    assert list(TeamSecret.objects.values_list("name", "version")) == [("Y", 1)]
    assert secret_values(world.vision.pk, ["Y"]) == {"Y": "v"}


@pytest.mark.parametrize(("name", "value", "field"), [
    ("lower", "v", "name"), ("1ABC", "v", "name"), ("A" * 65, "v", "name"), ("CONSOLE_JOB_TOKEN", "v", "name"),
    ("PATH", "v", "name"), ("LD_PRELOAD", "v", "name"), ("OK", "", "value"), ("OK", "a\x00b", "value"),
    ("OK", "x" * 40000, "value"),
])
def test_bad_names_and_values_are_refused_naming_the_field(world, name, value, field):
    with pytest.raises(InvalidInput) as refused:
        secret_create(team=world.vision, name=name, value=value, actor=world.manager)
    assert list(refused.value.errors) == [field]
    assert not TeamSecret.objects.exists()


def test_a_second_secret_of_the_same_name_is_refused(world):
    secret_create(team=world.vision, name="TOKEN", value="a", actor=world.manager)
    with pytest.raises(InvalidInput) as refused:
        secret_create(team=world.vision, name="TOKEN", value="b", actor=world.manager)
    assert "name" in refused.value.errors
    secret_create(team=world.nlp, name="TOKEN", value="c", actor=world.admin)  # another team's name space
    assert secret_values(world.vision.pk, ["TOKEN"]) == {"TOKEN": "a"}


def test_names_the_team_lacks_are_refused_naming_secrets(world):
    secret_create(team=world.vision, name="MINE", value="a", actor=world.manager)
    secret_create(team=world.nlp, name="THEIRS", value="b", actor=world.admin)
    for check in (validate_secret_names, secret_values):
        with pytest.raises(InvalidInput) as refused:
            check(world.vision.pk, ["MINE", "THEIRS", "NONE"])
        assert refused.value.errors == {"secrets": ["Unknown secret(s) for this team: NONE, THEIRS."]}
    validate_secret_names(world.vision.pk, ["MINE"])
    assert secret_values(world.vision.pk, []) == {}


def test_key_rotation_keeps_old_values_readable_and_a_lost_key_is_a_clear_refusal(world, settings):
    old = new_key()
    settings.CONSOLE_SECRETS_KEYS = [old]
    secret = secret_create(team=world.vision, name="K", value="v1", actor=world.manager)
    settings.CONSOLE_SECRETS_KEYS = [new_key(), old]
    assert secret_values(world.vision.pk, ["K"]) == {"K": "v1"}
    reencrypted = secret_box.reencrypt(TeamSecret.objects.get(pk=secret.pk).ciphertext)
    with override_settings(CONSOLE_SECRETS_KEYS=settings.CONSOLE_SECRETS_KEYS[:1]):
        assert secret_box.decrypt(reencrypted) == "v1"
        with pytest.raises(InvalidInput) as refused:
            secret_values(world.vision.pk, ["K"])
    assert "cannot be decrypted" in refused.value.errors["secrets"][0]


def test_reencrypt_secrets_moves_every_value_to_the_first_key(world, settings):
    from django.core.management import call_command

    old, new = new_key(), new_key()
    settings.CONSOLE_SECRETS_KEYS = [old]
    secret_create(team=world.vision, name="A", value="va", actor=world.manager)
    secret_create(team=world.nlp, name="B", value="vb", actor=world.admin)
    settings.CONSOLE_SECRETS_KEYS = [new, old]
    call_command("reencrypt_secrets", stdout=io.StringIO())
    settings.CONSOLE_SECRETS_KEYS = [new]  # the old key removed: every value still reads
    assert secret_values(world.vision.pk, ["A"]) == {"A": "va"} and secret_values(world.nlp.pk, ["B"]) == {"B": "vb"}
    assert list(TeamSecret.objects.order_by("name").values_list("version", flat=True)) == [1, 1]

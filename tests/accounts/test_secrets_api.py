"""The team secrets API: the value once in the answer that set it, names for the team, nothing for the others."""

from __future__ import annotations

import pytest

from apps.accounts.models import TeamSecret
from apps.accounts.secrets import secret_values
from apps.core.models import AuditEvent

URL = "/api/v1/teams/vision/secrets/"


def test_a_manager_creates_a_secret_and_sees_its_value_once(world, client_for):
    created = client_for(world.manager).post(URL, {"name": "WANDB_API_KEY", "value": " k-1 "}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["value"] == " k-1 " and created.json()["version"] == 1
    assert created.json()["created_by"] == "manny"
    for user in (world.manager, world.member, world.viewer, world.admin):
        listed = client_for(user).get(URL)
        assert listed.status_code == 200
        assert [row["name"] for row in listed.json()] == ["WANDB_API_KEY"]
        assert "k-1" not in listed.content.decode()
        one = client_for(user).get(URL + "WANDB_API_KEY/")
        assert one.status_code == 200 and "value" not in one.json()
    assert secret_values(world.vision.pk, ["WANDB_API_KEY"]) == {"WANDB_API_KEY": " k-1 "}


def test_rotation_answers_the_new_version_and_jobs_read_the_new_value(world, client_for):
    client_for(world.manager).post(URL, {"name": "HF_TOKEN", "value": "one"}, format="json")
    rotated = client_for(world.admin).put(URL + "HF_TOKEN/", {"value": "two"}, format="json")
    assert rotated.status_code == 200, rotated.content
    assert (rotated.json()["version"], rotated.json()["value"]) == (2, "two")
    assert rotated.json()["rotated_at"] is not None
    assert secret_values(world.vision.pk, ["HF_TOKEN"]) == {"HF_TOKEN": "two"}
    assert client_for(world.manager).delete(URL + "HF_TOKEN/").status_code == 204
    assert not TeamSecret.objects.exists()
    actions = list(AuditEvent.objects.filter(target="secret vision/HF_TOKEN").values_list("action", flat=True))
    assert sorted(actions) == ["secret_created", "secret_deleted", "secret_rotated"]


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "lower", "value": "v"}, "name"),
    ({"name": "CONSOLE_JOB_TOKEN", "value": "v"}, "name"),
    ({"name": "OK", "value": ""}, "value"),
    ({"name": "OK", "value": "a\x00b"}, "value"),
    ({"name": "OK", "value": "x" * 40000}, "value"),
    ({"name": "OK"}, "value"),
    ({"value": "v"}, "name"),
    ({"name": "OK", "value": "v", "team": "nlp"}, "team"),
    ({"name": ["OK"], "value": "v"}, "name"),
])
def test_bad_bodies_are_a_400_naming_the_field(world, client_for, body, field):
    response = client_for(world.manager).post(URL, body, format="json")
    assert response.status_code == 400 and field in response.json(), response.content
    assert not TeamSecret.objects.exists()


def test_a_taken_name_is_a_400_naming_it(world, client_for):
    client = client_for(world.manager)
    assert client.post(URL, {"name": "K", "value": "a"}, format="json").status_code == 201
    again = client.post(URL, {"name": "K", "value": "b"}, format="json")
    assert again.status_code == 400 and "name" in again.json()
    assert client.put(URL + "K/", {"value": ""}, format="json").json() == {"value": ["A secret needs a value."]}
    assert secret_values(world.vision.pk, ["K"]) == {"K": "a"}


def test_members_may_not_change_secrets_and_others_do_not_see_them(world, client_for):
    client_for(world.manager).post(URL, {"name": "K", "value": "a"}, format="json")
    member = client_for(world.member)
    assert member.post(URL, {"name": "J", "value": "b"}, format="json").status_code == 403
    assert member.put(URL + "K/", {"value": "c"}, format="json").status_code == 403
    assert member.delete(URL + "K/").status_code == 403
    other = client_for(world.other)
    assert other.get(URL).status_code == 404 and other.get(URL + "K/").status_code == 404
    assert other.put(URL + "K/", {"value": "c"}, format="json").status_code == 404
    assert client_for(world.noteam).get(URL).status_code == 404
    assert client_for(None).get(URL).status_code == 401
    assert list(TeamSecret.objects.values_list("name", "version")) == [("K", 1)]
    assert secret_values(world.vision.pk, ["K"]) == {"K": "a"}
    assert client_for(world.manager).get(URL + "NOPE/").status_code == 404

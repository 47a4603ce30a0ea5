"""The volumes API: admins write; others list the volumes their teams may use; bad paths are a 400 naming them."""

from __future__ import annotations

import pytest

from apps.cluster.models import Volume
from apps.core.models import AuditEvent

URL = "/api/v1/volumes/"


def test_an_admin_defines_a_volume_and_the_teams_allowed_see_it(world, client_for):
    admin = client_for(world.admin)
    created = admin.post(URL, {"name": "imagenet", "host_path": "/data/imagenet", "teams": ["vision"],
                               "description": "ImageNet 2012"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["target"] == "/mnt/imagenet" and created.json()["read_only"] is True
    assert created.json()["teams"] == ["vision"]
    assert admin.post(URL, {"name": "scratch", "host_path": "/scratch", "target": "/scratch", "read_only": False,
                            "all_teams": True}, format="json").status_code == 201
    assert [v["name"] for v in client_for(world.member).get(URL).json()["results"]] == ["imagenet", "scratch"]
    assert [v["name"] for v in client_for(world.other).get(URL).json()["results"]] == ["scratch"]
    assert client_for(world.noteam).get(URL).json()["results"] == []
    assert client_for(world.other).get(URL + "imagenet/").status_code == 404
    changed = admin.patch(URL + "imagenet/", {"teams": ["vision", "nlp"], "target": ""}, format="json")
    assert changed.status_code == 200 and changed.json()["target"] == "/mnt/imagenet"
    assert client_for(world.other).get(URL + "imagenet/").status_code == 200
    assert admin.delete(URL + "imagenet/").status_code == 204
    assert list(Volume.objects.values_list("name", flat=True)) == ["scratch"]
    assert AuditEvent.objects.filter(action="volume_changed").count() == 4


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "x", "host_path": "relative"}, "host_path"),
    ({"name": "x", "host_path": "/data/../etc/shadow"}, "host_path"),
    ({"name": "x", "host_path": "/proc"}, "host_path"),
    ({"name": "x", "host_path": "/data/x", "target": "/workspace/code"}, "target"),
    ({"name": "x", "host_path": "/data/x", "target": "/dev"}, "target"),
    ({"name": "x", "host_path": "/data/x", "target": "/"}, "target"),
    ({"name": "x", "host_path": "/data/x", "teams": ["nope"]}, "teams"),
    ({"name": "Not A Slug", "host_path": "/data/x"}, "name"),
    ({"name": "x", "host_path": "/data/x", "mode": "rw"}, "mode"),
    ({"name": "x"}, "host_path"),
])
def test_bad_volumes_are_a_400_naming_the_field(world, client_for, body, field):
    response = client_for(world.admin).post(URL, body, format="json")
    assert response.status_code == 400 and field in response.json(), response.content
    assert not Volume.objects.exists()


def test_a_volume_keeps_its_name_and_others_may_not_write(world, client_for):
    admin = client_for(world.admin)
    admin.post(URL, {"name": "imagenet", "host_path": "/data/imagenet", "all_teams": True}, format="json")
    assert admin.post(URL, {"name": "imagenet", "host_path": "/data/x"}, format="json").status_code == 400
    assert admin.patch(URL + "imagenet/", {"name": "other"}, format="json").json().keys() == {"name"}
    for user in (world.manager, world.member):
        client = client_for(user)
        assert client.get(URL + "imagenet/").status_code == 200
        assert client.patch(URL + "imagenet/", {"host_path": "/etc2"}, format="json").status_code == 403
        assert client.delete(URL + "imagenet/").status_code == 403
        assert client.post(URL, {"name": "mine", "host_path": "/data/mine"}, format="json").status_code == 403
    assert list(Volume.objects.values_list("name", "host_path")) == [("imagenet", "/data/imagenet")]

"""Volumes: admins define them; jobs of the teams allowed mount them by name; everything else is refused."""

from __future__ import annotations

import pytest

from apps.accounts.access import AccessDenied
from apps.cluster.models import Volume
from apps.cluster.volumes import (
    resolve_mounts,
    validate_mount_names,
    volume_create,
    volume_delete,
    volume_update,
    volumes_visible_to,
)
from apps.core.errors import InvalidInput
from apps.core.models import AuditEvent
from workers.protocol import MountSpec


@pytest.fixture
def volumes(world):
    imagenet = volume_create(actor=world.admin, name="imagenet", host_path="/data/imagenet", teams=[world.vision])
    scratch = volume_create(actor=world.admin, name="scratch", host_path="/scratch", target="/scratch",
                            read_only=False, all_teams=True)
    corpus = volume_create(actor=world.admin, name="corpus", host_path="/data/corpus", teams=[world.nlp])
    return imagenet, scratch, corpus


def test_a_team_resolves_the_volumes_it_may_use_in_the_order_named(world, volumes):
    assert resolve_mounts(world.vision.pk, ["scratch", "imagenet", "scratch"]) == [
        MountSpec(name="scratch", source="/scratch", target="/scratch", read_only=False),
        MountSpec(name="imagenet", source="/data/imagenet", target="/mnt/imagenet", read_only=True),
    ]
    assert resolve_mounts(world.vision.pk, []) == []
    validate_mount_names(world.nlp.pk, ["corpus", "scratch"])


@pytest.mark.parametrize("names", [["corpus"], ["nothing"], ["imagenet", "corpus"], "imagenet", [3]])
def test_unknown_volumes_and_those_of_other_teams_are_refused_naming_mounts(world, volumes, names):
    for check in (resolve_mounts, validate_mount_names):
        with pytest.raises(InvalidInput) as refused:
            check(world.vision.pk, names)
        assert list(refused.value.errors) == ["mounts"]


def test_two_volumes_at_one_target_are_refused(world, volumes):
    volume_create(actor=world.admin, name="scratch2", host_path="/scratch2", target="/scratch", all_teams=True)
    with pytest.raises(InvalidInput, match="both mount at /scratch"):
        resolve_mounts(world.vision.pk, ["scratch", "scratch2"])


def test_two_volumes_one_inside_the_other_are_refused(world, volumes):
    """The inner one's mount point would be made in the outer one's folder on the host (a job could have left a
    link there)."""
    volume_create(actor=world.admin, name="inner", host_path="/scratch2", target="/scratch/inner", all_teams=True)
    for names in (["scratch", "inner"], ["inner", "scratch"]):
        with pytest.raises(InvalidInput, match="mount one inside the other") as refused:
            resolve_mounts(world.vision.pk, names)
        assert list(refused.value.errors) == ["mounts"]
    assert resolve_mounts(world.vision.pk, ["inner"])[0].target == "/scratch/inner"


@pytest.mark.parametrize(("field", "path"), [
    ("host_path", "data"), ("host_path", "/data/../etc"), ("host_path", "/data//x"), ("host_path", "/data/x/"),
    ("host_path", "/"), ("host_path", "/proc/1"), ("host_path", "/etc"), ("host_path", "/data/a,b"),
    ("target", "/workspace"), ("target", "/workspace/code/x"), ("target", "/proc"), ("target", "/sys/fs"),
    ("target", "/dev/shm"), ("target", "/opt"), ("target", "/opt/gpu-console-runtime"), ("target", "mnt"),
    ("target", "/mnt/./x"), ("target", "/"), ("target", "/mnt/a:b"),
])
def test_bad_paths_are_refused_naming_the_field(world, field, path):
    with pytest.raises(InvalidInput) as refused:
        volume_create(actor=world.admin, name="bad", **{"host_path": "/data/ok", field: path})
    assert list(refused.value.errors) == [field]
    assert not Volume.objects.exists()


def test_only_admins_define_volumes_and_each_change_is_audited(world, volumes):
    imagenet = volumes[0]
    with pytest.raises(AccessDenied):
        volume_create(actor=world.manager, name="mine", host_path="/data/mine")
    with pytest.raises(AccessDenied):
        volume_update(volume=imagenet, actor=world.manager, read_only=False)
    with pytest.raises(AccessDenied):
        volume_delete(volume=imagenet, actor=world.manager)
    volume_update(volume=imagenet, actor=world.admin, teams=[world.vision, world.nlp], read_only=False)
    assert resolve_mounts(world.nlp.pk, ["imagenet"])[0].read_only is False
    volume_delete(volume=imagenet, actor=world.admin)
    events = AuditEvent.objects.filter(action="volume_changed", target="volume imagenet").order_by("pk")
    assert [sorted(k for k in ("created", "changed", "deleted") if k in e.details) for e in events] == [
        ["created"], ["changed"], ["deleted"]]
    assert events[1].details["teams"] == ["nlp", "vision"] and events[1].details["changed"] == ["read_only", "teams"]
    assert not Volume.objects.filter(name="mine").exists()


def test_users_see_the_volumes_their_teams_may_use(world, volumes):
    def names(user) -> list[str]:
        return sorted(volumes_visible_to(user).values_list("name", flat=True))

    assert names(world.admin) == ["corpus", "imagenet", "scratch"]
    assert names(world.member) == names(world.viewer) == ["imagenet", "scratch"]
    assert names(world.other) == ["corpus", "scratch"]
    assert names(world.noteam) == []


def test_the_django_admin_keeps_the_path_rules_and_audits(world, client):
    client.force_login(world.admin)
    url = "/admin/cluster/volume/add/"
    refused = client.post(url, {"name": "bad", "host_path": "/data/x", "target": "/workspace/x", "read_only": "on"})
    assert refused.status_code == 200 and "is reserved inside jobs" in refused.content.decode()
    added = client.post(url, {"name": "imagenet", "host_path": "/data/imagenet", "target": "", "read_only": "on",
                              "teams": [world.vision.pk]})
    assert added.status_code == 302, added.content.decode()[-3000:]
    volume = Volume.objects.get(name="imagenet")
    assert volume.target == "/mnt/imagenet" and list(volume.teams.all()) == [world.vision]
    client.post(f"/admin/cluster/volume/{volume.pk}/delete/", {"post": "yes"})
    assert not Volume.objects.exists()
    events = list(AuditEvent.objects.filter(action="volume_changed").order_by("pk"))
    assert events[0].details["created"] and events[0].details["teams"] == ["vision"]
    assert events[1].details["deleted"] and events[1].actor_name == "root-admin"

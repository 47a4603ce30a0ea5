"""The team secrets page (the value once, rotation, deletion after confirming) and a host's runtime and images."""

from __future__ import annotations

from apps.accounts.models import TeamSecret
from apps.accounts.secrets import secret_create, secret_values
from apps.cluster.models import Host
from apps.core.models import AuditEvent

PAGE = "/teams/vision/secrets/"


def test_a_manager_creates_a_secret_and_sees_the_value_once(world, web):
    client = web(world.manager)
    assert 'id="team-secrets-link"' in client.get("/teams/vision/").content.decode()
    created = client.post(PAGE, {"name": "WANDB_API_KEY", "value": "wb-123456"})
    assert created.status_code == 200 and created["Cache-Control"] == "no-store"
    assert 'id="secret-shown"' in created.content.decode() and "wb-123456" in created.content.decode()
    again = client.get(PAGE).content.decode()
    assert "WANDB_API_KEY" in again and "wb-123456" not in again
    assert secret_values(world.vision.pk, ["WANDB_API_KEY"]) == {"WANDB_API_KEY": "wb-123456"}


def test_members_see_the_names_without_the_forms(world, web):
    secret_create(team=world.vision, name="HF_TOKEN", value="hf-secret", actor=world.manager)
    for persona in ("member", "viewer"):
        html = web(world.persona(persona)).get(PAGE).content.decode()
        assert "HF_TOKEN" in html and "hf-secret" not in html
        assert 'id="secret-form"' not in html and "<summary>Rotate" not in html
    member = web(world.member)
    assert member.post(PAGE, {"name": "MINE", "value": "x"}).status_code == 403
    assert member.post(PAGE + "HF_TOKEN/rotate/", {"value": "y"}).status_code == 403
    assert member.post(PAGE + "HF_TOKEN/delete/").status_code == 403
    assert web(world.other).get(PAGE).status_code == 404
    assert list(TeamSecret.objects.values_list("name", "version")) == [("HF_TOKEN", 1)]


def test_bad_input_is_a_400_with_the_field_marked(world, web):
    client = web(world.manager)
    for body, text in (({"name": "lower", "value": "v"}, "capital letters"),
                       ({"name": "PATH", "value": "v"}, "sets for every job"),
                       ({"name": "OK", "value": ""}, "required")):
        response = client.post(PAGE, body)
        assert response.status_code == 400 and text in response.content.decode(), body
    secret_create(team=world.vision, name="TAKEN", value="a", actor=world.manager)
    taken = client.post(PAGE, {"name": "TAKEN", "value": "b"})
    assert taken.status_code == 400 and "rotate it instead" in taken.content.decode()
    assert client.post(PAGE + "TAKEN/rotate/", {"value": ""}).status_code == 400
    assert secret_values(world.vision.pk, ["TAKEN"]) == {"TAKEN": "a"}


def test_rotate_and_delete_after_confirming(world, web):
    secret_create(team=world.vision, name="S3_KEY", value="old", actor=world.manager)
    client = web(world.manager)
    rotated = client.post(PAGE + "S3_KEY/rotate/", {"value": "new"})
    assert rotated.status_code == 200 and "version 2" in rotated.content.decode()
    assert secret_values(world.vision.pk, ["S3_KEY"]) == {"S3_KEY": "new"}
    confirm = client.get(PAGE + "S3_KEY/delete/")
    assert confirm.status_code == 200 and "Delete S3_KEY" in confirm.content.decode()
    assert TeamSecret.objects.exists()  # asking is not deleting
    assert client.post(PAGE + "S3_KEY/delete/").status_code == 302
    assert not TeamSecret.objects.exists()
    assert sorted(AuditEvent.objects.filter(target="secret vision/S3_KEY").values_list("action", flat=True)) == [
        "secret_created", "secret_deleted", "secret_rotated"]


def test_the_host_page_shows_the_runtime_and_the_cached_images(world, web):
    Host.objects.filter(name="node-a").update(runtime="podman", cached_images=[
        {"name": "localhost/torch:2.13", "id": "sha256:" + "b" * 64, "size_mb": 4100, "created": "2026-12-02"}])
    html = web(world.member).get("/hosts/node-a/").content.decode()
    assert "in podman containers" in html and "localhost/torch:2.13" in html and "4.0 GiB" in html
    plain = web(world.member).get("/hosts/node-b/").content.decode()
    assert "as processes on the host" in plain and "keeps no images" in plain
    home = web(world.member).get("/").content.decode()
    assert 'href="/hosts/node-a/"' in home and ">podman</span>" in home
    assert web(world.noteam).get("/hosts/node-a/").status_code == 404


def test_a_multi_line_value_is_shown_whole(world, web):
    pem = "\n-----BEGIN KEY-----\nabc\n-----END KEY-----\n"
    html = web(world.admin).post(PAGE, {"name": "DEPLOY_KEY", "value": pem}).content.decode()
    assert f'readonly spellcheck="false">\n{pem}</textarea>' in html
    assert secret_values(world.vision.pk, ["DEPLOY_KEY"]) == {"DEPLOY_KEY": pem}

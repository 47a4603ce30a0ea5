"""Every API endpoint against seven personas: each gets exactly what its role allows, and nothing else happens.

Forbidden reads of another team's objects answer 404 (no existence leak); side effects are checked after every
refused write.
"""

from __future__ import annotations

import pytest

from apps.accounts.models import ApiToken, Membership, Team
from apps.core.models import AuditEvent
from apps.jobs.models import Job
from apps.jobs.services import JobSpec, job_submit
from apps.quotas.models import TeamQuota
from tests.conftest import train_spec

PERSONAS = ["admin", "manager", "member", "viewer", "other", "noteam", "anonymous"]
VISION_ROLES = {"admin", "manager", "member", "viewer"}


def submit(user, team: str = "vision", name: str = "job") -> Job:
    return job_submit(user=user, spec=JobSpec(name=name, kind="train", gpus=1, workload={"builtin": "mlp-digits"},
                                              team=team))


def expect(persona: str, allowed: set[str], ok: int, forbidden: int = 404) -> int:
    if persona == "anonymous":
        return 401
    return ok if persona in allowed else forbidden


@pytest.fixture
def jobs(world):
    return {"vision": submit(world.member, "vision"), "nlp": submit(world.other, "nlp")}


@pytest.mark.parametrize("persona", PERSONAS)
def test_job_list_shows_only_visible_teams(world, jobs, client_for, persona):
    response = client_for(world.persona(persona)).get("/api/v1/jobs/")
    assert response.status_code == expect(persona, VISION_ROLES | {"other", "noteam"}, 200)
    if response.status_code == 200:
        seen = {job["team"] for job in response.json()["results"]}
        expected = {"admin": {"vision", "nlp"}, "other": {"nlp"}, "noteam": set()}.get(persona, {"vision"})
        assert seen == expected


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("suffix", ["", "events/"])
def test_job_detail_and_events(world, jobs, client_for, persona, suffix):
    response = client_for(world.persona(persona)).get(f"/api/v1/jobs/{jobs['vision'].pk}/{suffix}")
    assert response.status_code == expect(persona, VISION_ROLES, 200)


@pytest.mark.parametrize("persona", PERSONAS)
def test_job_submit(world, client_for, persona):
    before = Job.objects.count()
    response = client_for(world.persona(persona)).post("/api/v1/jobs/", train_spec(), format="json")
    expected = {"admin": 201, "manager": 201, "member": 201, "viewer": 403, "other": 400, "noteam": 400,
                "anonymous": 401}[persona]
    assert response.status_code == expected, response.content
    assert Job.objects.count() == before + (1 if expected == 201 else 0)
    if persona in {"other", "noteam"}:
        assert "team" in response.json()


@pytest.mark.parametrize("persona", [*PERSONAS, "member2"])
def test_job_cancel(world, client_for, persona):
    job = submit(world.member, "vision")
    response = client_for(world.persona(persona)).post(f"/api/v1/jobs/{job.pk}/cancel/", {}, format="json")
    expected = {"admin": 200, "manager": 200, "member": 200, "member2": 403, "viewer": 403, "other": 404,
                "noteam": 404, "anonymous": 401}[persona]
    assert response.status_code == expected, response.content
    job.refresh_from_db()
    assert job.state == (Job.State.CANCELLED if expected == 200 else Job.State.QUEUED)
    by_other = AuditEvent.objects.filter(action=AuditEvent.Action.JOB_CANCELLED_BY_OTHER).exists()
    assert by_other == (persona in {"admin", "manager"})


@pytest.mark.parametrize("persona", PERSONAS)
def test_team_list_and_detail(world, client_for, persona):
    client = client_for(world.persona(persona))
    listing = client.get("/api/v1/teams/")
    assert listing.status_code == expect(persona, VISION_ROLES | {"other", "noteam"}, 200)
    if listing.status_code == 200:
        slugs = {team["slug"] for team in listing.json()["results"]}
        assert slugs == {"admin": {"vision", "nlp"}, "other": {"nlp"}, "noteam": set()}.get(persona, {"vision"})
    for path in ["", "members/", "quota/", "usage/"]:
        response = client.get(f"/api/v1/teams/vision/{path}")
        assert response.status_code == expect(persona, VISION_ROLES, 200), path


@pytest.mark.parametrize("persona", PERSONAS)
def test_team_create_admin_only(world, client_for, persona):
    response = client_for(world.persona(persona)).post("/api/v1/teams/", {"slug": "robotics"}, format="json")
    assert response.status_code == expect(persona, {"admin"}, 201, forbidden=403)
    assert Team.objects.filter(slug="robotics").exists() == (persona == "admin")
    if persona == "admin":  # its quota row is made on first use, with the defaults
        assert client_for(world.admin).get("/api/v1/teams/robotics/quota/").json()["max_gpus"] == 0
        assert TeamQuota.objects.filter(team__slug="robotics").exists()


@pytest.mark.parametrize("persona", PERSONAS)
def test_add_member_managers_only(world, client_for, persona):
    response = client_for(world.persona(persona)).post(
        "/api/v1/teams/vision/members/", {"username": "nobody", "role": "viewer"}, format="json"
    )
    expected = {"admin": 201, "manager": 201, "member": 403, "viewer": 403, "other": 404, "noteam": 404,
                "anonymous": 401}[persona]
    assert response.status_code == expected
    created = Membership.objects.filter(team=world.vision, user=world.noteam).exists()
    assert created == (expected == 201)
    assert AuditEvent.objects.filter(action=AuditEvent.Action.ROLE_CHANGED).exists() == (expected == 201)


@pytest.mark.parametrize("persona", PERSONAS)
def test_change_and_remove_member(world, client_for, persona):
    client = client_for(world.persona(persona))
    expected = {"admin": 200, "manager": 200, "member": 403, "viewer": 403, "other": 404, "noteam": 404,
                "anonymous": 401}[persona]
    response = client.patch("/api/v1/teams/vision/members/mia/", {"role": "viewer"}, format="json")
    assert response.status_code == expected
    role = Membership.objects.get(team=world.vision, user=world.member).role
    assert role == ("viewer" if expected == 200 else "member")
    response = client.delete("/api/v1/teams/vision/members/milo/")
    assert response.status_code == (204 if expected == 200 else expected)
    assert Membership.objects.filter(team=world.vision, user=world.member2).exists() == (expected != 200)


@pytest.mark.parametrize("persona", PERSONAS)
def test_quota_change_admin_only(world, client_for, persona):
    response = client_for(world.persona(persona)).patch(
        "/api/v1/teams/vision/quota/", {"max_gpus": 12}, format="json"
    )
    expected = {"admin": 200, "manager": 403, "member": 403, "viewer": 403, "other": 404, "noteam": 404,
                "anonymous": 401}[persona]
    assert response.status_code == expected
    assert TeamQuota.objects.get(team=world.vision).max_gpus == (12 if expected == 200 else 8)
    assert AuditEvent.objects.filter(action=AuditEvent.Action.QUOTA_CHANGED).exists() == (expected == 200)


@pytest.mark.parametrize("persona", PERSONAS)
def test_users(world, client_for, persona):
    client = client_for(world.persona(persona))
    listing = client.get("/api/v1/users/")
    assert listing.status_code == (401 if persona == "anonymous" else 200)
    if persona not in {"anonymous", "admin"}:
        assert [u["username"] for u in listing.json()["results"]] == [world.persona(persona).username]
    assert client.get("/api/v1/users/manny/").status_code == expect(persona, {"admin", "manager"}, 200)
    created = client.post("/api/v1/users/", {"username": "newbie", "password": "a-Long-pass-9876"}, format="json")
    assert created.status_code == expect(persona, {"admin"}, 201, forbidden=403)
    from django.contrib.auth import get_user_model

    assert get_user_model().objects.filter(username="newbie").exists() == (persona == "admin")


@pytest.mark.parametrize("persona", PERSONAS)
def test_hosts_read_only(world, client_for, persona):
    client = client_for(world.persona(persona))
    response = client.get("/api/v1/hosts/")
    assert response.status_code == (401 if persona == "anonymous" else 200)
    if response.status_code == 200:
        assert response.json()["count"] == (0 if persona == "noteam" else 2)
    detail = client.get("/api/v1/hosts/node-a/")
    assert detail.status_code == expect(persona, VISION_ROLES | {"other"}, 200)
    assert client.post("/api/v1/hosts/", {"name": "x"}, format="json").status_code in {401, 403, 405}


@pytest.mark.parametrize("persona", PERSONAS)
def test_audit_admin_only(world, client_for, persona):
    response = client_for(world.persona(persona)).get("/api/v1/audit/")
    assert response.status_code == expect(persona, {"admin"}, 200, forbidden=403)


@pytest.mark.parametrize("persona", PERSONAS)
def test_tokens_are_private(world, client_for, persona):
    from apps.accounts.services import token_create

    token, _ = token_create(user=world.member, name="ci")
    client = client_for(world.persona(persona))
    listing = client.get("/api/v1/tokens/")
    assert listing.status_code == (401 if persona == "anonymous" else 200)
    if listing.status_code == 200:
        ids = {t["id"] for t in listing.json()["results"]}
        assert (token.pk in ids) == (persona == "member")
        assert all("token" not in t and "digest" not in t for t in listing.json()["results"])
    response = client.delete(f"/api/v1/tokens/{token.pk}/")
    assert response.status_code == expect(persona, {"member"}, 204)
    token.refresh_from_db()
    assert (token.revoked_at is not None) == (persona == "member")
    assert ApiToken.objects.count() == 1


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("path", ["/api/v1/presets/", "/api/v1/workloads/"])
def test_catalogue_needs_login(world, client_for, persona, path):
    response = client_for(world.persona(persona)).get(path)
    assert response.status_code == (401 if persona == "anonymous" else 200)

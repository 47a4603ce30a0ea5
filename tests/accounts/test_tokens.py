from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken
from apps.core.models import AuditEvent


def bearer(secret: str, keyword: str = "Bearer") -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} {secret}")
    return client


def obtain(username: str = "mia", password: str = "pw-for-tests-123", **extra) -> dict:
    response = APIClient().post("/api/v1/auth/token/", {"username": username, "password": password, **extra},
                                format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_password_exchange_gives_a_working_token(world):
    data = obtain(name="ci-pipeline")
    assert data["name"] == "ci-pipeline" and data["token"].startswith("gpc_")
    assert bearer(data["token"]).get("/api/v1/jobs/").status_code == 200
    assert bearer(data["token"], "Token").get("/api/v1/jobs/").status_code == 200
    assert AuditEvent.objects.filter(action="token_created", actor=world.member).exists()


def test_token_is_stored_hashed_and_shown_once(world):
    secret = obtain()["token"]
    row = ApiToken.objects.get()
    assert secret not in {row.digest, row.prefix, row.name}
    assert row.digest != secret and len(row.digest) == 64
    listing = bearer(secret).get("/api/v1/tokens/").json()["results"]
    assert listing[0]["prefix"] == row.prefix and "token" not in listing[0]
    assert bearer(secret).get(f"/api/v1/tokens/{row.pk}/").json().get("token") is None


def test_revoked_token_gets_401(world):
    secret = obtain()["token"]
    token_id = ApiToken.objects.get().pk
    client = bearer(secret)
    assert client.post(f"/api/v1/tokens/{token_id}/revoke/").status_code == 200
    response = client.get("/api/v1/jobs/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert AuditEvent.objects.filter(action="token_revoked").count() == 1


def test_expired_token_gets_401(world):
    secret = obtain(expires_in_days=1)["token"]
    assert bearer(secret).get("/api/v1/jobs/").status_code == 200
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert bearer(secret).get("/api/v1/jobs/").status_code == 401


def test_deactivated_user_token_gets_401(world):
    secret = obtain()["token"]
    world.member.is_active = False
    world.member.save()
    assert bearer(secret).get("/api/v1/jobs/").status_code == 401


@pytest.mark.parametrize("header", ["Bearer", "Bearer a b", "Bearer gpc_unknown", "Token \xff"])
def test_malformed_or_unknown_tokens_get_401(world, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert client.get("/api/v1/jobs/").status_code == 401


def test_wrong_password_gets_400_and_no_token(world):
    response = APIClient().post("/api/v1/auth/token/", {"username": "mia", "password": "nope"}, format="json")
    assert response.status_code == 400
    assert "non_field_errors" in response.json()
    assert not ApiToken.objects.exists()
    assert AuditEvent.objects.filter(action="login_failed").exists()


def test_create_token_through_api_with_expiry_bounds(world, client_for):
    client = client_for(world.member)
    assert client.post("/api/v1/tokens/", {"name": "x", "expires_in_days": 0}, format="json").status_code == 400
    assert client.post("/api/v1/tokens/", {"name": "x", "expires_in_days": 9999}, format="json").status_code == 400
    created = client.post("/api/v1/tokens/", {"name": "ci", "expires_in_days": 30}, format="json")
    assert created.status_code == 201
    assert bearer(created.json()["token"]).get("/api/v1/users/me/").json()["username"] == "mia"

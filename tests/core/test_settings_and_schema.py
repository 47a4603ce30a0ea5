"""Settings fail fast with a message that names the variable; production settings pass `check --deploy`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION_ENV = {
    "CONSOLE_MODE": "production",
    "DJANGO_SECRET_KEY": "k" * 20 + "-production-secret-key-for-tests-only-0123456789",
    "CONSOLE_SECRETS_KEY": "Zm9yLXRlc3RzLW9ubHktMDEyMzQ1Njc4OWFiY2RlZmc=",
    "DJANGO_ALLOWED_HOSTS": "console.example.org",
    "DATABASE_URL": "postgres://console@127.0.0.1:5432/console",
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/1",
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CONSOLE_", "DATABASE_URL",
                                                                      "REDIS_URL", "CELERY_"))}
    clean["DJANGO_SETTINGS_MODULE"] = "console.settings"
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


def test_check_deploy_passes_with_production_settings():
    result = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION_ENV)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("DJANGO_SECRET_KEY", "", "DJANGO_SECRET_KEY must be set"),
        ("DJANGO_SECRET_KEY", "short", "DJANGO_SECRET_KEY must be at least 50"),
        ("DJANGO_ALLOWED_HOSTS", "", "DJANGO_ALLOWED_HOSTS"),
        ("CONSOLE_SECRETS_KEY", "", "CONSOLE_SECRETS_KEY must be set"),
        ("CONSOLE_SECRETS_KEY", "not-a-key", "CONSOLE_SECRETS_KEY must list Fernet keys"),
        ("CONSOLE_SECRETS_KEY", "Y2hhbmdlLW1lLWdlbmVyYXRlLWEta2V5LTAxMjM0NTY=", "CONSOLE_SECRETS_KEY holds deploy/'s"),
        ("DATABASE_URL", "", "DATABASE_URL must be set"),
        ("DATABASE_URL", "mysql://x@y/z", "DATABASE_URL='mysql://x@y/z' has an unsupported scheme"),
        ("REDIS_URL", "http://nope", "REDIS_URL"),
        ("CELERY_BROKER_URL", "kafka://x", "CELERY_BROKER_URL"),
        ("DJANGO_DEBUG", "maybe", "DJANGO_DEBUG='maybe' is not a boolean"),
        ("DJANGO_DEBUG", "1", "DJANGO_DEBUG must be off"),
        ("DJANGO_HSTS_SECONDS", "soon", "DJANGO_HSTS_SECONDS='soon' is not an integer"),
        ("CONSOLE_MODE", "staging", "CONSOLE_MODE"),
    ],
)
def test_bad_production_settings_fail_at_start_naming_the_variable(variable, value, message):
    result = manage("check", **{**PRODUCTION_ENV, variable: value})
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]


def test_embedded_defaults_need_no_variables(tmp_path):
    result = manage("check", CONSOLE_VAR_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr


def test_openapi_schema_and_docs(client):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    text = schema.content.decode()
    for path in ["/api/v1/jobs/", "/api/v1/jobs/{id}/cancel/", "/api/v1/teams/{slug}/quota/", "/api/v1/auth/token/",
                 "/api/v1/teams/{slug}/members/", "/api/v1/hosts/", "/api/v1/presets/", "/api/v1/jobs/{id}/metrics/",
                 "/api/v1/jobs/{id}/gpu-summary/"]:
        assert path in text, path
    assert client.get("/api/docs/").status_code == 200


def test_database_outage_answers_503(world, client_for, monkeypatch):
    from django.db import OperationalError

    from apps.jobs import api

    def broken(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(api.access, "restrict", broken)
    response = client_for(world.member).get("/api/v1/jobs/")
    assert response.status_code == 503 and "unavailable" in response.json()["detail"]


def test_urls_matching_no_route_answer_json_under_the_api_and_html_elsewhere(client_for, world):
    api = client_for(world.member)
    for path in ("/api/v1/teams/Hosts%20by%20state./", "/api/v1/no-such-thing/", "/serve/a.b/c/predict"):
        response = api.get(path)
        assert response.status_code == 404 and response.json() == {"detail": "Not found."}, path
    page = api.get("/no-such-page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")

"""Hostile input (issue 20, point 7): deep JSON, forged client addresses, foreign websocket origins, example secret
keys, tickets in access logs, token lifetimes, huge artifact listings, unknown fields.

In-process through Django's test client and Channels' communicator, except where a real server process is what is
tested (the ASGI server's access log, the settings at start).
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from apps.cluster.services import host_token_issue
from apps.jobs.models import Job

pytestmark = [pytest.mark.faults]

DEEP = 100_000


def deep_list(levels: int) -> str:
    return "[" * levels + "]" * levels


def deep_params(levels: int) -> str:
    """A submission whose workload params nest `levels` objects (params itself is the first)."""
    inner = "1"
    for _ in range(levels):
        inner = '{"a": ' + inner + "}"
    return ('{"name": "deep", "team": "vision", "gpus": 1, "workload": {"builtin": "mlp-digits", "params": '
            + inner + "}}")


# --- 1. deeply nested JSON


@pytest.mark.django_db
def test_deep_json_in_job_params_is_a_400(world, client_for):
    client = client_for(world.member)
    body = '{"name": "deep", "team": "vision", "gpus": 1, "workload": {"builtin": "mlp-digits", "params": {"a": ' \
        + deep_list(DEEP) + "}}}"
    answer = client.post("/api/v1/jobs/", body, content_type="application/json")
    assert answer.status_code == 400, answer.content[:300]
    assert "nested deeper than 64 levels" in answer.json()["detail"]
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_params_deeper_than_32_levels_are_a_400_naming_workload(world, client_for):
    client = client_for(world.member)
    answer = client.post("/api/v1/jobs/", deep_params(33), content_type="application/json")
    assert answer.status_code == 400
    assert answer.json() == {"workload": {"params": ["Nested deeper than 32 levels."]}}
    assert not Job.objects.exists()
    # 32 levels pass the depth cap (and reach the workload's own rules: mlp-digits takes no "a").
    at_cap = client.post("/api/v1/jobs/", deep_params(32), content_type="application/json").json()
    assert "unknown parameter" in at_cap["workload"]["params"]["a"][0]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/v1/auth/token/", "/api/v1/agent/register/", "/api/v1/agent/heartbeat/",
                                  "/api/v1/agent/telemetry/", "/api/v1/tokens/", "/api/v1/ws-ticket/"])
def test_deep_json_in_unauthenticated_bodies_is_never_a_500(world, path):
    for client in (APIClient(), APIClient(headers={"Authorization": "Bearer not-a-token"})):
        answer = client.post(path, deep_list(DEEP), content_type="application/json")
        assert answer.status_code in {400, 401, 403}, (path, answer.status_code, answer.content[:300])
    if path == "/api/v1/auth/token/":
        answer = APIClient().post(path, deep_list(DEEP), content_type="application/json")
        assert answer.status_code == 400 and "nested deeper" in answer.json()["detail"]


@pytest.mark.django_db
def test_deep_json_from_an_agent_is_a_400(world):
    _, token = host_token_issue(name="node-a")
    client = APIClient(HTTP_AUTHORIZATION=f"Host {token}")
    for path in ("/api/v1/agent/register/", "/api/v1/agent/heartbeat/", "/api/v1/agent/telemetry/"):
        answer = client.post(path, deep_list(DEEP), content_type="application/json")
        assert answer.status_code == 400, (path, answer.content[:300])
        assert "nested deeper" in answer.json()["detail"]


@pytest.mark.django_db
def test_deep_json_in_the_dashboard_params_field_is_a_form_error(world):
    from django.test import Client

    browser = Client()
    browser.force_login(world.member)
    answer = browser.post("/jobs/new/", {"name": "deep", "team": "vision", "gpus": "1", "kind": "train",
                                         "priority": "normal", "builtin": "mlp-digits",
                                         "params": '{"a": ' + deep_list(DEEP) + "}"})
    assert answer.status_code == 400
    assert "Nested deeper than 32 levels." in answer.content.decode()
    assert not Job.objects.exists()

"""The job API: a running attempt's own token, its own record, progress and artifacts, and nothing else."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from apps.accounts.services import token_create
from apps.cluster.models import Host
from apps.cluster.services import host_token_issue
from apps.jobs import services
from apps.jobs.attempt_tokens import attempt_token
from apps.jobs.models import Job
from apps.jobs.scheduler import scheduler_pass
from apps.jobs.services import JobSpec, job_submit
from tests.cluster.test_agent_api import agent, registration


def job_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Job {token}")
    return client


@pytest.fixture
def running(world, settings, tmp_path):
    """A job of team vision, placed on host sim-a and reported running there; its dispatch and token."""
    settings.ARTIFACT_STORE_URL = (tmp_path / "artifacts").as_uri()
    host, secret = host_token_issue(name="sim-a")
    assert agent(secret).post("/api/v1/agent/register/", registration("sim-a"), format="json").status_code == 200
    Host.objects.exclude(name="sim-a").update(state="down")
    job = job_submit(user=world.member, spec=JobSpec(name="t", kind="train", gpus=1, team="vision",
                                                     workload={"builtin": "mlp-digits"}, max_retries=1))
    scheduler_pass()
    [(_, dispatch)] = services.dispatch_messages(Job.objects.get(pk=job.pk))
    assert agent(secret).post(f"/api/v1/agent/jobs/{job.pk}/status/", {"state": "running", "attempt": 1},
                              format="json").json()["accepted"]
    return Job.objects.get(pk=job.pk), dispatch, secret


def test_the_dispatch_carries_the_attempts_own_token(running):
    job, dispatch, host_secret = running
    assert dispatch.job_token == attempt_token(job.pk, 1) and host_secret not in dispatch.job_token
    me = job_client(dispatch.job_token).get("/api/v1/job/")
    assert me.status_code == 200 and me.json()["id"] == job.pk and me.json()["attempt"] == 1


def test_a_job_reports_progress_and_keeps_artifacts_of_its_own(running):
    job, dispatch, _ = running
    client = job_client(dispatch.job_token)
    assert client.post("/api/v1/job/progress/", {"step": 12, "loss": 0.5}, format="json").status_code == 200
    job.refresh_from_db()
    assert (job.steps_done, job.last_loss) == (12, 0.5)
    stored = client.put("/api/v1/job/artifacts/outputs/metrics.json", b'{"acc": 1}',
                        content_type="application/octet-stream")
    assert stored.status_code == 201 and stored.json() == {"path": "outputs/metrics.json", "size": 10}
    assert client.get("/api/v1/job/artifacts/").json() == [{"path": "outputs/metrics.json", "size": 10}]
    assert b"".join(client.get("/api/v1/job/artifacts/outputs/metrics.json").streaming_content) == b'{"acc": 1}'
    for bad in ("logs/forged.log", "outputs", "../2/outputs/x", "outputs/../../2/x"):
        answer = client.put(f"/api/v1/job/artifacts/{bad}", b"x", content_type="application/octet-stream")
        assert answer.status_code in (400, 404), (bad, answer.status_code)
    assert client.get("/api/v1/job/artifacts/").json() == [{"path": "outputs/metrics.json", "size": 10}]


def test_an_artifact_over_the_limit_is_refused_and_not_stored(running, settings):
    job, dispatch, _ = running
    settings.JOB_ARTIFACT_MAX_BYTES = 1000
    client = job_client(dispatch.job_token)
    answer = client.put("/api/v1/job/artifacts/outputs/big.bin", b"x" * 1001, content_type="application/octet-stream")
    assert answer.status_code == 413 and client.get("/api/v1/job/artifacts/").json() == []


def test_the_token_works_only_while_its_attempt_runs(running, world):
    job, dispatch, host_secret = running
    client = job_client(dispatch.job_token)
    for forged in (attempt_token(job.pk, 2), attempt_token(job.pk + 1, 1), dispatch.job_token + "x", "junk"):
        assert job_client(forged).get("/api/v1/job/").status_code == 401
    # Requeued: attempt 1's token stops working, and attempt 2's works only once it runs.
    services.job_host_lost(job.pk, Host.objects.get(name="sim-a"), "test")
    job.refresh_from_db()
    assert job.state == "queued"
    assert client.get("/api/v1/job/").status_code == 401
    assert client.post("/api/v1/job/progress/", {"step": 99}, format="json").status_code == 401
    job.refresh_from_db()
    assert job.steps_done != 99


def test_the_job_token_opens_no_user_or_agent_endpoint_and_no_other_credential_opens_the_job_api(running, world):
    job, dispatch, host_secret = running
    client = job_client(dispatch.job_token)
    for method, path in [("get", "/api/v1/jobs/"), ("get", f"/api/v1/jobs/{job.pk}/"),
                         ("get", f"/api/v1/jobs/{job.pk}/artifacts/"), ("get", "/api/v1/users/me/"),
                         ("post", "/api/v1/agent/heartbeat/"), ("post", f"/api/v1/agent/jobs/{job.pk}/status/"),
                         ("post", "/api/v1/ws-ticket/")]:
        assert getattr(client, method)(path, {}, format="json").status_code == 401, path
    _, user_secret = token_create(user=world.member, name="laptop")
    for header in (f"Bearer {user_secret}", f"Host {host_secret}", f"Job {user_secret}"):
        other = APIClient()
        other.credentials(HTTP_AUTHORIZATION=header)
        assert other.get("/api/v1/job/").status_code == 401, header
    assert APIClient().get("/api/v1/job/").status_code == 401


def test_only_the_host_of_the_current_attempt_may_report_on_it(running):
    job, _, secret = running
    client = agent(secret)
    services.job_host_lost(job.pk, Host.objects.get(name="sim-a"), "test")  # requeued: attempt 2 on another host
    job.refresh_from_db()
    Host.objects.filter(name="sim-a").update(state="down")
    _, other_secret = host_token_issue(name="sim-b")
    agent(other_secret).post("/api/v1/agent/register/", registration("sim-b"), format="json")
    scheduler_pass()
    job.refresh_from_db()
    assert job.state == "placed" and job.attempts == 2
    # sim-a ran attempt 1: it may not speak for attempt 2, which runs on sim-b.
    for path, body in [("status/", {"state": "failed", "attempt": 2}), ("logs/", {"attempt": 2, "data": "x"}),
                       ("progress/", {"attempt": 2, "progress": {"step": 5}})]:
        assert client.post(f"/api/v1/agent/jobs/{job.pk}/{path}", body, format="json").status_code == 409, path
    job.refresh_from_db()
    assert job.state == "placed" and job.steps_done != 5
    assert agent(other_secret).post(f"/api/v1/agent/jobs/{job.pk}/status/", {"state": "running", "attempt": 2},
                                    format="json").json()["accepted"]


def test_what_a_job_stores_downloads_at_the_documented_path_with_or_without_a_slash(running, world, client_for):
    job, dispatch, _ = running
    job_client(dispatch.job_token).put("/api/v1/job/artifacts/outputs/model.txt", b"weights",
                                       content_type="application/octet-stream")
    for url in (f"/api/v1/jobs/{job.pk}/artifacts/outputs/model.txt", f"/api/v1/jobs/{job.pk}/artifacts/outputs/model.txt/"):
        answer = client_for(world.member).get(url)
        assert answer.status_code == 200 and b"".join(answer.streaming_content) == b"weights", url
    assert client_for(world.other).get(f"/api/v1/jobs/{job.pk}/artifacts/outputs/model.txt").status_code == 404

"""Login lockout, submission rate limits, the ledger check, and 503 for a database outage."""

from __future__ import annotations

from django.test import Client
from rest_framework.test import APIClient

from apps.jobs.models import Job, JobAllocation, UsageSegment
from apps.jobs.scheduler import scheduler_pass
from apps.jobs.services import JobSpec, job_submit
from apps.operations.reapers import ledger_check
from apps.telemetry.models import Alert
from tests.conftest import train_spec


def test_repeated_failed_logins_lock_the_account_for_that_address(world, settings):
    settings.AXES_FAILURE_LIMIT = 3
    api = APIClient()
    for _ in range(2):
        assert api.post("/api/v1/auth/token/", {"username": "mia", "password": "wrong"}, format="json").status_code == 400
    third = api.post("/api/v1/auth/token/", {"username": "mia", "password": "wrong"}, format="json")
    assert third.status_code == 429 and "Too many failed logins" in third.json()["detail"]
    locked = api.post("/api/v1/auth/token/", {"username": "mia", "password": "pw-for-tests-123"}, format="json")
    assert locked.status_code == 429 and "Retry-After" in locked
    browser = Client()
    response = browser.post("/accounts/login/", {"username": "mia", "password": "pw-for-tests-123"})
    assert response.status_code == 429
    other = APIClient().post("/api/v1/auth/token/", {"username": "milo", "password": "pw-for-tests-123"},
                             format="json")
    assert other.status_code == 201  # the lock is per username and address


def test_submission_rate_limit_answers_429_and_creates_nothing(world, client_for, settings):
    settings.JOBS_SUBMIT_PER_MINUTE = 3
    client = client_for(world.member)
    statuses = [client.post("/api/v1/jobs/", train_spec(), format="json").status_code for _ in range(5)]
    assert statuses == [201, 201, 201, 429, 429]
    assert Job.objects.count() == 3
    assert client_for(world.member2).post("/api/v1/jobs/", train_spec(), format="json").status_code == 201


def test_ledger_check_repairs_drift_and_alerts(world):
    job = job_submit(user=world.member, spec=JobSpec(name="a", kind="train", gpus=2, team="vision",
                                                     workload={"builtin": "mlp-digits"}))
    other = job_submit(user=world.member, spec=JobSpec(name="b", kind="train", gpus=2, team="vision",
                                                       workload={"builtin": "mlp-digits"}))
    scheduler_pass()
    assert ledger_check() == {"stray_allocations": 0, "open_segments": 0, "jobs_without_gpus": 0}
    # A crash left a finished job's rows open, and another job lost an allocation row.
    Job.objects.filter(pk=job.pk).update(state="succeeded")
    JobAllocation.objects.filter(job=other).first().delete()
    found = ledger_check()
    assert found == {"stray_allocations": 2, "open_segments": 1, "jobs_without_gpus": 1}
    assert not JobAllocation.objects.filter(released_at__isnull=True).exists()
    assert not UsageSegment.objects.filter(ended_at__isnull=True).exists()
    other.refresh_from_db()
    assert other.state == "failed" and "allocation was lost" in other.failure_reason
    assert Alert.objects.filter(rule__kind="ledger").count() == 1


def test_pages_answer_503_when_the_database_is_down(world, monkeypatch):
    from django.db import OperationalError

    from apps.dashboard import views

    def broken(*args, **kwargs):
        raise OperationalError("could not connect to server")

    monkeypatch.setattr(views, "render", broken)
    browser = Client(raise_request_exception=False)
    browser.force_login(world.member)
    response = browser.get("/")
    assert response.status_code == 503 and response["Retry-After"] == "5"


def test_hosts_are_not_declared_lost_right_after_the_console_itself_was_down(world, monkeypatch):
    from django.core.cache import cache

    from apps.operations import liveness as services

    clock = [1_000_000.0]
    monkeypatch.setattr(services.time, "time", lambda: clock[0])
    cache.delete_many([services.REAPER_LAST_RUN_KEY, services.REAPER_GRACE_UNTIL_KEY])
    assert services.reaper_outage_grace(10) is True  # never ran: no heartbeat could be trusted missing yet
    seen = []
    for _ in range(5):  # every 10 s, as beat runs it
        services.reaper_completed()
        clock[0] += 10
        seen.append(services.reaper_outage_grace(10))
    assert seen == [True, True, False, False, False]  # one heartbeat timeout (30 s) of grace, then normal
    services.reaper_completed()
    clock[0] += 60  # the database was down: no reaper completed for a minute
    assert services.reaper_outage_grace(10) is True
    services.reaper_completed()
    clock[0] += 20
    assert services.reaper_outage_grace(10) is True  # still inside one heartbeat timeout after the gap
    services.reaper_completed()
    clock[0] += 10
    assert services.reaper_outage_grace(10) is False

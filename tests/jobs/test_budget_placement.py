"""Monthly GPU-hour budgets hold at placement: a budget spent while jobs wait stops their placements."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from apps.cluster.models import GPU
from apps.jobs import services
from apps.jobs.models import Job, UsageSegment
from apps.jobs.scheduler import scheduler_pass
from apps.jobs.services import JobSpec, job_submit
from apps.jobs.usage import month_start
from apps.quotas.models import TeamQuota


def submit(user, gpus: int = 1, team: str = "vision") -> Job:
    spec = JobSpec(name="b", kind="train", gpus=gpus, workload={"builtin": "mlp-digits"}, team=team)
    return job_submit(user=user, spec=spec)


def spend(team, user, job: Job, gpu_hours: float) -> None:
    """Usage of `gpu_hours` (at least) this month, as a finished run of `job` would leave it."""
    now = timezone.now()
    start = month_start(now)
    seconds = max((now - start).total_seconds(), 1.0)
    gpus = int(gpu_hours * 3600 / seconds) + 1
    UsageSegment.objects.create(job=job, team=team, user=user, gpus=gpus, started_at=start, ended_at=now)


@pytest.fixture
def budget(world):
    TeamQuota.objects.filter(team=world.vision).update(gpu_hours_per_month=1, may_borrow=False)


def test_a_budget_spent_mid_queue_stops_placements(world, budget, client_for):
    first, second = submit(world.member), submit(world.member)  # accepted: the budget was not spent yet
    other = submit(world.other, team="nlp")
    spend(world.vision, world.member, first, 1.5)
    scheduler_pass()
    assert Job.objects.get(pk=other.pk).state == "placed"
    for job in (first, second):
        job.refresh_from_db()
        assert job.state == "queued"
        assert "monthly GPU-hour budget" in job.pending_reason and job.estimated_start is None
    body = client_for(world.viewer).get("/api/v1/teams/vision/usage/").json()
    assert body["budget_spent"] is True and body["gpu_hours_over"] >= 0.5 and body["budget_used_pct"] >= 150
    assert body["when_budget_spent"] == "finish"
    browser = Client()
    browser.force_login(world.viewer)
    page = browser.get("/teams/vision/")
    assert page.status_code == 200
    assert b"over by" in page.content and b"budget-spent" in page.content


def test_job_place_rechecks_the_budget_under_its_lock(world, budget):
    job = submit(world.member)
    gpu = GPU.objects.filter(host__name="node-a").order_by("index").first()
    spend(world.vision, world.member, job, 1.0)  # spent after a pass decided the placement
    assert not services.job_place(job.pk, (gpu.pk,))
    job.refresh_from_db()
    assert job.state == "queued"
    TeamQuota.objects.filter(team=world.vision).update(gpu_hours_per_month=0)  # unlimited again
    assert services.job_place(job.pk, (gpu.pk,))


def test_running_jobs_finish_unless_the_team_says_stop(world, budget):
    job = submit(world.member)
    scheduler_pass()
    assert services.job_mark_running(job.pk)
    spend(world.vision, world.member, job, 2.0)
    scheduler_pass()
    job.refresh_from_db()
    assert job.state == "running" and job.preempt_requested_at is None
    TeamQuota.objects.filter(team=world.vision).update(when_budget_spent="stop")
    scheduler_pass()
    job.refresh_from_db()
    assert job.preempt_requested_at is not None
    assert "budget" in job.events.last().reason

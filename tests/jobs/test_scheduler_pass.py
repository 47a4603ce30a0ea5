from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.cluster.models import GPU, Host
from apps.jobs import services
from apps.jobs.models import Job, JobAllocation, UsageSegment
from apps.jobs.scheduler import scheduler_pass
from apps.jobs.services import JobSpec, job_submit
from apps.jobs.usage import team_usage
from apps.quotas.models import TeamQuota


def submit(user, gpus: int, team: str = "vision", priority: str = "normal", gpu_type: str | None = None) -> Job:
    spec = JobSpec(name=f"j{gpus}", kind="train", gpus=gpus, workload={"builtin": "mlp-digits"}, team=team,
                   priority=priority, gpu_type=gpu_type)
    return job_submit(user=user, spec=spec)


@pytest.fixture(autouse=True)
def no_borrowing(world):
    """Most tests here check the quota cap itself; borrowing has tests of its own below."""
    TeamQuota.objects.update(may_borrow=False)


def state(job: Job) -> str:
    job.refresh_from_db()
    return job.state


def test_places_first_come_first_served_within_quota(world, settings):
    settings.SCHEDULER = {**settings.SCHEDULER, "policy": "fifo"}
    jobs = [submit(world.member, n) for n in (4, 3, 2, 1)]
    result = scheduler_pass()
    assert result.placed == 3  # 4 + 3 + 1 = 8 = max_gpus; the 2-GPU job would exceed the quota
    assert [state(j) for j in jobs] == ["placed", "placed", "queued", "placed"]
    waiting = Job.objects.get(pk=jobs[2].pk)
    assert waiting.pending_reason.startswith("team vision holds") and waiting.queue_position == 1
    assert team_usage(world.vision).gpus_held == 8


def test_priority_goes_first_and_gang_is_all_or_nothing(world):
    low = submit(world.member, 8)
    high = submit(world.manager, 8, priority="high")
    other = submit(world.other, 8, team="nlp")
    scheduler_pass()
    assert state(high) == "placed" and state(other) == "placed" and state(low) == "queued"
    for job in (high, other):
        allocations = JobAllocation.objects.filter(job=job)
        assert allocations.count() == 8
        assert len({a.gpu.host_id for a in allocations}) == 1  # a gang that fits one host stays on one host


def test_multi_host_gang_and_no_double_booking(world):
    TeamQuota.objects.filter(team=world.vision).update(max_gpus=16)
    big = submit(world.member, 12)
    scheduler_pass()
    assert state(big) == "placed"
    assert len(set(JobAllocation.objects.filter(job=big).values_list("gpu__host", flat=True))) == 2
    small = submit(world.member, 4)
    scheduler_pass()
    too_many = submit(world.member2, 1)
    scheduler_pass()
    assert state(small) == "placed" and state(too_many) == "queued"
    held = JobAllocation.objects.filter(released_at__isnull=True).values_list("gpu_id", flat=True)
    assert len(held) == len(set(held)) == 16


def test_hosts_down_and_unhealthy_gpus_get_nothing(world):
    Host.objects.filter(name="node-a").update(state=Host.State.DOWN)
    GPU.objects.filter(host__name="node-b", index__lt=6).update(health=GPU.Health.HOT)
    fits = submit(world.member, 2)
    blocked = submit(world.member, 4)
    scheduler_pass()
    assert state(fits) == "placed" and state(blocked) == "queued"
    assert set(JobAllocation.objects.filter(job=fits).values_list("gpu__index", flat=True)) == {6, 7}
    assert "asks for 4 GPUs; the cluster has 2 schedulable" in Job.objects.get(pk=blocked.pk).pending_reason


def test_gpu_type_constraint(world):
    from tests.factories import HostFactory, add_gpus

    add_gpus(HostFactory(name="node-c"), 2, gpu_type="A100")
    job = submit(world.member, 2, gpu_type="A100")
    scheduler_pass()
    assert set(JobAllocation.objects.filter(job=job).values_list("gpu__gpu_type", flat=True)) == {"A100"}


def test_placement_rechecks_everything_under_lock(world):
    first = submit(world.member, 2)
    second = submit(world.member, 2)
    gpu_ids = (world.gpus[0].pk, world.gpus[1].pk)
    assert services.job_place(first.pk, gpu_ids)
    assert not services.job_place(second.pk, gpu_ids)  # GPUs already held
    assert not services.job_place(first.pk, (world.gpus[2].pk, world.gpus[3].pk))  # no longer queued
    assert state(second) == "queued"
    assert JobAllocation.objects.filter(released_at__isnull=True).count() == 2


def test_placement_never_exceeds_quota_even_when_the_policy_asks(world):
    jobs = [submit(world.member, 4) for _ in range(3)]
    ids = [g.pk for g in world.gpus]
    assert services.job_place(jobs[0].pk, tuple(ids[0:4]))
    assert services.job_place(jobs[1].pk, tuple(ids[4:8]))
    assert not services.job_place(jobs[2].pk, tuple(ids[8:12]))
    assert team_usage(world.vision).gpus_held == 8


def test_job_end_releases_gpus_and_closes_the_ledger(world):
    job = submit(world.member, 8)
    waiting = submit(world.member, 8)
    scheduler_pass()
    assert services.job_mark_running(job.pk)
    assert not services.job_mark_running(job.pk)  # a repeated report is a no-op
    segment = UsageSegment.objects.get(job=job)
    UsageSegment.objects.filter(pk=segment.pk).update(started_at=segment.started_at - timedelta(minutes=30))
    assert services.job_finish(job.pk, succeeded=True, exit_code=0, reason="exited with code 0")
    assert not services.job_finish(job.pk, succeeded=False, exit_code=1, reason="late duplicate")
    job.refresh_from_db()
    assert job.state == "succeeded" and job.exit_code == 0 and job.finished_at is not None
    assert not JobAllocation.objects.filter(job=job, released_at__isnull=True).exists()
    usage = team_usage(world.vision)
    assert usage.gpus_held == 0
    assert 3.99 < usage.gpu_hours_this_month < 4.1 or timezone.now().day == 1
    scheduler_pass()
    assert state(waiting) == "placed"
    transitions = [(e.from_state, e.to_state) for e in job.events.all()]
    assert transitions == [("", "queued"), ("queued", "placed"), ("placed", "running"), ("running", "succeeded")]


def test_cancel_of_a_placed_job_frees_its_gpus(world, client_for):
    job = submit(world.member, 8)
    scheduler_pass()
    response = client_for(world.member).post(f"/api/v1/jobs/{job.pk}/cancel/", {"reason": "wrong lr"}, format="json")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    assert team_usage(world.vision).gpus_held == 0
    again = client_for(world.member).post(f"/api/v1/jobs/{job.pk}/cancel/", {}, format="json")
    assert again.status_code == 409
    assert job.events.last().reason == "cancelled by mia: wrong lr"


def test_usage_endpoint(world, client_for):
    TeamQuota.objects.filter(team=world.vision).update(gpu_hours_per_month=100)
    submit(world.member, 3)
    scheduler_pass()
    body = client_for(world.viewer).get("/api/v1/teams/vision/usage/").json()
    assert body["gpus_held"] == 3 and body["max_gpus"] == 8
    assert body["gpu_hours_budget"] == 100 and 99.9 < body["gpu_hours_left"] <= 100


def test_job_detail_shows_gpus_and_state_history(world, client_for):
    job = submit(world.member, 2)
    scheduler_pass()
    client = client_for(world.member)
    detail = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["state"] == "placed" and len(detail["allocations"]) == 2
    assert {a["host"] for a in detail["allocations"]} == {"node-a"}
    events = client.get(f"/api/v1/jobs/{job.pk}/events/").json()["results"]
    assert [e["to_state"] for e in events] == ["queued", "placed"]
    filtered = client.get("/api/v1/jobs/?state=placed&team=vision&user=mia").json()
    assert [j["id"] for j in filtered["results"]] == [job.pk]
    assert client.get("/api/v1/jobs/?state=succeeded").json()["count"] == 0

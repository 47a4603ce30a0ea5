"""Measured-utilization packing on the console side: a waiting shareable job joins a running one that leaves its GPU
mostly idle, the pair's step times give its measured slowdown, a pair that hurts is split, and the one left holds
its whole GPU again (apps/jobs/colocating.py, apps/operations/colocation.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.jobs import colocating, services
from apps.jobs.lifecycle import lock_job, preempt_and_requeue
from apps.jobs.models import Job, JobAllocation, UsageSegment
from apps.jobs.services import JobSpec, job_submit
from apps.operations.colocation import colocation_pass
from apps.telemetry.models import GpuSampleBucket
from tests.conftest import train_spec
from workers.protocol import TrainingProgress


def submit(user, *, shareable: bool = True) -> Job:
    spec = JobSpec(name="low", kind="train", gpus=1, workload={"builtin": "mlp-digits"}, team="vision",
                   shareable=shareable)
    return job_submit(user=user, spec=spec)


def measured_alone(job: Job, gpu, utilization: float, *, buckets: int = 3, memory_mb: int = 3000) -> None:
    now = timezone.now()
    for i in range(buckets):
        GpuSampleBucket.objects.create(gpu=gpu, resolution_s=10, bucket_start=now - timedelta(seconds=10 * (i + 1)),
                                       job=job, samples=10, available_samples=10, utilization_avg=utilization,
                                       utilization_max=utilization + 5, memory_used_max_mb=memory_mb)


def running_on(job: Job, gpu) -> Job:
    assert services.job_place(job.pk, (gpu.pk,))
    assert services.job_mark_running(job.pk)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=2))
    return Job.objects.get(pk=job.pk)


def waiting(job: Job) -> None:
    """As a scheduler pass that could not place it leaves it."""
    Job.objects.filter(pk=job.pk).update(pending_reason="waiting for GPUs", queue_position=1)


def fetch(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


@pytest.fixture(autouse=True)
def packing_on(settings):
    """The packing pass is on by default; CONSOLE_COLOCATION=0 in a deployment turns it off."""
    settings.COLOCATION_ENABLED = True


@pytest.fixture
def one_gpu(world):
    """Only the first GPU can take jobs: the others are faulty."""
    first = world.gpus[0]
    type(first).objects.exclude(pk=first.pk).update(health="faulty")
    return first


def test_shareable_is_for_one_whole_gpu(world, client_for):
    client = client_for(world.member)
    for spec in (train_spec(gpus=2, shareable=True), train_spec(gpus=0.5, shareable=True),
                 train_spec(gpus=1, gpu_memory_gb=10, shareable=True)):
        response = client.post("/api/v1/jobs/", spec, format="json")
        assert response.status_code == 400 and "shareable" in response.json(), response.content
    response = client.post("/api/v1/jobs/", train_spec(gpus=1, shareable=True), format="json")
    assert response.status_code == 201 and response.json()["shareable"] is True
    detail = client.get(f"/api/v1/jobs/{response.json()['id']}/").json()
    assert detail["shareable"] is True and detail["sharing"] is None and detail["measured_slowdown"] is None


def test_a_team_default_makes_its_one_gpu_jobs_shareable(world, client_for, settings):
    settings.COLOCATION_SHAREABLE_TEAMS = ["vision"]
    client = client_for(world.member)
    created = [client.post("/api/v1/jobs/", train_spec(**spec), format="json").json() for spec in
               ({"gpus": 1}, {"gpus": 1, "shareable": False}, {"gpus": 2}, {"gpus": 0.5})]
    assert [job["shareable"] for job in created] == [True, False, False, False]


def test_a_waiting_shareable_job_joins_an_idle_one_and_the_slowdown_is_measured(world, one_gpu, client_for):
    resident = running_on(submit(world.member), one_gpu)
    measured_alone(resident, one_gpu, 18.0)
    guest = submit(world.member2)
    waiting(guest)
    assert colocation_pass()["paired"] == 1

    resident, guest = fetch(resident), fetch(guest)
    assert guest.state == "placed" and resident.gpu_share_units == 50 and guest.gpu_share_units == 50
    shares = dict(JobAllocation.objects.filter(gpu=one_gpu, released_at__isnull=True).values_list("job_id",
                                                                                                   "share_units"))
    assert shares == {resident.pk: 50, guest.pk: 50}
    # The ledger: the resident's whole-GPU segment ended and a half one began.
    segments = UsageSegment.objects.filter(job=resident).order_by("pk")
    assert [(s.share_units, s.ended_at is None) for s in segments] == [(100, False), (50, True)]
    assert resident.colocation["reason"] == (f"job {resident.pk} measured under 30 % utilization (18 %), job "
                                             f"{guest.pk} not measured yet (a trial)")

    # Step times: 0.5 s alone before the pairing, 0.6 s while paired -> 1.2x.
    since = resident.colocation["windows"][0][0]
    alone = [TrainingProgress(step=i, steps_per_s=2.0, ts=since - 10 + i) for i in range(5)]
    paired = [TrainingProgress(step=i, steps_per_s=1 / 0.6, ts=since + 1 + i) for i in range(6)]
    colocating.record_steps(lock_job(resident.pk), alone + paired)
    resident = fetch(resident)
    assert resident.colocation["slowdown"] == pytest.approx(1.2)
    detail = client_for(world.admin).get(f"/api/v1/jobs/{resident.pk}/").json()
    assert detail["measured_slowdown"] == pytest.approx(1.2)
    assert detail["sharing"]["why"].startswith(f"sharing GPU 0 of host node-a with job {guest.pk}: job")
    assert detail["sharing"]["why"].endswith("slowdown measured 1.20×")

    # The guest ends: the resident holds the whole GPU again, and its later steps count as alone.
    services.job_mark_running(guest.pk)
    assert services.job_finish(guest.pk, succeeded=True, exit_code=0, reason="done")
    assert colocation_pass()["ended"] >= 1
    resident = fetch(resident)
    assert resident.gpu_share_units == 100 and resident.colocation["state"] == "ended"
    assert JobAllocation.objects.get(job=resident, released_at__isnull=True).share_units == 100
    assert resident.colocation["windows"][0][1] is not None


def test_a_busy_job_gets_no_neighbour(world, one_gpu):
    resident = running_on(submit(world.member), one_gpu)
    measured_alone(resident, one_gpu, 85.0)
    guest = submit(world.member2)
    waiting(guest)
    assert colocation_pass()["paired"] == 0
    assert fetch(guest).state == "queued" and fetch(resident).gpu_share_units == 100


def test_a_job_not_shareable_is_never_paired(world, one_gpu):
    resident = running_on(submit(world.member, shareable=False), one_gpu)
    measured_alone(resident, one_gpu, 5.0)
    guest = submit(world.member2)
    waiting(guest)
    assert colocation_pass()["paired"] == 0


def test_a_pair_that_hurts_is_split_and_never_formed_again(world, one_gpu):
    resident = running_on(submit(world.member), one_gpu)
    measured_alone(resident, one_gpu, 20.0)
    guest = submit(world.member2)
    waiting(guest)
    assert colocation_pass()["paired"] == 1
    services.job_mark_running(guest.pk)
    since = fetch(resident).colocation["windows"][0][0]
    records = ([TrainingProgress(step=i, steps_per_s=2.0, ts=since - 10 + i) for i in range(5)]
               + [TrainingProgress(step=i, steps_per_s=1.0, ts=since + 1 + i) for i in range(8)])
    colocating.record_steps(lock_job(resident.pk), records)  # 2.0x: over the 1.5x allowed
    assert colocation_pass()["split"] == 1
    guest = fetch(guest)
    assert guest.preempt_requested_at is not None and guest.gpu_share_units == 100
    assert guest.colocation["avoid"] == [resident.pk] and fetch(resident).colocation["avoid"] == [guest.pk]
    assert "slowdown measured 2.00×, over the 1.50× allowed" in guest.colocation["split_reason"]

    # The guest checkpoints and is requeued; the resident grows back and the two are not paired again.
    preempt_and_requeue(lock_job(guest.pk), "stopped by its agent")
    assert colocation_pass()["ended"] == 2
    resident = fetch(resident)
    assert resident.gpu_share_units == 100 and resident.colocation["state"] == "was-split"
    waiting(guest)
    measured_alone(resident, one_gpu, 20.0)
    assert colocation_pass()["paired"] == 0
    assert fetch(guest).state == "queued"


def test_a_guest_requeued_while_it_shared_asks_for_its_whole_gpu_again(world, one_gpu):
    resident = running_on(submit(world.member), one_gpu)
    measured_alone(resident, one_gpu, 20.0)
    guest = submit(world.member2)
    waiting(guest)
    assert colocation_pass()["paired"] == 1
    assert services.job_preempt(guest.pk, "a higher priority job")  # placed, not started: requeued at once
    assert fetch(guest).state == "queued"
    colocation_pass()
    guest, resident = fetch(guest), fetch(resident)
    assert guest.gpu_share_units == 100 and guest.colocation["state"] == "ended"
    assert resident.gpu_share_units == 100 and resident.colocation["state"] == "ended"

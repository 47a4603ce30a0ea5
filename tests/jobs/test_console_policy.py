"""The console policy applied to the database: borrowing beyond quota, reclaim, priority preemption."""

from __future__ import annotations

import pytest

from apps.cluster.models import Host
from apps.jobs import services
from apps.jobs.models import Job, JobEvent
from apps.jobs.scheduler import build_snapshot, scheduler_pass
from apps.jobs.services import JobSpec, job_submit
from apps.jobs.usage import gpus_held
from apps.scheduling.similarity import similarity_key
from workers.protocol import JobStatus


@pytest.fixture(autouse=True)
def preempt_at_once(settings):
    settings.SCHEDULER = {**settings.SCHEDULER, "policy": "console", "min_run_before_preempt_s": 0.0}


def submit(user, gpus: int, team: str = "vision", priority: str = "normal") -> Job:
    return job_submit(user=user, spec=JobSpec(name=f"{priority}-{gpus}", kind="train", gpus=gpus, team=team,
                                              priority=priority, workload={"builtin": "mlp-digits"}))


def start(job: Job) -> None:
    job.refresh_from_db()
    hosts = Host.objects.filter(gpus__allocations__job=job, gpus__allocations__released_at__isnull=True).distinct()
    for rank, host in enumerate(hosts):
        services.job_report_status(host=host, job_id=job.pk, status=JobStatus("running", job.attempts, node_rank=rank))


def agent_reports_preempted(job: Job) -> None:
    job.refresh_from_db()
    hosts = Host.objects.filter(gpus__allocations__job=job, gpus__allocations__released_at__isnull=True).distinct()
    for rank, host in enumerate(hosts):
        services.job_report_status(host=host, job_id=job.pk, status=JobStatus(
            "preempted", job.attempts, exit_code=143, reason="checkpoint saved", node_rank=rank))


def fresh(job: Job) -> Job:
    job.refresh_from_db()
    return job


def test_idle_gpus_are_borrowed_and_reclaimed_by_the_owner(world):
    own = [submit(world.member, 4), submit(world.member, 4)]
    borrower = submit(world.member2, 4)
    scheduler_pass()
    assert [fresh(j).state for j in own] == ["placed", "placed"]
    assert fresh(borrower).state == "placed" and fresh(borrower).borrowing
    assert "borrowing idle GPUs" in borrower.events.last().reason
    assert gpus_held(world.vision) == 12 and gpus_held(world.vision, guaranteed_only=True) == 8
    for job in [*own, borrower]:
        start(job)
    # nlp, within its quota, needs 8 GPUs: only 4 are idle, the borrower's 4 are reclaimed.
    owner = submit(world.other, 8, team="nlp")
    result = scheduler_pass()
    assert result.preempted == 1
    borrower = fresh(borrower)
    assert borrower.state == "running" and borrower.preempt_requested_at is not None
    assert JobEvent.objects.filter(job=borrower, reason__startswith="preemption requested").exists()
    assert fresh(owner).state == "queued"
    assert scheduler_pass().preempted == 0  # asked once; the agent is checkpointing
    agent_reports_preempted(borrower)
    borrower = fresh(borrower)
    assert borrower.state == "queued" and borrower.preemption_count == 1 and not borrower.borrowing
    scheduler_pass()
    assert fresh(owner).state == "placed"


def test_urgent_job_preempts_a_lower_priority_job_of_its_team(world):
    Host.objects.filter(name="node-b").update(state="down")
    low = submit(world.member, 8, priority="low")
    scheduler_pass()
    start(low)
    urgent = submit(world.admin, 8, priority="urgent")
    assert scheduler_pass().preempted == 1
    assert fresh(low).preempt_requested_at is not None
    assert fresh(urgent).pending_reason == "starting: waiting for its GPUs to be released"
    agent_reports_preempted(low)
    scheduler_pass()
    assert fresh(urgent).state == "placed" and fresh(low).state == "queued"
    reasons = [e.reason for e in fresh(low).events.all()]
    assert any(r.startswith("preemption requested") for r in reasons)
    assert any(r.startswith("preempted on node-a") for r in reasons)


def test_pending_reason_position_and_estimate(world, settings):
    settings.SCHEDULER = {**settings.SCHEDULER, "min_run_before_preempt_s": 600.0}
    Host.objects.filter(name="node-b").update(state="down")
    running = submit(world.member, 8)
    scheduler_pass()
    start(running)
    waiting = [submit(world.member2, 2), submit(world.member2, 4)]
    scheduler_pass()
    infos = [fresh(j) for j in waiting]
    assert all(j.state == "queued" and j.pending_reason for j in infos)
    assert sorted(j.queue_position for j in infos) == [1, 2]
    assert all(j.estimated_start is not None for j in infos)
    assert all(j.estimate_confidence is not None and 0 <= j.estimate_confidence <= 1 for j in infos)
    assert all("waiting for" in j.pending_reason for j in infos)
    first = next(j for j in infos if j.queue_position == 1)
    assert "jobs ahead" not in first.pending_reason
    assert fresh(running).preempt_requested_at is None  # it has not run its minimum time yet


def test_snapshot_carries_what_the_policy_predicts_from(world):
    job = submit(world.member, 2)
    Job.objects.filter(pk=job.pk).update(max_steps=1000, steps_done=100, steps_per_second=4.0)
    snapshot = build_snapshot()
    pending = {p.job_id: p for p in snapshot.pending}[job.pk]
    assert pending.declared_steps == 1000 and pending.observed_step_s == 0.25
    assert pending.similarity_key == "builtin:mlp-digits"
    assert similarity_key({"command": ["python", "/src/train.py", "--lr", "1"]}) == "command:train.py"
    assert snapshot.quotas["vision"].may_borrow


def test_a_preemption_is_rechecked_against_free_gpus_just_before_it_is_sent(world, monkeypatch):
    from apps.jobs import scheduler
    from apps.quotas.models import TeamQuota

    TeamQuota.objects.filter(team=world.vision).update(max_gpus=16)
    Host.objects.filter(name="node-b").update(state="down")
    low = submit(world.member, 8, priority="low")
    scheduler_pass()
    start(low)
    urgent = submit(world.admin, 8, priority="urgent")
    decided = []

    def schedule_then_a_host_comes_back(snapshot, config):
        decisions = schedule(snapshot, config)
        decided.append(decisions)
        Host.objects.filter(name="node-b").update(state="up")  # between the decision and the sending
        return decisions

    schedule = scheduler.schedule
    monkeypatch.setattr(scheduler, "schedule", schedule_then_a_host_comes_back)
    result = scheduler_pass()
    assert [(p.job_id, p.for_job) for p in decided[0].preemptions] == [(low.pk, urgent.pk)]
    assert result.preempted == 0 and fresh(low).preempt_requested_at is None
    assert fresh(urgent).state == "queued"
    monkeypatch.setattr(scheduler, "schedule", schedule)
    scheduler_pass()
    assert fresh(urgent).state == "placed" and fresh(low).state == "running"
    assert {a.gpu.host.name for a in fresh(urgent).allocations.all()} == {"node-b"}


def test_a_gang_the_free_gpus_fit_only_in_number_moves_the_jobs_in_its_way(world):
    # nlp's four single-GPU jobs hold two GPUs on each host: 12 GPUs free, but no host of 8 for vision's gang.
    small = [submit(world.other, 1, team="nlp") for _ in range(4)]
    for job, gpu in zip(small, [world.gpus[0], world.gpus[1], world.gpus[8], world.gpus[9]], strict=True):
        assert services.job_place(job.pk, (gpu.pk,), share_units=100)
        start(job)
    gang = submit(world.member, 8)
    assert scheduler_pass().preempted == 2
    moved = [job for job in small if fresh(job).preempt_requested_at is not None]
    assert len(moved) == 2 and all(fresh(job).state == "running" for job in moved)
    hosts = {a.gpu.host.name for job in moved for a in fresh(job).allocations.filter(released_at__isnull=True)}
    assert len(hosts) == 1  # the two on one host, which the gang is to get
    assert scheduler_pass().preempted == 0  # asked once; their agent is checkpointing
    assert any("to make room for job" in e.reason for e in fresh(moved[0]).events.all())
    assert fresh(gang).pending_reason == "starting: waiting for its GPUs to be released"
    for job in moved:
        agent_reports_preempted(job)
        assert fresh(job).state == "queued"
        # A move is no preemption of the job's: its protection and borrowing stay as they were.
        assert fresh(job).preemption_count == 0
    scheduler_pass()
    assert fresh(gang).state == "placed"
    assert {a.gpu.host.name for a in fresh(gang).allocations.all()} == hosts
    assert all(fresh(job).state == "placed" for job in moved)
    held = [a.gpu_id for job in [*small, gang] for a in fresh(job).allocations.filter(released_at__isnull=True)]
    assert len(held) == len(set(held)) == 12

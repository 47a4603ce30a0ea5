"""The lifecycle table (apps/jobs/lifecycle.py): every state change goes through it and writes its event."""

from __future__ import annotations

import pytest

from apps.jobs import services
from apps.jobs.lifecycle import ACTIVE_STATES, TRANSITIONS, sources, transition
from apps.jobs.models import Job, JobAllocation, JobEvent, UsageSegment
from apps.jobs.services import JobSpec, job_submit
from apps.quotas.models import TeamQuota
from workers.protocol import JobStatus

State = Job.State


def submit(user, gpus: int = 2) -> Job:
    return job_submit(user=user, spec=JobSpec(name="j", kind="train", gpus=gpus, team="vision",
                                              workload={"builtin": "mlp-digits"}))


def placed(world, gpus: int = 2) -> Job:
    job = submit(world.member, gpus)
    assert services.job_place(job.pk, tuple(gpu.pk for gpu in world.gpus[:gpus]))
    job.refresh_from_db()
    return job


def running(world) -> Job:
    job = placed(world)
    assert services.job_mark_running(job.pk)
    job.refresh_from_db()
    return job


def moves(job: Job) -> list[tuple[str, str]]:
    return [(e.from_state, e.to_state) for e in JobEvent.objects.filter(job=job).exclude(to_state="")]


def holds_gpus(job: Job) -> bool:
    return (JobAllocation.objects.filter(job=job, released_at__isnull=True).exists()
            or UsageSegment.objects.filter(job=job, ended_at__isnull=True).exists())


@pytest.fixture(autouse=True)
def within_quota(world):
    TeamQuota.objects.update(may_borrow=False)


def test_the_table_covers_every_state_and_final_states_lead_nowhere():
    assert set(TRANSITIONS) == set(State)
    assert all(targets <= set(State) for targets in TRANSITIONS.values())
    assert all(not TRANSITIONS[state] for state in Job.FINAL_STATES)
    assert all(state not in targets for state, targets in TRANSITIONS.items())  # no self-loops
    assert set(ACTIVE_STATES) == {State.QUEUED, State.PLACED, State.RUNNING, State.PREEMPTED}
    assert set(sources(State.PREEMPTED)) == set(Job.HOLDING_STATES)
    assert all(sources(state) for state in State)  # every state can be entered (queued again, after a requeue)


@pytest.mark.parametrize("from_state", list(State))
def test_every_transition_the_table_does_not_list_is_refused(world, from_state):
    job = submit(world.member)
    for to_state in State:
        if to_state in TRANSITIONS[from_state]:
            continue
        Job.objects.filter(pk=job.pk).update(state=from_state)
        job.refresh_from_db()
        events = JobEvent.objects.count()
        assert not transition(job, to_state, "not allowed"), (from_state, to_state)
        job.refresh_from_db()
        assert job.state == from_state and JobEvent.objects.count() == events


def test_a_stale_read_is_refused(world):
    job = submit(world.member)
    stale = Job.objects.get(pk=job.pk)
    assert transition(job, State.CANCELLED, "first")
    assert not transition(stale, State.PLACED, "stale: it was cancelled meanwhile")
    assert Job.objects.get(pk=job.pk).state == State.CANCELLED


def test_submission_placement_start_and_success_write_their_events(world):
    job = running(world)
    assert services.job_finish(job.pk, succeeded=True, exit_code=0, reason="exited with code 0")
    job.refresh_from_db()
    assert moves(job) == [("", "queued"), ("queued", "placed"), ("placed", "running"), ("running", "succeeded")]
    assert not holds_gpus(job)


def test_a_failure_reported_by_the_agent_writes_its_event_and_releases_the_gpus(world):
    job = placed(world)
    host = world.gpus[0].host
    services.job_report_status(host=host, job_id=job.pk, status=JobStatus("running", job.attempts))
    services.job_report_status(host=host, job_id=job.pk,
                               status=JobStatus("failed", job.attempts, exit_code=3, reason="boom"))
    job.refresh_from_db()
    assert job.state == "failed" and moves(job)[-2:] == [("placed", "running"), ("running", "failed")]
    assert not holds_gpus(job)


@pytest.mark.parametrize("start", ["queued", "placed", "running"])
def test_cancel_and_release_write_their_events(world, start):
    for stop in ("cancel", "release"):
        job = {"queued": lambda: submit(world.member), "placed": lambda: placed(world),
               "running": lambda: running(world)}[start]()
        if stop == "cancel":
            services.job_cancel(job=job, actor=world.member)
        else:
            assert services.job_release(job.pk, "policy")
        job.refresh_from_db()
        assert job.state == "cancelled" and moves(job)[-1] == (start, "cancelled")
        assert not holds_gpus(job)


def test_a_lost_host_requeues_or_fails_with_its_event(world):
    job = running(world)
    Job.objects.filter(pk=job.pk).update(max_retries=1)
    assert services.job_host_lost(job.pk, world.gpus[0].host) == "queued"
    job.refresh_from_db()
    assert moves(job)[-1] == ("running", "queued") and not holds_gpus(job)
    assert services.job_place(job.pk, tuple(gpu.pk for gpu in world.gpus[:2]))
    assert services.job_host_lost(job.pk, world.gpus[0].host) == "failed"
    job.refresh_from_db()
    assert moves(job)[-1] == ("placed", "failed") and not holds_gpus(job)


def test_preemption_of_a_running_job_records_preempted_then_queued(world):
    job = running(world)
    services.job_report_status(host=world.gpus[0].host, job_id=job.pk,
                               status=JobStatus("preempted", job.attempts, exit_code=143, reason="checkpoint saved"))
    job.refresh_from_db()
    assert job.state == "queued" and job.preemption_count == 1 and job.placed_at is None
    assert moves(job)[-2:] == [("running", "preempted"), ("preempted", "queued")]
    assert JobEvent.objects.filter(job=job, to_state="preempted", reason__startswith="preempted on").exists()
    assert not holds_gpus(job)


def test_preemption_of_a_placed_job_records_preempted_then_queued(world):
    job = placed(world)
    assert services.job_preempt(job.pk, "an urgent job needs the GPUs")
    job.refresh_from_db()
    assert job.state == "queued" and job.preemption_count == 1
    assert moves(job)[-2:] == [("placed", "preempted"), ("preempted", "queued")]
    assert not holds_gpus(job)


def test_asking_a_running_job_to_stop_changes_no_state(world):
    job = running(world)
    assert services.job_preempt(job.pk, "an urgent job needs the GPUs")
    job.refresh_from_db()
    assert job.state == "running" and job.preempt_requested_at is not None
    last = JobEvent.objects.filter(job=job).last()
    assert last.to_state == "" and last.reason.startswith("preemption requested")

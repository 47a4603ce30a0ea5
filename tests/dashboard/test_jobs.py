"""Job pages: list with filters, the submission form (through job_submit), the job page and cancel."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.core.models import AuditEvent
from apps.jobs.models import Job, JobLogChunk
from apps.telemetry.models import GpuSampleBucket
from tests.dashboard.conftest import hold, make_job


def form_data(**overrides):
    data = {"name": "digits", "team": "vision", "kind": "train", "gpus": "1", "gpu_type": "", "priority": "normal",
            "preset": "amp-bf16", "workload_mode": "builtin", "builtin": "mlp-digits", "params": '{"epochs": 1}',
            "command": "", "time_limit_minutes": "30", "max_steps": "", "max_retries": "0"}
    data.update(overrides)
    return data


def test_member_submits_a_job_through_the_form(world, web):
    response = web(world.member).post("/jobs/new/", form_data())
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert (job.team, job.user, job.preset, job.time_limit_minutes) == (world.vision, world.member, "amp-bf16", 30)
    assert job.workload == {"builtin": "mlp-digits", "params": {"epochs": 1}}
    assert job.events.get().reason == "submitted by mia"


def test_the_form_submits_a_job_array(world, web):
    response = web(world.member).post("/jobs/new/", form_data(array_size="3", array_parallelism="2"), follow=True)
    tasks = list(Job.objects.order_by("array_index"))
    assert [(t.array_id, t.array_index, t.array_size, t.array_parallelism) for t in tasks] == [
        (tasks[0].pk, i, 3, 2) for i in range(3)]
    assert response.redirect_chain[-1][0] == f"/jobs/{tasks[0].pk}/"
    assert f"Job array {tasks[0].pk} submitted: 3 tasks." in response.content.decode()


@pytest.mark.parametrize(
    ("text", "argv"),
    [("python train.py --lr '1e-3 x'", ["python", "train.py", "--lr", "1e-3 x"]),
     ("python\ntrain.py\n--name=a b\n", ["python", "train.py", "--name=a b"])],
)
def test_command_is_split_shell_like_or_one_argument_per_line(world, web, text, argv):
    response = web(world.member).post("/jobs/new/", form_data(workload_mode="command", command=text, params="",
                                                              builtin=""))
    assert response.status_code == 302
    assert Job.objects.get().workload == {"command": argv}


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"gpus": "0"}, "gpus", "greater than or equal to 0.01"),
        ({"gpus": "9"}, "gpus", "at most 8 GPUs"),  # job_submit's quota check
        ({"gpu_type": "B300"}, "gpu_type", "valid choice"),
        ({"priority": "high"}, "priority", "Only managers"),  # JobSpecError from the service
        ({"preset": "ddp", "kind": "inference"}, "preset", "for train jobs"),
        ({"params": '{"epochs": "two"}'}, "params", "epochs: must be an integer"),  # nested workload error
        ({"params": '{"bogus": 1}'}, "params", "bogus: unknown parameter"),
        ({"params": "{not json"}, "params", "Not valid JSON"),
        ({"params": "[1, 2]"}, "params", "JSON object"),
        ({"builtin": ""}, "builtin", "Choose a built-in workload"),
        ({"workload_mode": "command", "params": "", "command": "   "}, "command", "Give the command"),
        ({"workload_mode": "command", "params": "", "command": "python 'unclosed"}, "command", "Cannot split"),
        ({"name": ""}, "name", "required"),
        ({"team": "nlp"}, "team", "valid choice"),
        ({"array_size": "0"}, "array_size", "greater than or equal to 1"),
        ({"array_parallelism": "2"}, "array_parallelism", "Only for a job array"),
        ({"array_size": "2", "kind": "inference", "preset": "infer-fp32"}, "array_size", "Arrays are of training"),
    ],
)
def test_bad_input_shows_field_errors_and_creates_nothing(world, web, overrides, field, fragment):
    response = web(world.member).post("/jobs/new/", form_data(**overrides))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert any(fragment in message for message in errors.get(field, [])), errors
    assert fragment.split(":")[0] in response.content.decode()
    assert not Job.objects.exists()


def test_permission_error_from_the_service_is_a_form_error(world, web, monkeypatch):
    from apps.jobs import services
    from apps.jobs.errors import JobPermissionError

    def refuse(**kwargs):
        raise JobPermissionError("Viewers of team vision cannot submit jobs.")

    monkeypatch.setattr(services, "job_submit", refuse)
    response = web(world.member).post("/jobs/new/", form_data())
    assert response.status_code == 400
    assert "Viewers of team vision cannot submit jobs." in response.context["form"].non_field_errors()
    assert not Job.objects.exists()


@pytest.mark.parametrize("persona", ["viewer", "noteam"])
def test_viewers_get_no_form_and_the_server_refuses_a_post(world, web, persona):
    client = web(world.persona(persona))
    assert client.get("/jobs/new/").status_code == 403
    assert client.post("/jobs/new/", form_data()).status_code == 403
    assert not Job.objects.exists()
    assert 'id="submit-job"' not in client.get("/jobs/").content.decode()


def test_job_list_filters_and_pagination(world, web):
    for n in range(55):
        make_job(world.vision, world.member if n % 2 else world.member2, name=f"j{n}")
    make_job(world.vision, world.member, state=Job.State.FAILED, name="broken", kind="inference")
    make_job(world.nlp, world.other, name="secret-nlp")
    client = web(world.manager)
    page1 = client.get("/jobs/")
    assert page1.status_code == 200
    assert len(page1.context["page"]) == 50 and page1.context["page"].paginator.count == 56
    assert "secret-nlp" not in page1.content.decode()
    page2 = client.get("/jobs/?page=2")
    assert len(page2.context["page"]) == 6
    assert [j.name for j in client.get("/jobs/?state=failed").context["page"]] == ["broken"]
    assert [j.name for j in client.get("/jobs/?kind=inference").context["page"]] == ["broken"]
    assert client.get("/jobs/?user=milo").context["page"].paginator.count == 28
    assert client.get("/jobs/?team=nlp").context["page"].paginator.count == 56  # not a choice: filter ignored
    assert "page=2" in page1.content.decode()
    admin = web(world.admin).get("/jobs/?team=nlp")
    assert [j.name for j in admin.context["page"]] == ["secret-nlp"]


def test_job_page_shows_state_events_log_gpus_and_pending_info(world, web):
    job = make_job(world.vision, world.member, pending_reason="team vision holds 8 of 8 GPUs", queue_position=3,
                   estimated_start=timezone.now() + timedelta(minutes=30), estimate_confidence=0.8)
    JobLogChunk.objects.create(job=job, offset=0, data="epoch 1 loss 0.5\n")
    Job.objects.filter(pk=job.pk).update(log_size=17)
    html = web(world.viewer).get(f"/jobs/{job.pk}/").content.decode()
    assert "team vision holds 8 of 8 GPUs" in html and "position <strong>3</strong>" in html
    assert "estimated start" in html and '(confidence <span id="job-estimate-confidence">0.80</span>)' in html
    assert "epoch 1 loss 0.5" in html and "submitted" in html
    assert 'id="cancel-button"' not in html  # viewers see no cancel control
    assert "Automatic mixed precision" not in html  # preset description is the job's (baseline-fp32)
    assert "Plain fp32 training" in html


def test_job_page_gpu_history_between_placement_and_end(world, web):
    start = timezone.now() - timedelta(minutes=10)
    end = start + timedelta(minutes=5)
    job = make_job(world.vision, world.member, state=Job.State.SUCCEEDED, placed_at=start, finished_at=end)
    hold(job, world.gpus[:2], start, end)
    for minutes in (-3, 1, 2, 7):  # before placement and after the end are left out
        GpuSampleBucket.objects.create(gpu=world.gpus[0], resolution_s=10, bucket_start=start + timedelta(minutes=minutes),
                                       samples=10, available_samples=10, utilization_avg=40.0 + minutes)
    response = web(world.member).get(f"/jobs/{job.pk}/")
    history = response.context["history"]
    assert [point[1] for point in history["GPU-node-a-0"]] == [41.0, 42.0]
    assert "node-a:0" in response.content.decode()


def test_another_teams_job_page_is_404(world, web):
    job = make_job(world.nlp, world.other)
    for persona in ("manager", "member", "viewer", "noteam"):
        assert web(world.persona(persona)).get(f"/jobs/{job.pk}/").status_code == 404
        assert web(world.persona(persona)).post(f"/jobs/{job.pk}/cancel/").status_code == 404
    assert Job.objects.get(pk=job.pk).state == Job.State.QUEUED
    assert web(world.admin).get(f"/jobs/{job.pk}/").status_code == 200


def test_cancel_is_refused_server_side_for_viewers_and_other_members(world, web):
    job = make_job(world.vision, world.member)
    assert web(world.viewer).post(f"/jobs/{job.pk}/cancel/").status_code == 403
    assert web(world.member2).post(f"/jobs/{job.pk}/cancel/").status_code == 403
    assert 'id="cancel-button"' not in web(world.member2).get(f"/jobs/{job.pk}/").content.decode()
    assert Job.objects.get(pk=job.pk).state == Job.State.QUEUED
    assert web(world.member).get(f"/jobs/{job.pk}/cancel/").status_code == 405  # POST only


def test_owner_cancels_and_manager_cancel_is_audited(world, web):
    own = make_job(world.vision, world.member)
    client = web(world.member)
    assert 'id="cancel-button"' in client.get(f"/jobs/{own.pk}/").content.decode()
    response = client.post(f"/jobs/{own.pk}/cancel/", {"reason": "typo", "confirm": "yes"}, follow=True)
    assert Job.objects.get(pk=own.pk).state == Job.State.CANCELLED
    assert "cancelled" in response.content.decode()
    again = client.post(f"/jobs/{own.pk}/cancel/", follow=True)
    assert "already cancelled" in again.content.decode()
    theirs = make_job(world.vision, world.member2)
    web(world.manager).post(f"/jobs/{theirs.pk}/cancel/", {"confirm": "yes"})
    assert Job.objects.get(pk=theirs.pk).state == Job.State.CANCELLED
    assert AuditEvent.objects.filter(action=AuditEvent.Action.JOB_CANCELLED_BY_OTHER, actor=world.manager).exists()


def test_cancel_needs_csrf(world):
    from django.test import Client

    job = make_job(world.vision, world.member)
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.member)
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    assert Job.objects.get(pk=job.pk).state == Job.State.QUEUED


def overstating_record(world) -> None:
    """The member's six finished runs each declared 3,000 steps and ran 1,000."""
    now = timezone.now()
    for n in range(6):
        make_job(world.vision, world.member, state=Job.State.SUCCEEDED, name=f"done-{n}", max_steps=3000,
                 steps_done=1000, started_at=now - timedelta(hours=2), finished_at=now - timedelta(hours=1))


# A queued job declaring 9,000 steps after that record is counted on for about a third
# (RuntimeHistory.declared_scale, shrunk toward no bias while the runs are few: 6 runs against a prior of 2).
COUNTED = round(9000 * math.exp(-math.log(3.0) * 6 / 8))


def test_job_page_says_how_many_steps_the_scheduler_counts_on_from_its_users_record(world, web):
    overstating_record(world)
    job = make_job(world.vision, world.member, max_steps=9000)
    html = web(world.member).get(f"/jobs/{job.pk}/").content.decode()
    counted = COUNTED
    assert (f"(the scheduler counts on about {counted}: member's last 6 finished runs with max steps ran fewer "
            "steps than they declared)") in html.replace(world.member.username, "member")
    # a user whose runs ran what they declared (or who has none) sees the declaration alone
    other = make_job(world.vision, world.manager, max_steps=9000)
    assert 'id="job-believed-steps"' not in web(world.manager).get(f"/jobs/{other.pk}/").content.decode()


def test_job_api_and_gpuctl_say_how_many_steps_the_scheduler_counts_on(world):
    from rest_framework.test import APIClient

    from workers.cli.output import job_detail

    overstating_record(world)
    job = make_job(world.vision, world.member, max_steps=9000)
    client = APIClient()
    client.force_authenticate(world.member)
    data = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert data["believed_steps"] == {"steps": COUNTED, "runs": 6}
    assert (f"max steps:    9000 (the scheduler counts on about {COUNTED}: {world.member.username}'s last 6 finished "
            "runs with max steps ran fewer steps than they declared)") in job_detail(data)
    # the list leaves it out (a query per job); a user without such a record, and an ended job, get null
    assert "believed_steps" not in client.get("/api/v1/jobs/").json()["results"][0]
    other = make_job(world.vision, world.manager, max_steps=9000)
    client.force_authenticate(world.manager)
    assert client.get(f"/api/v1/jobs/{other.pk}/").json()["believed_steps"] is None
    assert "max steps" not in job_detail(client.get(f"/api/v1/jobs/{other.pk}/").json())
    client.force_authenticate(world.member)
    Job.objects.filter(pk=job.pk).update(state=Job.State.CANCELLED)
    assert client.get(f"/api/v1/jobs/{job.pk}/").json()["believed_steps"] is None

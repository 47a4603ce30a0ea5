"""Bad input for each field of the job spec: a 400 naming the field, and no job created."""

from __future__ import annotations

import pytest

from apps.jobs.models import Job, JobEvent
from apps.quotas.models import TeamQuota, UserQuota
from tests.conftest import train_spec
from tests.factories import HostFactory, add_gpus

BAD_SPECS = [
    ("name", {"name": ""}),
    ("name", {"name": "x" * 201}),
    ("name", {"name": None}),
    ("team", {"team": "no-such-team"}),
    ("team", {"team": "Bad Slug!"}),
    ("team", {"team": "nlp"}),  # exists, but the user is not a member
    ("kind", {"kind": "dance"}),
    ("gpus", {"gpus": 0}),
    ("gpus", {"gpus": -2}),
    ("gpus", {"gpus": "two"}),
    ("gpus", {"gpus": 1.5}),
    ("gpus", {"gpus": 9}),  # above the team's max_gpus (8)
    ("gpus", {"gpus": None}),
    ("gpu_type", {"gpu_type": "TPUv9"}),
    ("gpu_type", {"gpu_type": "x" * 61}),
    ("priority", {"priority": "asap"}),
    ("priority", {"priority": "urgent"}),  # admins only
    ("priority", {"priority": "high"}),  # managers only
    ("preset", {"preset": "warp-speed"}),
    ("preset", {"preset": "infer-int8"}),  # an inference preset on a training job
    ("workload", {"workload": "python train.py"}),
    ("workload", {"workload": {}}),
    ("workload", {"workload": {"builtin": "mlp-digits", "command": ["x"]}}),
    ("workload", {"workload": {"builtin": "no-such-model"}}),
    ("workload", {"workload": {"builtin": "mlp-digits", "params": {"epochs": "many"}}}),
    ("workload", {"workload": {"builtin": "mlp-digits", "params": {"warp": 9}}}),
    ("workload", {"workload": {"builtin": "mlp-digits", "params": {"epochs": 0}}}),
    ("workload", {"workload": {"builtin": "mlp-digits", "params": []}}),
    ("workload", {"workload": {"command": []}}),
    ("workload", {"workload": {"command": "python x.py"}}),
    ("workload", {"workload": {"command": ["python", 3]}}),
    ("workload", {"workload": {"command": ["python", "a\x00b"]}}),
    ("workload", {"workload": {"command": ["x"], "env": {}}}),
    ("max_steps", {"max_steps": 0}),
    ("max_steps", {"max_steps": "ten"}),
    ("time_limit_minutes", {"time_limit_minutes": 0}),
    ("time_limit_minutes", {"time_limit_minutes": 10**9}),
    ("max_retries", {"max_retries": 4}),
    ("array_size", {"array_size": 0}),
    ("array_size", {"array_size": 501}),
    ("array_size", {"array_size": "many"}),
    ("array_size", {"kind": "inference", "preset": "infer-fp32", "array_size": 2}),
    ("array_parallelism", {"array_size": 4, "array_parallelism": 0}),
    ("array_parallelism", {"array_parallelism": 2}),
]


@pytest.mark.parametrize(("field", "overrides"), BAD_SPECS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_SPECS)])
def test_bad_field_gets_400_naming_it(world, client_for, field, overrides):
    response = client_for(world.member).post("/api/v1/jobs/", train_spec(**overrides), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Job.objects.exists() and not JobEvent.objects.exists()


@pytest.mark.parametrize("missing", ["name", "gpus", "workload"])
def test_missing_required_field(world, client_for, missing):
    spec = train_spec()
    del spec[missing]
    response = client_for(world.member).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400 and missing in response.json()


@pytest.mark.parametrize("body", ["not json", "[1, 2]", "null", '{"gpus": 1e999}', "\xff\xfe"])
def test_malformed_body_is_400_not_500(world, client_for, body):
    response = client_for(world.member).generic(
        "POST", "/api/v1/jobs/", body.encode("utf-8", "surrogateescape"), content_type="application/json"
    )
    assert response.status_code == 400


def test_more_gpus_than_the_largest_pool(world, client_for):
    TeamQuota.objects.filter(team=world.vision).update(max_gpus=64)
    add_gpus(HostFactory(name="node-c"), 4, gpu_type="A100")
    client = client_for(world.member)
    response = client.post("/api/v1/jobs/", train_spec(gpus=17), format="json")
    assert response.status_code == 400
    assert "only 16" in response.json()["gpus"][0]
    response = client.post("/api/v1/jobs/", train_spec(gpus=5, gpu_type="A100"), format="json")
    assert response.status_code == 400 and "only 4 A100" in response.json()["gpus"][0]
    assert client.post("/api/v1/jobs/", train_spec(gpus=16), format="json").status_code == 201


def test_priority_above_team_max_and_gpu_type_not_allowed(world, client_for):
    TeamQuota.objects.filter(team=world.vision).update(max_priority="normal", allowed_gpu_types=["A100"])
    add_gpus(HostFactory(name="node-c"), 4, gpu_type="A100")
    client = client_for(world.manager)
    response = client.post("/api/v1/jobs/", train_spec(priority="high"), format="json")
    assert response.status_code == 400 and "up to 'normal'" in response.json()["priority"][0]
    response = client.post("/api/v1/jobs/", train_spec(gpu_type="H200"), format="json")
    assert response.status_code == 400 and "A100" in response.json()["gpu_type"][0]
    assert client.post("/api/v1/jobs/", train_spec(gpu_type="A100"), format="json").status_code == 201


def test_exhausted_budget(world, client_for):
    from datetime import timedelta

    from django.utils import timezone

    from apps.jobs.models import UsageSegment

    TeamQuota.objects.filter(team=world.vision).update(gpu_hours_per_month=10)
    client = client_for(world.member)
    first = client.post("/api/v1/jobs/", train_spec(), format="json").json()
    now = timezone.now()
    UsageSegment.objects.create(job_id=first["id"], team=world.vision, user=world.member, gpus=4,
                                started_at=max(now - timedelta(hours=3), now.replace(day=1, hour=0, minute=0)),
                                ended_at=now)
    segment = UsageSegment.objects.get()
    used = segment.gpus * (segment.ended_at - segment.started_at).total_seconds() / 3600
    response = client.post("/api/v1/jobs/", train_spec(), format="json")
    if used >= 10:
        assert response.status_code == 400 and "budget" in response.json()["team"][0]
    else:  # early on the 1st of a month the segment is clipped to the month
        assert response.status_code == 201


def test_per_user_cap(world, client_for):
    UserQuota.objects.create(team=world.vision, user=world.member, max_gpus=2)
    response = client_for(world.member).post("/api/v1/jobs/", train_spec(gpus=3), format="json")
    assert response.status_code == 400 and "at most 2" in response.json()["gpus"][0]


def test_team_is_optional_with_one_team_and_required_with_several(world, client_for):
    spec = train_spec()
    del spec["team"]
    response = client_for(world.member).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201 and response.json()["team"] == "vision"
    from apps.accounts.models import Membership, Role

    Membership.objects.create(team=world.nlp, user=world.member, role=Role.MEMBER)
    response = client_for(world.member).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400 and "several teams" in response.json()["team"][0]


def test_valid_submission_answers_queued_with_reason(world, client_for):
    response = client_for(world.member).post(
        "/api/v1/jobs/",
        train_spec(gpus=2, preset="amp-bf16", max_steps=100, time_limit_minutes=30,
                   workload={"builtin": "cnn-digits", "params": {"epochs": 1, "lr": 0.01}}),
        format="json",
    )
    assert response.status_code == 201
    body = response.json()
    assert body["state"] == "queued" and body["pending_reason"] == "waiting for the scheduler"
    assert body["preset"] == "amp-bf16" and body["time_limit_minutes"] == 30
    events = JobEvent.objects.filter(job_id=body["id"])
    assert [(e.from_state, e.to_state) for e in events] == [("", "queued")]


def test_command_workload_and_inference_default_preset(world, client_for):
    client = client_for(world.member)
    response = client.post("/api/v1/jobs/", train_spec(workload={"command": ["python", "train.py", "--lr", "3e-4"]}),
                           format="json")
    assert response.status_code == 201 and response.json()["preset"] == "baseline-fp32"
    response = client.post("/api/v1/jobs/", train_spec(kind="inference"), format="json")
    assert response.status_code == 201 and response.json()["preset"] == "infer-fp32"


def test_the_created_answer_is_the_job_as_reading_it_back_shows_it(world, client_for):
    client = client_for(world.member)
    created = client.post("/api/v1/jobs/", train_spec(team="vision"), format="json").json()
    assert created == client.get(f"/api/v1/jobs/{created['id']}/").json()


@pytest.mark.parametrize("overrides", [{}, {"gpus": 0.25, "gpu_memory_gb": 20, "max_steps": 50, "priority": "low"}])
def test_the_submit_answer_is_the_job_as_the_api_shows_it(world, client_for, overrides):
    """The 201's body is built without DRF's serializer (see submitted_job_data); it must stay the same document."""
    client = client_for(world.member)
    created = client.post("/api/v1/jobs/", train_spec(**overrides), format="json")
    assert created.status_code == 201, created.content
    shown = client.get(f"/api/v1/jobs/{created.json()['id']}/").json()
    assert list(created.json()) == list(shown)
    assert created.json() == shown

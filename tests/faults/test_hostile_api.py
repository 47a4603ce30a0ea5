"""Hostile input against the REST API: schemathesis over our own OpenAPI schema, fuzzed job specs, path tricks.

Everything runs in-process (the WSGI app, the test database): no server, no agent.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from apps.accounts.services import token_create
from apps.cluster.services import host_token_issue
from apps.core.models import AuditEvent
from apps.jobs.models import Job, JobEvent
from apps.jobs.services import JobSpec, job_submit
from tests.cluster.test_agent_api import registration
from tests.conftest import train_spec

pytestmark = [pytest.mark.faults, pytest.mark.django_db]

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture
def api_schema(world):
    with connection_kept():
        return schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())


@contextlib.contextmanager
def connection_kept():
    """As Django's test client does: a request must not close the test's connection (it holds the test's
    transaction; on PostgreSQL with health checks the next query would open a new one inside it)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


class RolledBack(Exception):
    def __init__(self, response) -> None:
        super().__init__()
        self.response = response


def run_operation(operation, headers: dict[str, str], max_examples: int, mode=GenerationMode.POSITIVE) -> None:
    checks = CHECKS if mode == GenerationMode.POSITIVE else [not_a_server_error]

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case) -> None:
        # Each example in a savepoint, rolled back: one database error cannot poison the examples after it.
        try:
            with connection_kept(), transaction.atomic():
                raise RolledBack(case.call(headers=headers))
        except RolledBack as done:
            response = done.response
        case.validate_response(response, checks=checks, headers=headers)

    check()


def credentials(world, persona: str) -> dict[str, str]:
    if persona == "host":
        host, secret = host_token_issue(name="sim-fuzz")
        assert APIClient(HTTP_AUTHORIZATION=f"Host {secret}").post(
            "/api/v1/agent/register/", registration("sim-fuzz"), format="json").status_code == 200
        return {"Authorization": f"Host {secret}"}
    _, secret = token_create(user=world.persona(persona), name="fuzz")
    return {"Authorization": f"Bearer {secret}"}


@pytest.mark.parametrize("persona", ["admin", "member", "host"])
def test_schemathesis(world, api_schema, persona):
    headers = credentials(world, persona)
    failures = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if operation.path.startswith("/api/v1/agent/") != (persona == "host"):
            continue
        try:
            run_operation(operation, headers, 8)
            run_operation(operation, headers, 4, GenerationMode.NEGATIVE)
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)


# --- fuzzed job specs: arbitrary JSON in every field, never a 500, nothing created unless 201

SPEC_FIELDS = {"name", "team", "kind", "gpus", "gpu_memory_gb", "gpu_type", "priority", "preset", "workload",
               "max_steps", "time_limit_minutes", "max_retries"}
hostile_text = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ["\x00", "a\x00b", "../../etc/passwd", "/etc/passwd", "\u202e\ufeff", "💥" * 50, "x" * 5000, " ", ""])
scalars = (st.none() | st.booleans() | hostile_text
           | st.integers(min_value=-(10**40), max_value=10**40) | st.sampled_from([0, -1, 2**63, 10**308, -(2**31)])
           | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1e-320, 0.005, 0.25, 1.5, 1e300]))
json_values = st.recursive(scalars, lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(hostile_text, children, max_size=4), max_leaves=10)
param_names = st.sampled_from(["epochs", "batch_size", "lr", "seed", "checkpoint", "hidden", "depth", "layers"])
valid_params = st.fixed_dictionaries({}, optional={
    "epochs": st.integers(1, 10_000), "lr": st.floats(0, 10), "seed": st.integers(0, 2**31 - 1),
    "checkpoint": hostile_text})
valid_workloads = (
    st.fixed_dictionaries({"builtin": st.sampled_from(["mlp-digits", "cnn-digits", "tiny-lm"])},
                          optional={"params": valid_params})
    | st.fixed_dictionaries({"command": st.lists(hostile_text, min_size=1, max_size=4)})
)
hostile_workloads = (
    st.fixed_dictionaries({"builtin": st.sampled_from(["mlp-digits", "tiny-lm"]) | json_values},
                          optional={"params": st.dictionaries(param_names | hostile_text, json_values, max_size=4)
                                    | json_values})
    | st.fixed_dictionaries({"command": st.lists(scalars, max_size=4) | json_values})
    | st.fixed_dictionaries({"serve": json_values}) | scalars | json_values
)
valid_specs = st.fixed_dictionaries(  # valid but for what hostile_text puts in the name and the checkpoint
    {"name": st.text(st.characters(codec="utf-8", categories=["L", "N"]), min_size=1, max_size=30) | hostile_text,
     "gpus": st.sampled_from([1, 2, 8, "0.5", 0.25, "1.00"]), "workload": valid_workloads},
    optional={"team": st.just("vision"), "kind": st.just("train"), "priority": st.sampled_from(["low", "normal"]),
              "max_steps": st.integers(1, 10**12), "time_limit_minutes": st.integers(1, 60),
              "max_retries": st.integers(0, 3), "gpu_type": st.just("H200")},
)
# A valid spec; one with up to three fields replaced by anything; one with a hostile workload; not an object.
mutated_specs = st.tuples(
    valid_specs, st.dictionaries(st.sampled_from([*sorted(SPEC_FIELDS), "extra"]), json_values, max_size=3),
).map(lambda parts: {**parts[0], **parts[1]})
hostile_workload_specs = st.tuples(valid_specs, hostile_workloads).map(lambda p: {**p[0], "workload": p[1]})
job_specs = valid_specs | mutated_specs | hostile_workload_specs | json_values


def assert_messages(errors) -> None:
    """Field errors are messages, lists of them, or (nested fields) objects of them: never anything else."""
    if isinstance(errors, str):
        return
    assert isinstance(errors, list | dict) and errors, errors
    for value in errors.values() if isinstance(errors, dict) else errors:
        assert_messages(value)


def test_fuzzed_job_specs_are_201_or_400_with_field_errors(world):
    client = APIClient()
    client.force_authenticate(world.member)

    @settings(max_examples=300, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    @given(spec=job_specs)
    def submit(spec) -> None:
        before = (Job.objects.count(), JobEvent.objects.count(), AuditEvent.objects.count())
        body = json.dumps(spec)
        response = client.generic("POST", "/api/v1/jobs/", body, content_type="application/json")
        assert response.status_code in {201, 400}, (body[:500], response.status_code, response.content[:500])
        event(f"answered {response.status_code}")
        if response.status_code == 400:
            errors = response.json()
            unknown = set(spec) - SPEC_FIELDS if isinstance(spec, dict) else set()
            assert isinstance(errors, dict) and set(errors) <= SPEC_FIELDS | unknown | {"non_field_errors"}, errors
            assert all(errors[name] == ["Unknown field."] for name in unknown & set(errors)), errors
            assert_messages(errors)
            assert (Job.objects.count(), JobEvent.objects.count(), AuditEvent.objects.count()) == before
        else:
            job = Job.objects.get(pk=response.json()["id"])
            assert job.team.slug == "vision" and Job.objects.count() == before[0] + 1
            assert "\x00" not in json.dumps(job.workload, ensure_ascii=False)

    submit()


# --- paths that come from users: only ever inside the job's own artifacts


@pytest.mark.parametrize("params", [
    {"checkpoint": "/data/model\x00.pt"}, {"checkpoint": "\x00"}, {"seed": 1, "checkpoint": "a/\x00/../b"},
])
def test_nul_in_workload_params_is_a_field_error(world, client_for, params):
    spec = train_spec(workload={"builtin": "mlp-digits", "params": params})
    response = client_for(world.member).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400, response.content
    assert "checkpoint" in str(response.json()["workload"]) and not Job.objects.exists()


@pytest.mark.parametrize("workload", [
    {"serve": {"workload": "mlp-digits", "checkpoint": "../../etc/passwd"}},  # a replica's shape: never from users
    {"builtin": "mlp-digits", "serve": {"workload": "mlp-digits", "checkpoint": "/etc/passwd"}},
    {"command": ["python", "train.py\x00../../etc/passwd"]},
])
def test_users_cannot_smuggle_a_replica_checkpoint_or_nul_argv(world, client_for, workload):
    response = client_for(world.member).post("/api/v1/jobs/", train_spec(kind="inference", workload=workload),
                                             format="json")
    assert response.status_code == 400 and "workload" in response.json(), response.content
    assert not Job.objects.exists()


@pytest.fixture
def artifacts(world, tmp_path, settings):
    """A vision job and an nlp job, each with outputs/model.pt, in a private artifact store."""
    settings.ARTIFACT_STORE_URL = tmp_path.as_uri()
    vision = job_submit(user=world.member, spec=JobSpec(name="v", kind="train", gpus=1, team="vision",
                                                        workload={"builtin": "mlp-digits"}))
    nlp = job_submit(user=world.other, spec=JobSpec(name="n", kind="train", gpus=1, team="nlp",
                                                     workload={"builtin": "mlp-digits"}))
    for job in (vision, nlp):
        (tmp_path / str(job.pk) / "outputs").mkdir(parents=True)
        (tmp_path / str(job.pk) / "outputs" / "model.pt").write_bytes(f"weights of {job.team.slug}".encode())
    (tmp_path / "secret.txt").write_text("outside every job")
    return vision, nlp, tmp_path


def service_checkpoints(vision: Job, nlp: Job) -> list[str]:
    return [
        "../../etc/passwd", "/etc/passwd", f"/{vision.pk}/outputs/model.pt", f"{vision.pk}/../{nlp.pk}/outputs/model.pt",
        f"{vision.pk}/outputs/../../secret.txt", f"{vision.pk}/..", f"{vision.pk}/outputs/model.pt\x00",
        f"{vision.pk}\\..\\{nlp.pk}\\outputs\\model.pt", f"{vision.pk}/outputs\\..\\..\\secret.txt",
        f"{nlp.pk}/outputs/model.pt",  # another team's job
    ]


def test_service_checkpoint_must_stay_in_a_job_of_the_team(world, client_for, artifacts):
    from apps.serving.models import InferenceService

    vision, nlp, _ = artifacts
    client = client_for(world.member)
    for checkpoint in service_checkpoints(vision, nlp):
        response = client.post("/api/v1/services/", {"team": "vision", "name": "digits", "workload": "mlp-digits",
                                                      "checkpoint": checkpoint}, format="json")
        assert response.status_code == 400, (checkpoint, response.content)
        assert "checkpoint" in response.json(), (checkpoint, response.json())
    assert not InferenceService.objects.exists()
    ok = client.post("/api/v1/services/", {"team": "vision", "name": "digits", "workload": "mlp-digits",
                                           "checkpoint": f"{vision.pk}/outputs/model.pt"}, format="json")
    assert ok.status_code == 201, ok.content


def test_artifact_downloads_never_leave_the_job(world, client_for, artifacts):
    vision, nlp, root = artifacts
    (root / str(vision.pk) / "outputs" / "escape").symlink_to(root / str(nlp.pk) / "outputs" / "model.pt")
    client = client_for(world.member)
    base = f"/api/v1/jobs/{vision.pk}/artifacts"
    assert b"".join(client.get(f"{base}/outputs/model.pt/").streaming_content) == b"weights of vision"
    for path in ["../secret.txt", f"../{nlp.pk}/outputs/model.pt", "..%2F..%2Fsecret.txt", "%2e%2e/secret.txt",
                 "outputs/../../secret.txt", "/etc/passwd", "%2Fetc%2Fpasswd", "outputs/model.pt%00",
                 "outputs%5C..%5C..%5Csecret.txt", "outputs/escape", "./outputs/./../../secret.txt"]:
        response = client.get(f"{base}/{path}/")
        assert response.status_code == 404, (path, response.status_code)
        body = b"".join(response.streaming_content) if response.streaming else response.content
        assert b"weights of nlp" not in body and b"outside every job" not in body, path
    # Another team's job answers 404 whatever the path: its artifacts exist, but not for this user.
    assert client.get(f"/api/v1/jobs/{nlp.pk}/artifacts/outputs/model.pt/").status_code == 404
    assert client.get(f"/api/v1/jobs/{nlp.pk}/artifacts/").status_code == 404


@pytest.mark.parametrize(("since", "status"), [
    ("2553-10-09T22:06:41+18:29", 200),  # a valid ISO offset that PostgreSQL refuses: compared in UTC
    ("2026-01-01T00:00:00-23:59", 200), ("2026-01-01T00:00:00", 200), ("9999-12-31T23:00:00-05:00", 400),
    ("0001-01-01T00:30:00+01:00", 400), ("yesterday", 400), ("2026-13-01", 400),
])
def test_audit_since_takes_any_offset_and_never_500s(world, client_for, since, status):
    response = client_for(world.admin).get("/api/v1/audit/", {"since": since})
    assert response.status_code == status, response.content
    if status == 400:
        assert "since" in response.json()

"""Services from a user's image (issue 16): the spec's checks through the API and the form page, the replica jobs
they run, and what those replicas' dispatches carry. The live path (podman, the gate, the gateway, the autoscaler)
is tests/containers/test_live_containers.py's."""

from __future__ import annotations

import pytest
from django.db import transaction

from apps.accounts.secrets import secret_create
from apps.cluster.models import Host
from apps.jobs import services as job_services
from apps.jobs.models import Job
from apps.jobs.scheduler import scheduler_pass
from apps.serving import services
from apps.serving.models import InferenceService

IMAGE = "registry.example.org/team/server:2"
COMMAND = ["python3", "/srv/server.py", "--workers", "2"]


def create(client, drop: tuple[str, ...] = (), **overrides):
    body = {"team": "vision", "name": "own", "image": IMAGE, "command": COMMAND, "min_replicas": 1,
            "max_replicas": 2, "target_rps_per_replica": 5}
    body.update(overrides)
    return client.post("/api/v1/services/", {k: v for k, v in body.items() if k not in drop}, format="json")


@pytest.mark.parametrize(("overrides", "field"), [
    ({"drop": ("command",)}, "command"),
    ({"drop": ("image",)}, "image"),
    ({"command": []}, "command"),
    ({"command": "python3 server.py"}, "command"),
    ({"command": ["python3", 7]}, "command"),
    ({"image": ""}, "image"),
    ({"image": "Not An Image!"}, "image"),
    ({"workload": "mlp-digits"}, "workload"),
    ({"checkpoint": "1/outputs/model.pt"}, "checkpoint"),
    ({"env": {"CONSOLE_SERVE_PORT": "9"}}, "env"),
    ({"env": ["A=1"]}, "env"),
    ({"secrets": ["NOT_A_SECRET"]}, "secrets"),
])
def test_bad_image_service_specs_get_400_naming_the_field(world, client_for, overrides, field):
    response = create(client_for(world.member), **overrides)
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Job.objects.exists() and not InferenceService.objects.exists()


def test_env_and_secrets_belong_to_image_services_only(world, client_for):
    response = client_for(world.member).post("/api/v1/services/", {
        "team": "vision", "name": "plain", "workload": "mlp-digits", "env": {"A": "1"}}, format="json")
    assert response.status_code == 400 and "env" in response.json()


def test_an_image_service_runs_replicas_of_its_image_with_the_secret_in_their_dispatch(world, client_for):
    secret_create(team=world.vision, name="HF_TOKEN", value="hf-secret-value-123", actor=world.manager)
    response = create(client_for(world.member), env={"MODEL": "small"}, secrets=["HF_TOKEN"])
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["image"] == IMAGE and body["command"] == COMMAND and body["workload"] == ""
    assert body["env"] == {"MODEL": "small"} and body["secrets"] == ["HF_TOKEN"]
    job = Job.objects.get()
    assert job.kind == "inference" and job.workload == {"serve": {"command": COMMAND}}
    assert job.image == IMAGE and job.env == {"MODEL": "small"} and job.secrets == ["HF_TOKEN"]
    scheduler_pass()
    job.refresh_from_db()
    assert job.state == "queued"  # as any job with an image: only a host whose agent runs containers takes it
    Host.objects.update(runtime="podman")
    scheduler_pass()
    job.refresh_from_db()
    (_, message), = job_services.dispatch_messages(job)
    assert message.container.image == IMAGE
    # Names only: the agent fetches the values over the agent API just before the container starts.
    assert message.container.secrets == ("HF_TOKEN",) and "hf-secret-value-123" not in str(message)
    assert len(message.replica_secret) >= 16  # the agent's replica gate checks it; the server never sees it


def test_the_autoscaler_adds_a_replica_of_the_image(world, client_for):
    create(client_for(world.member))
    service = InferenceService.objects.get()
    summary = {"replicas": 1, "ready": 1, "rps": 12.0, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0,
               "queue_depth": 0, "error_rate": 0.0, "requests": 100, "window_requests": 100}
    desired, reason = services.autoscale_decision(service, summary, now=1e12)
    assert desired == 2 and "req/s per replica" in reason


def test_the_service_page_creates_an_image_service_and_shows_field_errors(world, client):
    client.force_login(world.member)
    bad = client.post("/services/", {"team": "vision", "name": "own", "image": IMAGE, "command": "",
                                     "env": "CONSOLE_X=1", "preset": "infer-fp32", "gpus_per_replica": 1,
                                     "min_replicas": 1, "max_replicas": 1, "max_batch": 32, "max_wait_ms": 5})
    assert bad.status_code == 400
    errors = bad.context["form"].errors
    assert "command" in errors and "CONSOLE_X" in " ".join(errors["env"])
    good = client.post("/services/", {"team": "vision", "name": "own", "image": IMAGE,
                                      "command": "python3 /srv/server.py --workers 2", "env": "MODEL=small",
                                      "preset": "infer-fp32", "gpus_per_replica": 1, "min_replicas": 1,
                                      "max_replicas": 1, "max_batch": 32, "max_wait_ms": 5})
    assert good.status_code == 302, good.content
    service = InferenceService.objects.get()
    assert service.image == IMAGE and service.command == COMMAND and service.env == {"MODEL": "small"}
    page = client.get(f"/services/{service.pk}/")
    assert IMAGE in page.content.decode() and "python3 /srv/server.py --workers 2" in page.content.decode()


SERVICE_FIELDS = {"team", "name", "workload", "image", "command", "env", "secrets", "checkpoint", "preset",
                  "gpus_per_replica", "min_replicas", "max_replicas", "target_p95_ms", "target_rps_per_replica",
                  "max_batch", "max_wait_ms", "batching"}


class RolledBack(Exception):
    def __init__(self, response) -> None:
        super().__init__()
        self.response = response


def test_fuzzed_image_service_specs_are_201_or_400_with_field_errors(world, client_for):
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    from tests.faults.test_hostile_api import assert_messages, json_values

    client = client_for(world.member)
    valid = {"team": "vision", "name": "own", "image": IMAGE, "command": COMMAND, "env": {"A": "1"}}
    specs = st.dictionaries(st.sampled_from(["image", "command", "env", "secrets", "workload", "checkpoint"]),
                            json_values, max_size=3).map(lambda changes: {**valid, **changes})

    @settings(max_examples=150, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    @given(spec=specs)
    def check(spec) -> None:
        try:  # each example rolled back: a created service does not take the next one's name
            with transaction.atomic():
                raise RolledBack(client.post("/api/v1/services/", spec, format="json"))
        except RolledBack as done:
            response = done.response
        assert response.status_code in {201, 400}, (spec, response.status_code, response.content[:500])
        if response.status_code == 400:
            errors = response.json()
            assert isinstance(errors, dict) and set(errors) <= SERVICE_FIELDS | {"non_field_errors"}, errors
            assert_messages(errors)

    check()
    assert not InferenceService.objects.exists() and not Job.objects.exists()

"""A job with an image: placed only on hosts that run containers, dispatched with its ContainerSpec (secrets by
name only: the agent of the host the attempt is placed on fetches their values over the agent API while it is
placed or running), and shown with the backend that ran it."""

from __future__ import annotations

import json

import pytest

from apps.accounts.models import TeamSecret
from apps.accounts.secrets import secret_create, secret_delete, secret_rotate
from apps.cluster.models import GPU, Host
from apps.cluster.services import host_token_issue
from apps.cluster.volumes import volume_create
from apps.jobs import services
from apps.jobs.attempt_tokens import attempt_token
from apps.jobs.dispatch import dispatch_job
from apps.jobs.models import Job, JobEvent
from apps.jobs.scheduler import scheduler_pass
from apps.jobs.services import JobSpec, job_submit
from tests.cluster.test_agent_api import agent, registration
from workers.protocol import RUN_JOB_TASK, CodeSnapshot, ContainerSpec, Dispatch, MountSpec, host_queue

IMAGE = "localhost/train:1"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hosts(world, settings, tmp_path):
    """Host sim-p runs jobs as processes, sim-c in containers (podman); the world's other hosts are down."""
    secrets = {}
    for name, runtime in (("sim-p", "process"), ("sim-c", "podman")):
        _, secret = host_token_issue(name=name)
        response = agent(secret).post("/api/v1/agent/register/", registration(name, runtime=runtime), format="json")
        assert response.status_code == 200, response.content
        secrets[name] = secret
    Host.objects.exclude(name__in=secrets).update(state="down")
    assert Host.objects.get(name="sim-c").runtime == "podman"
    root = tmp_path / "volumes"
    (root / "imagenet").mkdir(parents=True)
    volume_create(actor=world.admin, name="imagenet", host_path=str(root / "imagenet"), teams=[world.vision])
    secret_create(team=world.vision, name="WANDB_API_KEY", value="first-value", actor=world.manager)
    return secrets


def submit(world, **extra) -> Job:
    return job_submit(user=world.member, spec=JobSpec(name="t", kind="train", gpus=1, team="vision",
                                                      workload={"command": ["python", "train.py"]}, **extra))


def host_of(job: Job) -> set[str]:
    return set(Job.objects.get(pk=job.pk).allocations.values_list("gpu__host__name", flat=True))


def test_the_dispatch_carries_the_jobs_environment_and_only_the_names_of_its_secrets(world, hosts):
    job = submit(world, image=IMAGE, env={"LR": "0.1"}, secrets=["WANDB_API_KEY"], mounts=["imagenet"],
                 code={"git": {"url": "https://example.org/r.git", "ref": COMMIT}}, shm_gb=2)
    scheduler_pass()
    assert host_of(job) == {"sim-c"}
    [(host, dispatch)] = services.dispatch_messages(Job.objects.get(pk=job.pk))
    [mount] = dispatch.container.mounts
    assert host == "sim-c" and dispatch.container == ContainerSpec(
        image=IMAGE, env={"LR": "0.1"}, secrets=("WANDB_API_KEY",),
        mounts=(MountSpec(name="imagenet", source=mount.source, target="/mnt/imagenet", read_only=True),),
        code=CodeSnapshot(kind="git", url="https://example.org/r.git", ref=COMMIT, commit=COMMIT), shm_gb=2.0)
    assert mount.source.endswith("/imagenet")
    # The message round-trips; what crosses the broker names the secret and holds no value.
    assert Dispatch.from_message(dispatch.to_message()) == dispatch
    assert dispatch.to_message()["container"]["secrets"] == ["WANDB_API_KEY"]
    assert "first-value" not in json.dumps(dispatch.to_message()) and "first-value" not in repr(dispatch)
    assert "first-value" not in str(Job.objects.filter(pk=job.pk).values().get())
    assert "first-value" not in str(list(JobEvent.objects.values()))


def test_the_message_sent_to_the_broker_holds_no_secret_value(world, hosts, monkeypatch):
    job = submit(world, image=IMAGE, secrets=["WANDB_API_KEY"])
    scheduler_pass()
    sent = []
    from celery import current_app

    monkeypatch.setattr(current_app, "send_task", lambda name, **kwargs: sent.append((name, kwargs)))
    dispatch_job(job.pk)
    [(name, kwargs)] = sent
    assert name == RUN_JOB_TASK and kwargs["queue"] == host_queue("sim-c")
    payload = json.dumps(kwargs["args"])
    assert "WANDB_API_KEY" in payload and "first-value" not in payload


def fetch(secret: str, job: Job, attempt: int | None = None):
    return agent(secret).get(f"/api/v1/agent/jobs/{job.pk}/secrets/",
                             {"attempt": job.attempts if attempt is None else attempt})


def test_the_agent_of_the_placed_attempt_fetches_the_values_and_no_one_else(world, hosts, client_for):
    job, neighbour, waiting = (submit(world, image=IMAGE, secrets=["WANDB_API_KEY"]) for _ in range(3))
    scheduler_pass()  # sim-c has two GPUs: the third waits
    job.refresh_from_db()
    assert host_of(job) == host_of(neighbour) == {"sim-c"} and job.state == "placed"
    assert Job.objects.get(pk=waiting.pk).state == "queued"
    answer = fetch(hosts["sim-c"], job)
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"attempt": 1, "values": {"WANDB_API_KEY": "first-value"}}
    assert answer["Cache-Control"] == "no-store"
    # A rotated secret reaches the next fetch without editing the job.
    secret_rotate(secret=TeamSecret.objects.get(name="WANDB_API_KEY"), value="second-value", actor=world.manager)
    assert fetch(hosts["sim-c"], job).json()["values"] == {"WANDB_API_KEY": "second-value"}
    # Another host, an older or later attempt: refused, naming no value.
    for secret, attempt in ((hosts["sim-p"], None), (hosts["sim-c"], 0), (hosts["sim-c"], 2)):
        refused = fetch(secret, job, attempt)
        assert refused.status_code == 409 and "value" not in refused.content.decode(), refused.content
    # Another job: its own attempt's values to the host it is placed on; a job placed nowhere: refused.
    assert fetch(hosts["sim-c"], Job.objects.get(pk=neighbour.pk)).status_code == 200
    assert fetch(hosts["sim-c"], Job.objects.get(pk=waiting.pk)).status_code == 409
    assert agent(hosts["sim-c"]).get("/api/v1/agent/jobs/999999/secrets/", {"attempt": 1}).status_code == 409
    # No attempt, or not a number: 400 naming it. The job token, a user's token, none: 401.
    assert agent(hosts["sim-c"]).get(f"/api/v1/agent/jobs/{job.pk}/secrets/").json()["attempt"]
    assert agent(hosts["sim-c"]).get(f"/api/v1/agent/jobs/{job.pk}/secrets/", {"attempt": "x"}).status_code == 400
    from rest_framework.test import APIClient

    for header in (f"Job {attempt_token(job.pk, job.attempts)}", "Host not-a-token", ""):
        client = APIClient()
        if header:
            client.credentials(HTTP_AUTHORIZATION=header)
        assert client.get(f"/api/v1/agent/jobs/{job.pk}/secrets/", {"attempt": 1}).status_code == 401, header
    assert client_for(world.member).get(f"/api/v1/agent/jobs/{job.pk}/secrets/", {"attempt": 1}).status_code in (
        401, 403)


def test_a_process_jobs_secrets_go_only_to_a_host_that_runs_it_under_its_own_uid(world, hosts):
    job = submit(world, secrets=["WANDB_API_KEY"])
    scheduler_pass()
    assert Job.objects.get(pk=job.pk).pending_reason.startswith("no host runs jobs under a uid of their own")
    Job.objects.filter(pk=job.pk).update(state="placed", attempts=1)  # as a stale registration would have it
    GPU.objects.filter(host__name="sim-p", index=0).first().allocations.create(job=job)
    refused = fetch(hosts["sim-p"], Job.objects.get(pk=job.pk))
    assert refused.status_code == 409 and "uid of its own" in refused.json()["detail"]
    Host.objects.filter(name="sim-p").update(job_isolation="own-uid")
    assert fetch(hosts["sim-p"], Job.objects.get(pk=job.pk)).json()["values"] == {"WANDB_API_KEY": "first-value"}


def test_a_finished_job_s_secrets_are_refused(world, hosts):
    job = submit(world, image=IMAGE, secrets=["WANDB_API_KEY"])
    scheduler_pass()
    report = agent(hosts["sim-c"]).post(f"/api/v1/agent/jobs/{job.pk}/status/", {"state": "running", "attempt": 1},
                                        format="json")
    assert report.status_code == 200, report.content
    assert fetch(hosts["sim-c"], Job.objects.get(pk=job.pk)).status_code == 200  # running: still its agent's
    ended = agent(hosts["sim-c"]).post(f"/api/v1/agent/jobs/{job.pk}/status/",
                                       {"state": "succeeded", "attempt": 1, "exit_code": 0}, format="json")
    assert ended.status_code == 200 and Job.objects.get(pk=job.pk).state == "succeeded"
    refused = fetch(hosts["sim-c"], Job.objects.get(pk=job.pk))
    assert refused.status_code == 409 and "first-value" not in refused.content.decode()


def test_a_secret_deleted_after_placement_is_refused_by_name(world, hosts):
    job = submit(world, image=IMAGE, secrets=["WANDB_API_KEY"])
    scheduler_pass()
    secret_delete(secret=TeamSecret.objects.get(name="WANDB_API_KEY"), actor=world.manager)
    refused = fetch(hosts["sim-c"], Job.objects.get(pk=job.pk))
    assert refused.status_code == 400 and "WANDB_API_KEY" in str(refused.json()["secrets"]), refused.content


def test_a_job_without_an_image_runs_as_before_on_any_host(world, hosts):
    jobs = [submit(world) for _ in range(4)]  # sim-p and sim-c have 2 GPUs each
    scheduler_pass()
    assert set().union(*(host_of(job) for job in jobs)) == {"sim-p", "sim-c"}
    [(_, dispatch)] = services.dispatch_messages(Job.objects.get(pk=jobs[0].pk))
    assert dispatch.container == ContainerSpec()


def test_image_jobs_wait_for_container_hosts_and_say_why(world, hosts):
    Host.objects.filter(name="sim-c").update(state="down")
    job = submit(world, image=IMAGE)
    scheduler_pass()
    job.refresh_from_db()
    assert job.state == "queued" and "no host runs containers" in job.pending_reason
    # The rule holds under the placement's row locks too: a process host's GPU is refused.
    gpu = GPU.objects.get(host__name="sim-p", index=0)
    assert services.job_place(job.pk, (gpu.pk,)) is False
    Host.objects.filter(name="sim-c").update(state="up")
    scheduler_pass()
    assert host_of(job) == {"sim-c"}


def test_a_secret_deleted_after_submission_fails_the_job_at_dispatch(world, hosts):
    job = submit(world, image=IMAGE, secrets=["WANDB_API_KEY"])
    secret_delete(secret=TeamSecret.objects.get(name="WANDB_API_KEY"), actor=world.manager)
    scheduler_pass()  # places it; the dispatch after commit finds the secret gone
    dispatch_job(job.pk)
    job.refresh_from_db()
    assert job.state == "failed" and "secrets" in job.failure_reason and "WANDB_API_KEY" in job.failure_reason


def test_the_backend_that_ran_the_attempt_is_shown(world, hosts, client_for):
    job = submit(world, image=IMAGE)
    plain = submit(world)
    scheduler_pass()
    reports = {job.pk: {"backend": "podman", "image": f"{IMAGE}@sha256:{'b' * 64}"}, plain.pk: {}}
    for pk, details in reports.items():
        [host] = host_of(Job.objects.get(pk=pk))
        response = agent(hosts[host]).post(f"/api/v1/agent/jobs/{pk}/status/",
                                           {"state": "running", "attempt": 1, "details": {"host": host, **details}},
                                           format="json")
        assert response.status_code == 200 and response.json()["accepted"], response.content
    shown = client_for(world.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert (shown["backend"], shown["resolved_image"]) == ("podman", f"{IMAGE}@sha256:{'b' * 64}")
    assert client_for(world.member).get(f"/api/v1/jobs/{plain.pk}/").json()["backend"] == "process"
    running = JobEvent.objects.get(job=job, to_state="running")
    assert running.data["backend"] == "podman"
    from django.test import Client

    page = Client()
    page.force_login(world.member)
    html = page.get(f"/jobs/{job.pk}/").content.decode()
    assert "backend podman" in html and f"{IMAGE}@sha256:" in html

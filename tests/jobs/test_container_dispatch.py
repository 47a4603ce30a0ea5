"""A job with an image: placed only on hosts that run containers, dispatched with its ContainerSpec (secret values
read at dispatch, never stored), and shown with the backend that ran it."""

from __future__ import annotations

import pytest

from apps.accounts.models import TeamSecret
from apps.accounts.secrets import secret_create, secret_delete, secret_rotate
from apps.cluster.models import GPU, Host
from apps.cluster.services import host_token_issue
from apps.cluster.volumes import volume_create
from apps.jobs import services
from apps.jobs.dispatch import dispatch_job
from apps.jobs.models import Job, JobEvent
from apps.jobs.scheduler import scheduler_pass
from apps.jobs.services import JobSpec, job_submit
from tests.cluster.test_agent_api import agent, registration
from workers.protocol import CodeSnapshot, ContainerSpec, Dispatch, MountSpec

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


def test_the_dispatch_carries_the_jobs_environment_with_secrets_read_then(world, hosts):
    job = submit(world, image=IMAGE, env={"LR": "0.1"}, secrets=["WANDB_API_KEY"], mounts=["imagenet"],
                 code={"git": {"url": "https://example.org/r.git", "ref": COMMIT}}, shm_gb=2)
    scheduler_pass()
    assert host_of(job) == {"sim-c"}
    [(host, dispatch)] = services.dispatch_messages(Job.objects.get(pk=job.pk))
    [mount] = dispatch.container.mounts
    assert host == "sim-c" and dispatch.container == ContainerSpec(
        image=IMAGE, env={"LR": "0.1"}, secrets={"WANDB_API_KEY": "first-value"},
        mounts=(MountSpec(name="imagenet", source=mount.source, target="/mnt/imagenet", read_only=True),),
        code=CodeSnapshot(kind="git", url="https://example.org/r.git", ref=COMMIT, commit=COMMIT), shm_gb=2.0)
    assert mount.source.endswith("/imagenet")
    # The message round-trips, and neither the dispatch's repr nor the job's rows hold the value.
    assert Dispatch.from_message(dispatch.to_message()) == dispatch
    assert "first-value" not in repr(dispatch)
    assert "first-value" not in str(Job.objects.filter(pk=job.pk).values().get())
    assert "first-value" not in str(list(JobEvent.objects.values()))
    # A rotated secret reaches the next dispatch without editing the job.
    secret_rotate(secret=TeamSecret.objects.get(name="WANDB_API_KEY"), value="second-value", actor=world.manager)
    [(_, again)] = services.dispatch_messages(Job.objects.get(pk=job.pk))
    assert again.container.secrets == {"WANDB_API_KEY": "second-value"}


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

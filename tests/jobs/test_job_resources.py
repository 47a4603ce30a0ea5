"""A job's CPUs and memory (`cpus`, `memory_gb`): what it asks for or the per-GPU defaults, refused past what its
hosts can give, shown in the API, sent to each host in the dispatch, and what the host applied in runtime_info."""

from __future__ import annotations

from datetime import timedelta
from unittest.mock import patch

import pytest
from django.test import override_settings
from django.utils import timezone

from apps.cluster.models import GPU, Host
from apps.cluster.services import host_register
from apps.jobs import services
from apps.jobs.dispatch import RELEASED_LATELY_S
from apps.jobs.models import Job, JobEvent
from apps.quotas.models import TeamQuota
from tests.conftest import train_spec
from workers.protocol import PROTOCOL_VERSION, JobStatus


def submit(client, **overrides):
    return client.post("/api/v1/jobs/", train_spec(**overrides), format="json")


def test_asked_cpus_and_memory_are_kept_and_shown(world, client_for):
    client = client_for(world.member)
    response = submit(client, cpus=2.5, memory_gb=0.25)
    assert response.status_code == 201, response.content
    assert (response.json()["cpus"], response.json()["memory_gb"]) == (2.5, 0.25)
    job = Job.objects.get()
    assert (job.cpus, job.memory_gb) == (2.5, 0.25)
    shown = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert (shown["cpus"], shown["memory_gb"]) == (2.5, 0.25)


@pytest.mark.parametrize(("gpus", "cpus", "memory_gb"), [
    (1, 4, 32), (3, 12, 96), (0.5, 2, 16), (0.25, 1, 8), (0.1, 1, 4),  # fractions: at least 1 CPU and 4 GB
])
def test_defaults_are_per_gpu_with_a_floor(world, client_for, gpus, cpus, memory_gb):
    response = submit(client_for(world.member), gpus=gpus)
    assert response.status_code == 201, response.content
    assert (response.json()["cpus"], response.json()["memory_gb"]) == (cpus, memory_gb)


@override_settings(JOBS_CPUS_PER_GPU=0.5, JOBS_MEMORY_GB_PER_GPU=6)
def test_defaults_follow_the_admins_settings(world, client_for):
    response = submit(client_for(world.member), gpus=4)
    assert (response.json()["cpus"], response.json()["memory_gb"]) == (2, 24)
    response = submit(client_for(world.member), gpus=1)
    assert (response.json()["cpus"], response.json()["memory_gb"]) == (1, 6)  # the floor: 1 CPU


BAD = [("cpus", 0), ("cpus", -1), ("cpus", "nan"), ("cpus", "inf"), ("cpus", "many"), ("cpus", 5000),
       ("cpus", [2]), ("memory_gb", 0), ("memory_gb", -0.5), ("memory_gb", "NaN"), ("memory_gb", "-inf"),
       ("memory_gb", 10**6), ("gpu_memory_gb", "nan")]


@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}-{v}" for f, v in BAD])
def test_bad_values_are_a_400_naming_the_field(world, client_for, field, value):
    response = submit(client_for(world.member), **{field: value})
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Job.objects.exists() and not JobEvent.objects.exists()


def _hosts_report(cpus: int, memory_mb: int) -> None:
    Host.objects.filter(name__in=["node-a", "node-b"]).update(cpus=cpus, memory_mb=memory_mb)
    TeamQuota.objects.filter(team__slug="vision").update(max_gpus=16)  # room for a gang over both hosts


@pytest.mark.parametrize(("spec", "field"), [
    ({"gpus": 1, "cpus": 17}, "cpus"),
    ({"gpus": 1, "memory_gb": 65}, "memory_gb"),
    ({"gpus": 16, "cpus": 33}, "cpus"),  # a gang over both 8-GPU hosts: 2 × 16 CPUs at most
    ({"gpus": 1, "gpu_type": "H200", "cpus": 16.5}, "cpus"),
])
def test_more_than_the_hosts_have_is_a_400(world, client_for, spec, field):
    _hosts_report(cpus=16, memory_mb=64 * 1024)
    client = client_for(world.admin)
    response = client.post("/api/v1/jobs/", train_spec(**spec), format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]
    assert "the largest" in response.json()[field][0]
    assert not Job.objects.exists()


def test_what_the_hosts_have_is_granted_and_defaults_are_capped_by_it(world, client_for):
    _hosts_report(cpus=16, memory_mb=64 * 1024)
    client = client_for(world.admin)
    assert submit(client, gpus=16, cpus=32, memory_gb=128).status_code == 201
    response = submit(client, gpus=8)  # 8 × 4 CPUs, 8 × 32 GB by default: more than one host has
    assert (response.json()["cpus"], response.json()["memory_gb"]) == (16, 64)


def test_unknown_host_capacity_refuses_nothing_below_the_absolute_bounds(world, client_for):
    assert submit(client_for(world.member), cpus=4096, memory_gb=65536).status_code == 201


def test_a_gangs_cpus_and_memory_are_split_between_its_hosts_by_gpus(world, client_for):
    response = submit(client_for(world.admin), gpus=4, cpus=6, memory_gb=10)
    job = Job.objects.get(pk=response.json()["id"])
    a = [gpu.pk for gpu in GPU.objects.filter(host__name="node-a").order_by("index")[:3]]
    b = [gpu.pk for gpu in GPU.objects.filter(host__name="node-b").order_by("index")[:1]]
    assert services.job_place(job.pk, tuple(a + b))
    messages = dict(services.dispatch_messages(Job.objects.get(pk=job.pk)))
    assert (messages["node-a"].cpus, messages["node-a"].memory_gb) == (4.5, 7.5)
    assert (messages["node-b"].cpus, messages["node-b"].memory_gb) == (1.5, 2.5)
    assert messages["node-a"].to_message()["cpus"] == 4.5


def test_a_one_host_job_gets_all_of_it(world, client_for):
    response = submit(client_for(world.member), gpus=0.25, cpus=0.5, memory_gb=0.25)
    job = Job.objects.get(pk=response.json()["id"])
    assert services.job_place(job.pk, (world.gpus[0].pk,), share_units=25)
    [(host, message)] = services.dispatch_messages(Job.objects.get(pk=job.pk))
    assert (message.cpus, message.memory_gb) == (0.5, 0.25)


def test_the_running_report_records_the_limits_applied(world, client_for):
    response = submit(client_for(world.member), cpus=2, memory_gb=4)
    job = Job.objects.get(pk=response.json()["id"])
    assert services.job_place(job.pk, (world.gpus[0].pk,))
    limits = {"applied": True, "cgroup": "v1", "cpus": 2.0, "memory_gb": 4.0, "pids": 4096, "devices": "x" * 400,
              "extra": {"nested": 1}, "reason": ["not", "a", "string"]}
    services.job_report_status(host=world.gpus[0].host, job_id=job.pk,
                               status=JobStatus("running", 1, details={"host": "node-a", "limits": limits}))
    info = Job.objects.get(pk=job.pk).runtime_info["limits"]
    assert info == {"applied": True, "cgroup": "v1", "cpus": 2.0, "memory_gb": 4.0, "pids": 4096,
                    "devices": "x" * 300}


def test_registration_records_the_hosts_cpus_and_memory(world):
    host = world.gpus[0].host

    def register(**extra) -> Host:
        return host_register(host, {"protocol": PROTOCOL_VERSION, "host": host.name, "gpus": [], **extra})

    assert (register(cpus=64, memory_mb=512 * 1024).cpus, Host.objects.get(pk=host.pk).memory_mb) == (64, 512 * 1024)
    for bad in ("64", -1, True, 10**30, None):
        assert register(cpus=bad, memory_mb=bad).cpus == 0
        assert Host.objects.get(pk=host.pk).memory_mb == 0


def test_a_dispatch_names_the_jobs_that_held_its_gpus_until_a_moment_ago(world, client_for):
    member = client_for(world.member)
    cancelled = Job.objects.get(pk=submit(member).json()["id"])
    assert services.job_place(cancelled.pk, (world.gpus[0].pk,))
    services.job_cancel(job=cancelled, actor=world.member)  # its GPU is free at once; it still stops on its host
    elsewhere = Job.objects.get(pk=submit(member).json()["id"])
    assert services.job_place(elsewhere.pk, (world.gpus[1].pk,))
    services.job_cancel(job=elsewhere, actor=world.member)
    following = Job.objects.get(pk=submit(member).json()["id"])
    assert services.job_place(following.pk, (world.gpus[0].pk,))
    [(_, message)] = services.dispatch_messages(Job.objects.get(pk=following.pk))
    assert message.after == ((cancelled.pk, 1),)  # not the job of another GPU
    later = timezone.now() + timedelta(seconds=RELEASED_LATELY_S + 1)
    with patch("apps.jobs.dispatch.timezone.now", return_value=later):
        [(_, message)] = services.dispatch_messages(Job.objects.get(pk=following.pk))
    assert message.after == ()

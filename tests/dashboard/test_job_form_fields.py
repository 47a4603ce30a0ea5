"""The job form takes what the API takes (issue 18): fractional GPUs, memory on one GPU, CPUs and host memory,
checked by the API's own serializer, and refused with field errors (400), never a 500."""

from __future__ import annotations

import pytest

from apps.jobs.models import Job
from tests.dashboard.test_jobs import form_data


def test_the_form_offers_the_apis_fields_with_a_default_workload(world, web):
    response = web(world.member).get("/jobs/new/")
    form = response.context["form"]
    for name in ("gpus", "gpu_memory_gb", "gpu_type", "priority", "preset", "builtin", "params", "command",
                 "time_limit_minutes", "max_steps", "max_retries", "cpus", "memory_gb", "image", "env", "secrets",
                 "mounts", "code_snapshot", "git_url", "git_ref", "shm_gb"):
        assert f'name="{name}"' in response.content.decode(), name
    assert form["builtin"].value() == "mlp-digits"  # a first job needs no choice


def test_fractional_gpus_cpus_memory_and_the_rest_reach_the_job(world, web):
    response = web(world.member).post("/jobs/new/", form_data(
        gpus="0.5", cpus="2.5", memory_gb="12", gpu_type="H200", priority="low", max_steps="300",
        time_limit_minutes="45", env="EPOCHS=3\nLR=1e-3", params='{"epochs": 2, "hidden": 64}'))
    assert response.status_code == 302, response.context["form"].errors
    job = Job.objects.get()
    assert (float(job.gpus_requested), job.cpus, job.memory_gb, job.gpu_type, job.priority) == (
        0.5, 2.5, 12.0, "H200", "low")
    assert (job.max_steps, job.time_limit_minutes, job.env) == (300, 45, {"EPOCHS": "3", "LR": "1e-3"})
    assert job.workload == {"builtin": "mlp-digits", "params": {"epochs": 2, "hidden": 64}}


def test_memory_on_one_gpu_is_a_share_of_it(world, web):
    response = web(world.member).post("/jobs/new/", form_data(gpus="1", gpu_memory_gb="20"))
    assert response.status_code == 302, response.context["form"].errors
    assert Job.objects.get().gpu_memory_mb == 20 * 1024


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"gpus": "1.5"}, "gpus", "Fractions are for a part of one GPU"),  # the API's serializer says so
        ({"gpus": "2", "gpu_memory_gb": "10"}, "gpu_memory_gb", "use gpus ≤ 1"),
        ({"cpus": "0"}, "cpus", "greater than 0"),
        ({"cpus": "1e9"}, "cpus", "less than or equal to"),
        ({"memory_gb": "lots"}, "memory_gb", "Enter a number"),
        ({"gpus": "0.001"}, "gpus", "decimal places"),
    ],
)
def test_what_the_api_refuses_the_form_refuses_on_the_field(world, web, overrides, field, fragment):
    response = web(world.member).post("/jobs/new/", form_data(**overrides))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert any(fragment in message for message in errors.get(field, [])), errors
    assert not Job.objects.exists()

"""Rows → the core's dataclasses, and the core's placeability rule read through them (no policy involved)."""

from __future__ import annotations

import time

from apps.cluster.models import GPU, Host
from apps.jobs.models import Job
from apps.jobs.scheduling_rows import candidate, gpu_view, pending_job
from apps.scheduling.placeability import placement_refusal
from tests.dashboard.conftest import make_job


def test_a_job_row_as_the_core_sees_it(world):
    job = make_job(world.vision, world.member, gpu_share_units=25, gpu_memory_mb=10_000, gpu_type="H200")
    job = Job.objects.select_related("team", "user").get(pk=job.pk)
    view = pending_job(job, now=time.time())
    assert (view.job_id, view.team, view.user, view.gpus, view.gpu_share, view.gpu_memory_mb, view.gpu_type) == (
        job.pk, "vision", "mia", 1, 0.25, 10_000, "H200")
    assert view.similarity_key == "builtin:mlp-digits"
    assert view.submitted_at == job.created_at.timestamp()


def test_placeability_of_gpu_rows(world):
    job = Job.objects.select_related("team", "user").get(
        pk=make_job(world.vision, world.member, gpu_share_units=50).pk)
    view = pending_job(job, now=time.time())
    gpu = GPU.objects.select_related("host").get(pk=world.gpus[0].pk)
    assert gpu_view(gpu).memory_mb == gpu.memory_mb
    assert placement_refusal(view, [candidate(gpu, 50)], 50) is None
    assert "of a GPU free" in placement_refusal(view, [candidate(gpu, 75)], 50)
    GPU.objects.filter(pk=gpu.pk).update(health=GPU.Health.HOT)
    gpu = GPU.objects.select_related("host").get(pk=gpu.pk)
    assert "takes no new jobs" in placement_refusal(view, [candidate(gpu, 0)], 50)
    Host.objects.filter(pk=gpu.host_id).update(state=Host.State.DOWN)
    gpu = GPU.objects.select_related("host").get(pk=gpu.pk)
    assert "its host takes no new jobs" in placement_refusal(view, [candidate(gpu, 0)], 50)

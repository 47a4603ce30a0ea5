"""A job's record shows the GPUs of one attempt: those it holds, or its last attempt's once it ended."""

from __future__ import annotations

from django.test import Client

from apps.cluster.models import GPU
from apps.jobs import services
from apps.jobs.models import JobAllocation
from apps.jobs.services import JobSpec, job_submit


def test_a_finished_job_shows_its_last_attempts_gpus_only(world, client_for):
    job = job_submit(user=world.member, spec=JobSpec(name="a", kind="train", gpus=2, team="vision",
                                                      workload={"builtin": "mlp-digits"}))
    first = tuple(GPU.objects.filter(host__name="node-a", index__in=(0, 1)).values_list("pk", flat=True))
    second = tuple(GPU.objects.filter(host__name="node-b", index__in=(4, 5)).values_list("pk", flat=True))
    assert services.job_place(job.pk, first)
    assert services.job_preempt(job.pk, "make room")  # placed, not started: back in the queue at once
    assert services.job_place(job.pk, second)
    assert services.job_mark_running(job.pk)
    assert services.job_finish(job.pk, succeeded=True, exit_code=0, reason="exited with code 0")
    assert sorted(JobAllocation.objects.filter(job=job).values_list("attempt", flat=True)) == [1, 1, 2, 2]
    detail = client_for(world.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["state"] == "succeeded" and detail["attempts"] == 2
    assert sorted((a["host"], a["index"], a["attempt"]) for a in detail["allocations"]) == [
        ("node-b", 4, 2), ("node-b", 5, 2)]
    browser = Client()
    browser.force_login(world.member)
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    placed = page[page.index('id="job-placed"'):].split("</dd>")[0]
    assert "node-b:4" in placed and "node-a" not in placed

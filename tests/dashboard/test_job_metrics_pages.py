"""The job page embeds the job's stored metrics (drawn on load, no live report needed), its progress percent,
ETA and GPU summary; the compare page puts one metric of several visible runs on one chart."""

from __future__ import annotations

import json
import re

from django.db import transaction

from apps.jobs.metrics import record_metrics
from apps.jobs.models import Job
from apps.telemetry.models import JobGpuStats
from tests.dashboard.conftest import make_job
from workers.protocol import TrainingProgress


def report(job: Job, steps: range, **own: float) -> None:
    with transaction.atomic():
        record_metrics(job, 1, [TrainingProgress(step=s, loss=1.0 / (s + 1), steps_per_s=4.0, metrics=dict(own))
                                for s in steps])


def embedded(html: str, element_id: str) -> dict:
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', html, re.S)
    assert match, f"no {element_id} in the page"
    return json.loads(match.group(1))


def test_the_job_page_embeds_stored_metrics_progress_eta_and_the_gpu_summary(world, web):
    job = make_job(world.vision, world.member, state=Job.State.RUNNING, name="resnet", max_steps=200,
                   steps_done=50, steps_per_second=5.0)
    report(job, range(1, 51), val_acc=0.5)
    JobGpuStats.objects.create(job=job, samples=4, utilization_sum=300.0, utilization_max=90.0, memory_max_mb=2048,
                               energy_j=7200.0)
    html = web(world.viewer).get(f"/jobs/{job.pk}/").content.decode()
    metrics = embedded(html, "job-metrics")
    assert {s["name"]: len(s["values"]) for s in metrics["series"]} == {"loss": 50, "steps_per_s": 50,
                                                                        "val_acc": 50}
    assert '<span id="job-progress">25.0 % (50 of 200 steps)</span>' in html
    assert '<span id="job-eta">about 30 s left</span>' in html  # 150 steps at 5 steps/s
    assert '<dd id="gpu-util-mean">75.0 %</dd>' in html and '<dd id="gpu-util-max">90.0 %</dd>' in html
    assert '<dd id="gpu-mem-max">2.0 GiB</dd>' in html and '<dd id="gpu-energy">2.0 Wh</dd>' in html


def test_the_gpu_summary_is_served_to_those_who_see_the_job(world, client_for):
    job = make_job(world.vision, world.member, state=Job.State.SUCCEEDED, name="done")
    fresh = make_job(world.vision, world.member, name="fresh")
    JobGpuStats.objects.create(job=job, samples=4, utilization_sum=300.0, utilization_max=90.0, memory_max_mb=2048,
                               energy_j=7200.0)
    assert client_for(world.viewer).get(f"/api/v1/jobs/{job.pk}/gpu-summary/").json() == {
        "samples": 4, "utilization_mean": 75.0, "utilization_max": 90.0, "memory_max_mb": 2048, "energy_wh": 2.0}
    assert client_for(world.other).get(f"/api/v1/jobs/{job.pk}/gpu-summary/").status_code == 404
    assert client_for(world.viewer).get(f"/api/v1/jobs/{fresh.pk}/gpu-summary/").status_code == 404


def test_a_job_without_reports_says_so(world, web):
    job = make_job(world.vision, world.member, name="fresh")
    html = web(world.member).get(f"/jobs/{job.pk}/").content.decode()
    assert embedded(html, "job-metrics")["series"] == []
    assert 'id="metrics-empty">No progress reported yet.' in html
    assert "No GPU samples recorded for this job yet." in html


def test_compare_puts_one_metric_of_visible_runs_on_one_chart(world, web):
    first = make_job(world.vision, world.member, state=Job.State.SUCCEEDED, name="lr-0.1")
    second = make_job(world.vision, world.member2, state=Job.State.SUCCEEDED, name="lr-0.01")
    foreign = make_job(world.nlp, world.other, state=Job.State.SUCCEEDED, name="theirs")
    report(first, range(0, 30), val_acc=0.7)
    report(second, range(0, 20))
    page = web(world.viewer).get(f"/jobs/compare/?ids={first.pk},{second.pk}&metric=val_acc")
    assert page.status_code == 200
    data = embedded(page.content.decode(), "compare-data")
    assert data["metric"] == "val_acc" and [r["job"] for r in data["runs"]] == [first.pk, second.pk]
    assert len(data["runs"][0]["series"]["values"]) == 30 and data["runs"][1]["series"] is None
    assert "no val_acc reported" in page.content.decode()
    assert web(world.viewer).get(f"/jobs/compare/?ids={first.pk},{foreign.pk}").status_code == 404
    assert web(world.other).get(f"/jobs/compare/?ids={first.pk}").status_code == 404
    bad = web(world.viewer).get("/jobs/compare/?ids=1,x&metric=no%20spaces")
    assert bad.status_code == 400
    assert b'id="compare-ids-error"' in bad.content and b'id="compare-metric-error"' in bad.content

"""The console in a real browser: log in, submit a job through the form, find it, cancel it; viewers get no controls."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.cluster.models import GPU
from apps.jobs.models import Job, JobLogChunk
from apps.telemetry.models import GpuSampleBucket
from tests.dashboard.conftest import hold, make_job
from tests.factories import HostFactory, add_gpus

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_member_logs_in_submits_finds_and_cancels_a_job(world, page_for, artifacts, settings, tmp_path):
    settings.ARTIFACT_STORE_URL = tmp_path.as_uri()  # not the development store under var/
    page = page_for(None)
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill("mia")
    page.get_by_label("Password").fill("pw-for-tests-123")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Jobs").click()
    page.get_by_role("link", name="Submit a job").click()
    page.get_by_label("Name", exact=True).fill("browser-digits")
    page.get_by_label("Preset").select_option("amp-bf16")
    assert "Automatic mixed precision" in page.locator("#preset-description").inner_text()
    page.get_by_label("Built-in workload", exact=True).select_option("mlp-digits")
    page.get_by_label("Workload parameters (JSON object)").fill('{"epochs": 1}')
    page.get_by_label("Time limit (minutes)").fill("15")
    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url("**/jobs/*/")
    job = Job.objects.get(name="browser-digits")
    assert page.url.endswith(f"/jobs/{job.pk}/")
    assert page.locator("#job-state").inner_text() == "queued"
    assert f"Job {job.pk} submitted." in page.locator(".messages").inner_text()

    page.get_by_role("link", name="Jobs").first.click()
    page.get_by_role("link", name="browser-digits").click()
    page.wait_for_url(f"**/jobs/{job.pk}/")
    page.screenshot(path=str(artifacts / "job-page.png"), full_page=True)
    page.get_by_label("Reason (optional)").fill("just testing")
    page.once("dialog", lambda dialog: dialog.accept())  # the confirm step (apps/dashboard/confirm.py)
    page.get_by_role("button", name="Cancel job").click()
    page.wait_for_url(f"**/jobs/{job.pk}/")
    assert page.locator("#job-state").inner_text() == "cancelled"
    assert page.locator("#cancel-button").count() == 0
    assert "cancelled by mia: just testing" in page.locator("#job-events").inner_text()
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED


def test_form_errors_show_next_to_fields_and_nothing_is_created(world, page_for):
    page = page_for(world.member)
    page.goto("/jobs/new/")
    page.get_by_label("Name", exact=True).fill("bad")
    page.get_by_label("GPUs", exact=True).fill("9")
    page.get_by_label("Built-in workload", exact=True).select_option("mlp-digits")
    page.get_by_label("Workload parameters (JSON object)").fill('{"epochs": "two"}')
    page.get_by_role("button", name="Submit", exact=True).click()
    assert "at most 8 GPUs" in page.locator("#id_gpus_error").inner_text()
    assert "epochs: must be an integer" in page.locator("#id_params_error").inner_text()
    assert not Job.objects.exists()
    page.get_by_role("radio", name="command").check()  # the radio switches the command field in
    assert page.get_by_label("Command", exact=True).is_visible()
    assert not page.get_by_label("Built-in workload", exact=True).is_visible()


def test_viewer_sees_no_submit_or_cancel_controls(world, page_for):
    job = make_job(world.vision, world.member, name="someone-elses")
    page = page_for(world.viewer)
    page.goto("/jobs/")
    assert page.get_by_role("link", name="someone-elses").is_visible()
    assert page.get_by_role("link", name="Submit a job").count() == 0
    page.goto(f"/jobs/{job.pk}/")
    assert page.locator("#job-state").inner_text() == "queued"
    assert page.get_by_role("button", name="Cancel job").count() == 0
    response = page.goto("/jobs/new/")
    assert response.status == 403
    assert page.locator("form#job-form").count() == 0


def test_overview_renders_and_degrades_without_websocket(world, page_for, artifacts):
    host = HostFactory(name="node-c", simulated=False)
    add_gpus(host, 4, gpu_type="A100", memory_mb=81920)
    hot = GPU.objects.get(uuid="GPU-node-a-3")
    hot.health = GPU.Health.HOT
    hot.save()
    now = timezone.now()
    running = make_job(world.vision, world.member, state=Job.State.RUNNING, gpus=2, name="resnet")
    hold(running, world.gpus[:2], now - timedelta(minutes=8))
    other = make_job(world.nlp, world.other, state=Job.State.RUNNING, gpus=1, name="bert")
    hold(other, world.gpus[8:9], now - timedelta(minutes=8))
    make_job(world.vision, world.member2, name="waiting")
    JobLogChunk.objects.create(job=running, offset=0, data="step 10 loss 1.2\n")
    buckets = []
    for gpu in world.gpus[:9]:
        for k in range(30):
            util = 30 + (k * 7 + gpu.index * 13) % 70 if gpu.index < 2 or gpu.host.name == "node-b" else 5
            buckets.append(GpuSampleBucket(gpu=gpu, resolution_s=10, bucket_start=now - timedelta(seconds=10 * (30 - k)),
                                           samples=10, available_samples=10, utilization_avg=util,
                                           memory_used_max_mb=20000 + 100 * k, memory_total_mb=143771,
                                           temperature_max=45 + util / 3, power_avg_w=120 + util * 5))
    GpuSampleBucket.objects.bulk_create(buckets)
    page = page_for(world.member)
    page.goto("/")
    assert page.locator("li.gpu").count() == 20
    assert page.locator(".badge", has_text="simulated").count() == 2  # node-a and node-b, not node-c
    assert page.locator("#t-busy").inner_text() == "3"
    assert page.get_by_role("link", name=f"job {running.pk}").count() == 2
    assert page.get_by_role("link", name=f"job {other.pk}").count() == 0  # another team's job: no link
    foreign = page.get_by_label("node-b GPU 0").inner_text()
    assert "another team's job" in foreign and "nlp" not in foreign  # as the live stream shows it
    assert page.locator("li.gpu", has_text="no data").count() == 11
    page.wait_for_function("document.getElementById('live-status').dataset.state === 'off'")
    assert "unavailable" in page.locator("#live-status").inner_text()
    page.screenshot(path=str(artifacts / "overview.png"), full_page=True)
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"


def test_admin_pages_render_without_script_errors(world, page_for, artifacts):
    from apps.quotas.models import QuotaRequest
    from apps.telemetry.models import JobGpuStats

    start = timezone.now() - timedelta(hours=3)
    for n, team, user in ((0, world.vision, world.member), (1, world.nlp, world.other)):
        job = make_job(team, user, state=Job.State.SUCCEEDED, gpus=2, name=f"done-{n}")
        hold(job, world.gpus[2 * n:2 * n + 2], start, start + timedelta(hours=2))
        JobGpuStats.objects.create(job=job, samples=10, utilization_sum=10 * (35 + 50 * n), utilization_max=99)
    QuotaRequest.objects.create(team=world.vision, requested_by=world.manager, max_gpus=16, reason="deadline")
    page = page_for(world.admin)
    page.goto("/reports/usage/")
    assert page.locator("#by-team tbody tr").count() == 2
    assert page.locator("#id_start").input_value().endswith("-01")  # the default period: this month
    page.screenshot(path=str(artifacts / "usage-report.png"), full_page=True)
    page.goto("/teams/vision/")
    page.get_by_role("button", name="Approve").click()
    assert "approved" in page.locator(".messages").inner_text()
    page.goto("/alerts/")
    page.goto("/accounts/tokens/")
    page.get_by_label("Name").fill("ci")
    page.get_by_role("button", name="Create").click()
    assert page.locator("#new-token").input_value().startswith("gpc")
    page.get_by_role("button", name="Copy").click()
    page.get_by_role("button", name="Copied").wait_for()

"""Issue 18 in a real browser: the overview's history charts (range picker, live append), the host page and the GPU
page draw stored history, at 1280 and 390 px, without JavaScript errors or sideways scrolling."""

from __future__ import annotations

import re
import time

import pytest

from apps.cluster.models import Host
from apps.jobs.models import Job, JobAllocation
from apps.telemetry import history, services

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
WIDTHS = (1280, 390)


def _ingest(start: float, seconds: int, util: float) -> None:
    host = Host.objects.get(name="node-a")
    for k in range(seconds):
        services.ingest_batch(host, {"gpus": [
            {"uuid": f"GPU-node-a-{i}", "ts": start + k, "available": True, "utilization_pct": util,
             "memory_used_mb": 2048, "memory_total_mb": 143771, "temperature_c": 45, "power_w": 150.0}
            for i in range(2)]})
    services.flush_buckets(everything=True)


@pytest.fixture
def recorded(world):
    job = Job.objects.create(name="resnet", team=world.vision, user=world.member, gpus=1, preset="baseline-fp32",
                             workload={"builtin": "mlp-digits"}, time_limit_minutes=60)
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING)
    JobAllocation.objects.create(job=job, gpu=world.gpus[1])
    services.forget_host_maps()
    _ingest(time.time() - 120, 30, 40.0)
    history.snapshot_cluster()
    return job


def _legend(page, chart: str):
    return page.locator(f'section.history figure[data-chart="{chart}"] .chart-legend')


def _no_sideways_scroll(page) -> None:
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")


def test_overview_history_range_picker_and_live_append(world, recorded, page_for, artifacts):
    for width in WIDTHS:
        page = page_for(world.member)
        page.set_viewport_size({"width": width, "height": 900})
        page.clock.install()
        page.goto("/")
        legend = _legend(page, "utilization")
        legend.filter(has_text=re.compile(r"mean: (4|9)0\.0 %")).wait_for()  # 90: the live tick below came first
        _legend(page, "gpus").filter(has_text="allocated: 1").wait_for()
        _legend(page, "team").first.filter(has_text="held: 1").wait_for()
        status = page.locator("section.history .history-status")
        assert "10-second buckets, updating live" in status.inner_text()
        _no_sideways_scroll(page)
        page.screenshot(path=str(artifacts / f"overview-history-{width}.png"), full_page=True)
        if width == WIDTHS[0]:
            _ingest(time.time() - 30, 12, 90.0)  # newer buckets: the next live tick appends them
            page.clock.fast_forward(11_000)
            legend.filter(has_text="mean: 90.0 %").wait_for()
            page.get_by_role("button", name="7 d").click()
            page.locator("section.history .history-status", has_text="60-second buckets").wait_for()
            page.locator('input[name="from"]').fill("2020-01-01T00:00")
            page.get_by_role("button", name="Show").click()
            page.locator("section.history .history-status", has_text="Could not load the history: from:").wait_for()


def test_host_and_gpu_pages_draw_their_history(world, recorded, page_for, artifacts):
    for width in WIDTHS:
        page = page_for(world.member)
        page.set_viewport_size({"width": width, "height": 900})
        page.goto("/")
        page.locator('li.gpu[data-uuid="GPU-node-a-1"] a.gpu-link').click()
        page.wait_for_url("**/hosts/node-a/gpus/1/")
        _legend(page, "utilization").filter(has_text="mean: 40.0 %").wait_for()
        assert f"job {recorded.pk}" in page.locator("#gpu-jobs").inner_text()
        assert page.locator("#gpu-status").inner_text() == "busy"
        _no_sideways_scroll(page)
        page.screenshot(path=str(artifacts / f"gpu-page-{width}.png"), full_page=True)
        page.get_by_role("link", name="node-a").first.click()
        page.wait_for_url("**/hosts/node-a/")
        _legend(page, "power").filter(has_text="power: 300 W").wait_for()
        assert "None." in page.locator("#open-alerts").inner_text()
        _no_sideways_scroll(page)
        page.screenshot(path=str(artifacts / f"host-page-{width}.png"), full_page=True)

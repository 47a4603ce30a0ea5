"""Pages that work offline and in the dark: Swagger UI with the network blocked, uPlot charts (a one-sample chart
draws its point, hovering shows values), the browser's dark mode, and the console's own 404 page in every mode."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from apps.jobs.models import Job
from apps.telemetry.models import GpuSampleBucket
from tests.dashboard.conftest import hold, make_job

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LOCAL = {"127.0.0.1", "localhost", "[::1]", "::1"}

# Pixels of one colour on a chart's canvas (uPlot draws series, axes and grid on one canvas, in device pixels).
COUNT_COLOUR = """([selector, hex]) => {
    const c = document.querySelector(selector);
    const want = [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16));
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) {
        if (d[i + 3] > 200 && want.every((v, k) => Math.abs(d[i + k] - v) < 24)) { n++; }
    }
    return n; }"""


def offline(page) -> list[str]:
    """Abort every request that leaves this machine, as with the network off; returns the list of those tried."""
    tried: list[str] = []

    def route(r):
        if urlsplit(r.request.url).hostname in LOCAL or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            tried.append(r.request.url)
            r.abort()

    page.context.route("**/*", route)
    return tried


def sample(gpu, at, util, job=None) -> GpuSampleBucket:
    return GpuSampleBucket(
        gpu=gpu,
        resolution_s=10,
        bucket_start=at,
        job=job,
        samples=10,
        available_samples=10,
        utilization_avg=util,
        memory_used_max_mb=20000,
        memory_total_mb=143771,
        temperature_max=50.0,
        power_avg_w=200.0,
    )


def test_api_docs_render_with_the_network_blocked(world, page_for, artifacts):
    page = page_for(world.member)
    tried = offline(page)
    page.goto("/api/docs/")
    page.locator(".swagger-ui .info .title", has_text="GPU cluster console API").wait_for()
    page.locator(".swagger-ui .opblock").first.wait_for()
    assert page.locator(".swagger-ui .opblock").count() > 50  # the whole schema, from /api/schema/
    assert tried == []  # Swagger UI's files come from the console (drf-spectacular-sidecar)
    page.screenshot(path=str(artifacts / "api-docs-offline.png"))


def test_overview_and_job_charts_are_uplot_with_time_axes_and_hover_values(world, page_for, artifacts):
    now = timezone.now()
    job = make_job(
        world.vision,
        world.member,
        state=Job.State.RUNNING,
        gpus=1,
        name="one-sample",
        placed_at=now - timedelta(minutes=2),
        started_at=now - timedelta(minutes=2),
    )
    hold(job, world.gpus[:1], now - timedelta(minutes=2))
    # GPU 0 has one sample: its charts must draw a point, not an empty frame.
    GpuSampleBucket.objects.bulk_create(
        [sample(world.gpus[0], now - timedelta(seconds=30), 73.0, job)]
        + [sample(world.gpus[1], now - timedelta(seconds=10 * (20 - k)), 20 + 3 * k) for k in range(20)]
    )
    page = page_for(world.member)
    tried = offline(page)
    page.goto("/")
    page.wait_for_function("document.querySelectorAll('li.gpu .spark-chart .uplot canvas').length === 16")
    assert page.locator("li.gpu canvas.spark:visible").count() == 0  # the hand-drawn canvases are gone
    accent = page.evaluate("getComputedStyle(document.documentElement).getPropertyValue('--chart-1').trim()")
    spark = f"li.gpu[data-uuid='{world.gpus[1].uuid}'] .uplot canvas"
    assert page.evaluate(COUNT_COLOUR, [spark, accent]) > 20
    # The tooltip is written by uPlot's cursor hook, in the animation frame after a mouse move; a live redraw in
    # between can clear it, so the mouse moves across the sparkline until a frame has written it.
    spark_root = page.locator(f"li.gpu[data-uuid='{world.gpus[1].uuid}'] .uplot")
    over = spark_root.locator(".u-over")
    title = ""
    for attempt in range(40):
        box = over.bounding_box()
        over.hover(position={"x": box["width"] * (0.3 + 0.01 * attempt), "y": box["height"] / 2})
        page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
        title = spark_root.get_attribute("title") or ""
        if "utilization" in title:
            break
    assert "utilization" in title

    page.goto(f"/jobs/{job.pk}/")
    charts = page.locator("#gpu-charts .chart .uplot")
    charts.first.wait_for()
    assert charts.count() == 4
    util = page.locator("#gpu-charts figure").first
    assert util.locator(".u-axis").count() == 2  # a time axis and a value axis
    point = page.evaluate(COUNT_COLOUR, ["#gpu-charts figure .uplot canvas", accent])
    assert point > 4  # the one sample's point
    legend = util.locator(".u-legend")
    assert world.gpus[0].uuid[:12] in legend.inner_text()
    assert "Time (" in legend.inner_text()  # the axis says its time zone
    util.scroll_into_view_if_needed()
    box = util.locator(".u-over").bounding_box()
    for x in range(0, int(box["width"]), 4):  # hover across the plot until the cursor lands on the sample
        page.mouse.move(box["x"] + x, box["y"] + box["height"] / 2)
        if "73" in legend.locator(".u-series").nth(1).inner_text():
            break
    assert "73" in legend.locator(".u-series").nth(1).inner_text()
    assert page.locator("#metrics-empty").is_visible()  # no progress reported: the metric charts say so
    assert tried == []
    page.screenshot(path=str(artifacts / "job-charts-uplot.png"), full_page=True)


def test_dark_mode_follows_the_browser_and_redraws_the_charts(world, page_for, artifacts):
    now = timezone.now()
    GpuSampleBucket.objects.bulk_create(
        [sample(world.gpus[1], now - timedelta(seconds=10 * (20 - k)), 20 + 3 * k) for k in range(20)]
    )
    page = page_for(world.member)
    page.goto("/")
    light = page.evaluate("getComputedStyle(document.body).backgroundColor")
    spark = f"li.gpu[data-uuid='{world.gpus[1].uuid}'] .uplot canvas"
    page.locator(spark).wait_for()
    page.emulate_media(color_scheme="dark")  # the browser switches while the page is open
    dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert (light, dark) == ("rgb(246, 247, 249)", "rgb(13, 17, 23)")
    accent = page.evaluate("getComputedStyle(document.documentElement).getPropertyValue('--chart-1').trim()")
    assert accent == "#58a6ff"
    page.wait_for_function(f'({COUNT_COLOUR})(["{spark}", "{accent}"]) > 20')  # redrawn in the dark palette
    page.screenshot(path=str(artifacts / "overview-dark.png"), full_page=True)

    report = page_for(world.admin)
    report.emulate_media(color_scheme="dark")
    job = make_job(world.vision, world.member, state=Job.State.SUCCEEDED, gpus=1, name="done")
    hold(job, world.gpus[:1], now - timedelta(hours=2), now - timedelta(hours=1))
    report.goto("/reports/usage/")
    report.locator("#report-chart .uplot").wait_for()
    assert (
        report.evaluate("getComputedStyle(document.querySelector('#by-team th')).backgroundColor")
        == "rgb(33, 38, 45)"
    )
    report.screenshot(path=str(artifacts / "usage-report-dark.png"), full_page=True)


@pytest.mark.parametrize("debug", [False, True])
def test_the_404_page_is_the_consoles_own_in_every_mode(world, page_for, settings, debug):
    settings.DEBUG = debug
    page = page_for(world.member)
    for url in ("/no-such-page/", "/jobs/999999/"):  # no route; a view's Http404
        response = page.goto(url)
        assert response.status == 404
        assert page.locator("#error-404 h1").inner_text() == "Page not found"
        assert page.get_by_role("navigation", name="Main").get_by_role("link", name="Jobs").count() == 1
        assert "Technical" not in page.content() and "URLconf" not in page.content()
    response = page.goto("/api/v1/nothing-here/")
    assert response.status == 404 and response.json() == {"detail": "Not found."}  # API clients get JSON
    viewer = page_for(world.viewer)
    assert viewer.goto("/jobs/new/").status == 403
    assert "may submit jobs" in viewer.locator("#error-403").inner_text()

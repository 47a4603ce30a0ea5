"""The service page's polling code in a real browser (live server: stats come from the cache the reconciler fills)."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from apps.serving import services
from apps.serving.models import InferenceService

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def stats(**values):
    base = {"replicas": 1, "ready": 0, "rps": 0.0, "p50_ms": None, "p95_ms": None, "p99_ms": None, "queue_depth": 0,
            "error_rate": 0.0, "requests": 0}
    base.update(values)
    return base


@pytest.fixture
def service(world):
    cache.clear()
    spec = services.ServiceSpec(team=world.vision, name="digits", workload="mlp-digits", max_replicas=3,
                                target_p95_ms=40)
    yield services.service_create(user=world.member, spec=spec)
    cache.clear()


def test_service_page_polls_stats_replicas_and_events(world, service, page_for, artifacts):
    page = page_for(world.member)
    page.goto(f"/services/{service.pk}/")
    page.evaluate("window.__noReload = 1")
    page.wait_for_function("document.getElementById('live-status').dataset.state === 'live'")
    assert page.locator("#s-p95").inner_text() == "no data"
    job = service.replicas.get().job_id
    cache.set(services.stats_key(service.pk), stats(ready=1, rps=42.5, p50_ms=3.2, p95_ms=48.0, p99_ms=61.0,
                                                    error_rate=0.05))
    cache.set(services.replicas_key(service.pk), [{"job": job, "url": "http://127.0.0.1:9"}])
    services._event(service, "scale_up", "replicas 1 → 2: p95 48 ms > target 40 ms")
    page.wait_for_function("document.getElementById('s-p95').textContent === '48 ms'", timeout=30_000)
    assert page.locator("#s-p50").inner_text() == "3.2 ms" and page.locator("#s-p99").inner_text() == "61 ms"
    assert page.locator("#s-rps").inner_text() == "42.5" and page.locator("#s-errors").inner_text() == "5 %"
    assert page.locator("#s-ready").inner_text() == "1"
    row = page.locator(f'#replicas tr[data-job="{job}"]')
    assert "ready" in row.inner_text() and "not ready" not in row.inner_text()
    assert row.get_by_role("link", name=f"job {job}").get_attribute("href") == f"/jobs/{job}/"
    page.wait_for_function("document.getElementById('service-events').textContent.includes('p95 48 ms')",
                           timeout=30_000)
    # The charts are drawn (pixels on the latency canvas) in fixed-size buffers.
    painted = page.evaluate("""() => {
        const c = document.getElementById('chart-latency').nextElementSibling.querySelector('canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < d.length; i += 4) { if (d[i]) { n++; } } return n; }""")
    assert painted > 50
    assert page.evaluate("window.__noReload") == 1
    page.screenshot(path=str(artifacts / "service-page.png"), full_page=True)


def test_delete_asks_first_and_the_page_stops_polling_once_gone(world, service, page_for):
    page = page_for(world.member)
    page.goto(f"/services/{service.pk}/")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.get_by_role("button", name="Delete service").click()
    page.wait_for_timeout(300)
    service.refresh_from_db()
    assert service.state == InferenceService.State.ACTIVE and page.url.endswith(f"/services/{service.pk}/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete service").click()
    page.wait_for_url("**/services/")
    assert "deleted" in page.locator(".messages").inner_text()
    service.refresh_from_db()
    assert service.state == InferenceService.State.DELETED

    other = page_for(world.member)
    assert other.goto(f"/services/{service.pk}/").status == 404


def test_viewer_has_no_controls_and_members_create_through_the_form(world, page_for):
    viewer = page_for(world.viewer)
    viewer.goto("/services/")
    assert viewer.locator("#service-form").count() == 0
    member = page_for(world.member)
    member.goto("/services/")
    member.get_by_label("Name").fill("digits")
    member.get_by_label("Inference preset").select_option("infer-int8")
    member.get_by_label("Max replicas").fill("2")
    member.get_by_label("Target p95 (ms)").fill("25")
    member.get_by_role("button", name="Create service").click()
    member.wait_for_url("**/services/*/")
    service = InferenceService.objects.get()
    assert (service.preset, service.max_replicas, service.target_p95_ms) == ("infer-int8", 2, 25.0)
    assert "POST /serve/vision/digits/predict" in member.locator("#service-endpoint").inner_text()
    viewer.goto(f"/services/{service.pk}/")
    assert viewer.locator("#scale-form").count() == 0 and viewer.locator("#delete-form").count() == 0

"""The jobs table in a real browser: sort by a column, search as you type, rows that follow the database without a
websocket (the live server is WSGI), bulk cancel through its confirm step, the queue page; at 390 px and in the
dark, no sideways scrolling of the page and no JavaScript errors."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from apps.jobs.models import Job
from apps.telemetry.services import frame_key
from tests.browser.conftest import write_beside_the_live_server
from tests.browser.test_live import FAKE_WEBSOCKET
from tests.dashboard.conftest import hold, make_job

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NO_OVERFLOW = "document.documentElement.scrollWidth <= window.innerWidth + 1"


def row_names(page) -> list[str]:
    return page.locator("#jobs-rows tr[data-job] td.jobs-table-name a").all_inner_texts()


@pytest.fixture
def table_world(world):
    now = timezone.now()
    running = make_job(world.vision, world.member, name="resnet-big", gpus=2, state=Job.State.RUNNING,
                       started_at=now - timedelta(minutes=12), max_steps=1000, steps_done=400, steps_per_second=2.0)
    hold(running, world.gpus[:2], now - timedelta(minutes=12))
    cache.set(frame_key("node-a"), {"host": "node-a", "ts": time.time(), "received": time.time(), "gpus": [
        {"uuid": "GPU-node-a-0", "index": 0, "utilization_pct": 90.0},
        {"uuid": "GPU-node-a-1", "index": 1, "utilization_pct": 70.0}]})
    soon = now + timedelta(minutes=25)
    make_job(world.nlp, world.other, name="nlp-first", queue_position=1, pending_reason="first in the queue")
    make_job(world.vision, world.member2, name="bert-small", queue_position=2,
             pending_reason="waits for 4 free GPUs", estimated_start=soon, estimate_confidence=0.6)
    make_job(world.vision, world.member, name="resnet-tiny", queue_position=3,
             pending_reason="team vision holds 8 of 8 GPUs", estimated_start=soon, estimate_confidence=0.4)
    make_job(world.vision, world.member, name="alexnet-done", state=Job.State.SUCCEEDED,
             started_at=now - timedelta(hours=2), finished_at=now - timedelta(hours=1))
    return world


def test_sort_search_live_rows_bulk_cancel_and_queue(table_world, page_for, artifacts):
    world = table_world
    page = page_for(world.manager)
    page.goto("/jobs/")
    assert row_names(page) == ["alexnet-done", "resnet-tiny", "bert-small", "resnet-big"]  # newest first
    running = page.locator("#jobs-rows tr", has_text="resnet-big")
    assert "node-a:0,1" in running.inner_text() and "80 %" in running.inner_text()  # placement, utilization
    assert "40.0 %" in running.inner_text() and "min left" in running.inner_text()  # progress and ETA
    page.wait_for_function("document.getElementById('live-status').dataset.state === 'off'")  # no websocket here
    assert "refreshes every" in page.locator("#live-status").inner_text()

    # sort by a column, and back the other way
    page.get_by_role("link", name="Name", exact=True).click()
    page.wait_for_url(lambda url: url.endswith("/jobs/?ordering=name"))
    assert row_names(page) == ["alexnet-done", "bert-small", "resnet-big", "resnet-tiny"]
    assert page.locator("th[aria-sort='ascending']").inner_text().startswith("Name")
    page.get_by_role("link", name="Name", exact=True).click()
    page.wait_for_url(lambda url: url.endswith("/jobs/?ordering=-name"))
    assert row_names(page) == ["resnet-tiny", "resnet-big", "bert-small", "alexnet-done"]

    # search as you type: the rows and the address follow
    page.get_by_label("Name contains").fill("RESNET")
    page.wait_for_function("document.querySelectorAll('#jobs-rows tr[data-job]').length === 2")
    assert row_names(page) == ["resnet-tiny", "resnet-big"]
    assert "name=RESNET" in page.url and "ordering=-name" in page.url

    # a new job that matches appears without a reload (the rows are fetched every few seconds)
    make_job(world.vision, world.member, name="resnet-new")
    page.wait_for_selector("#jobs-rows td.jobs-table-name >> text=resnet-new")
    assert row_names(page) == ["resnet-tiny", "resnet-new", "resnet-big"]

    # bulk cancel: select two, confirm on the next page, back with what happened
    button = page.locator("#cancel-selected")
    assert button.is_disabled()
    tiny = Job.objects.get(name="resnet-tiny")
    big = Job.objects.get(name="resnet-big")
    page.locator("#select-all").check()  # every row on the page, then one left out
    assert button.inner_text() == "Cancel selected (3)"
    page.get_by_label(f"Select job {Job.objects.get(name='resnet-new').pk} (resnet-new)").uncheck()
    assert button.inner_text() == "Cancel selected (2)"
    assert page.locator("#select-all").evaluate("el => el.indeterminate")
    button.click()
    page.wait_for_selector("#confirm-step")
    assert page.locator("h1").inner_text() == "Cancel 2 jobs?"
    items = page.locator("#confirm-items").inner_text()
    assert "resnet-tiny" in items and "resnet-big" in items and "resnet-new" not in items
    assert not Job.objects.filter(state=Job.State.CANCELLED).exists()  # nothing before the yes
    page.screenshot(path=str(artifacts / "jobs-bulk-cancel-confirm.png"), full_page=True)
    page.get_by_role("button", name="Yes, cancel 2 jobs").click()
    page.wait_for_url(lambda url: url.endswith("/jobs/?name=RESNET&ordering=-name"))
    assert f"Cancelled 2 jobs: {tiny.pk}, {big.pk}." in page.locator(".messages").inner_text()  # in page order
    assert set(Job.objects.filter(state=Job.State.CANCELLED).values_list("name", flat=True)) == {
        "resnet-tiny", "resnet-big"}
    assert page.locator("#jobs-rows tr", has_text="resnet-big").locator(".state").inner_text() == "cancelled"

    # the queue, from the jobs page
    page.get_by_role("link", name="Queue: waiting jobs").click()
    page.wait_for_url("**/jobs/pending/")
    rows = page.locator("#jobs-rows tr").all_inner_texts()
    assert "1 waiting job of other teams" in rows[0] and "nlp-first" not in page.content()
    assert "#2" in rows[1] and "bert-small" in rows[1] and "waits for 4 free GPUs" in rows[1]
    assert "confidence 0.60" in rows[1]
    assert "resnet-new" in rows[2] and "not ranked yet" in rows[2]
    page.screenshot(path=str(artifacts / "jobs-pending.png"), full_page=True)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_jobs_pages_fit_390_px(table_world, page_for, artifacts, scheme):
    page = page_for(table_world.member)
    page.set_viewport_size({"width": 390, "height": 844})
    page.emulate_media(color_scheme=scheme)
    for path, name in (("/jobs/", "jobs"), ("/jobs/pending/", "jobs-pending")):
        page.goto(path)
        page.wait_for_selector("#jobs-rows tr")
        assert page.evaluate(NO_OVERFLOW), f"{path} scrolls sideways at 390 px"
        scroller = page.locator(".jobs-table-scroll")
        # the table scrolls inside its own box instead
        assert scroller.evaluate("el => el.scrollWidth > el.clientWidth")
        assert scroller.evaluate("el => el.getBoundingClientRect().right <= window.innerWidth + 1")
        page.screenshot(path=str(artifacts / f"{name}-390-{scheme}.png"), full_page=True)
    if scheme == "dark":
        background = page.evaluate("getComputedStyle(document.querySelector('.jobs-table')).backgroundColor")
        assert background == "rgb(22, 27, 34)"  # the dark card colour


def test_viewer_gets_no_selection_and_no_team_sees_an_empty_queue(table_world, page_for):
    viewer = page_for(table_world.viewer)
    viewer.goto("/jobs/")
    assert viewer.locator("#jobs-rows tr[data-job]").count() == 4
    assert viewer.locator('input[name="ids"]').count() == 0 and viewer.locator("#cancel-selected").count() == 0
    nobody = page_for(table_world.noteam)
    nobody.goto("/jobs/pending/")
    assert nobody.locator("#no-team").is_visible()
    assert "No waiting jobs you may see." in nobody.locator("#jobs-rows").inner_text()


def test_live_socket_updates_utilization_and_fetches_rows_on_a_state_change(table_world, page_for):
    page = page_for(table_world.manager)
    page.add_init_script(FAKE_WEBSOCKET)  # the live server is WSGI: the test plays /ws/cluster/
    page.goto("/jobs/")
    page.wait_for_function("document.getElementById('live-status').dataset.state === 'live'")
    assert page.evaluate("window.__sockets[0].url").endswith("/ws/cluster/")
    running = page.locator("#jobs-rows tr", has_text="resnet-big")
    page.evaluate("""window.__emit({type: "gpu.sample", ts: 1, gpus: [
        {uuid: "GPU-node-a-0", utilization_pct: 10, job: null}, {uuid: "GPU-node-a-1", utilization_pct: 30, job: null},
        {uuid: "GPU-node-b-0", utilization_pct: 99, job: null}]})""")
    page.wait_for_function("""() => {
        const row = [...document.querySelectorAll('#jobs-rows tr')].find(r => r.textContent.includes('resnet-big'));
        return row && row.querySelector('td[data-f="util"]').textContent === '20 %';
    }""")
    job = Job.objects.get(name="bert-small")
    write_beside_the_live_server(lambda: Job.objects.filter(pk=job.pk).update(state=Job.State.CANCELLED))
    page.evaluate("id => window.__emit({type: 'job.state', job: {id: id, state: 'cancelled', team: 'vision'}})", job.pk)
    page.wait_for_selector(f'#jobs-rows tr[data-job="{job.pk}"][data-state="cancelled"]')
    assert "80 %" not in running.inner_text()

"""A real job's reports kept as its metrics: the script writes progress and its own val_acc through
workers.runtime, the agent forwards every record, the console stores them; after the job ends its page (real
Chromium, when there is one) appends them live while open and, reloaded, draws them from the stored metrics."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, _missing
from tests.integration.live import ADMIN_PASSWORD, LiveCluster, create_team

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCRIPT = Path(__file__).parent / "scripts" / "report_metrics.py"
SHOW_ENV = Path(__file__).parent / "scripts" / "show_env.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    live = LiveCluster(tmp_path_factory.mktemp("metrics"), agents={"jm-a": "1xH200"})
    try:
        live.start()
        create_team(live.admin(), "it", 1)
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def finished(cluster) -> dict:
    job = cluster.submit(gpus=1, max_steps=40, workload={"command": [sys.executable, str(SCRIPT)]})
    done = cluster.wait_state(job["id"], {"succeeded", "failed"}, timeout=180)
    assert done["state"] == "succeeded", cluster.log(job["id"])
    return done


def test_every_record_and_the_jobs_own_metric_reach_the_store(cluster, finished):
    body = cluster.admin().get(f"/api/v1/jobs/{finished['id']}/metrics/").json()
    series = {s["name"]: s for s in body["series"]}
    assert set(series) == {"loss", "steps_per_s", "samples_per_s", "val_acc"}
    assert series["loss"]["steps"] == list(range(1, 41)) and series["loss"]["values"][-1] == 1 / 40
    assert series["val_acc"]["steps"] == [10, 20, 30, 40] and series["val_acc"]["values"] == [0.25, 0.5, 0.75, 1.0]
    assert body["dropped"] == 0  # the runtime dropped the bad name before it was written (and logged it)
    assert "of the metrics reported at step 10 are dropped" in cluster.log(finished["id"])
    assert body["progress"]["percent"] == 100.0 and body["progress"]["eta_s"] is None


POINTS = """() => Object.fromEntries([...document.querySelectorAll("figure.metric-chart")]
    .map((f) => [f.dataset.metric, Number(f.dataset.points)]))"""
NO_RELOAD = "window.__noReload = 'still-the-same-document'"


def test_the_open_page_appends_live_points_then_a_reload_draws_the_stored_curves(cluster):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    # The only GPU is held, so the job waits in the queue while its page opens; its reports then arrive live.
    # At a higher priority: the scheduler would preempt a normal one for a job predicted to finish much sooner.
    blocker = cluster.submit(gpus=1, priority="high", workload={"command": [sys.executable, str(SHOW_ENV), "600"]})
    cluster.wait_state(blocker["id"], {"running"})
    job = cluster.submit(gpus=1, max_steps=40, workload={"command": [sys.executable, str(SCRIPT)]})
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_context(base_url=cluster.url).new_page()
            page.set_default_timeout(120_000)  # a busy machine: only "never" fails
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto("/accounts/login/")
            page.get_by_label("Username").fill("admin")
            page.get_by_label("Password").fill(ADMIN_PASSWORD)
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url(f"{cluster.url}/")
            page.goto(f"/jobs/{job['id']}/")
            assert page.locator("#job-state").inner_text() == "queued"
            assert page.locator("figure.metric-chart").count() == 0 and page.locator("#metrics-empty").is_visible()
            page.wait_for_function("document.getElementById('live-status').dataset.state === 'live'")
            page.evaluate(NO_RELOAD)
            assert cluster.admin().post(f"/api/v1/jobs/{blocker['id']}/cancel/", json={}).status_code == 200
            page.wait_for_function("document.getElementById('job-state').textContent === 'succeeded'")
            page.wait_for_function(f"({POINTS})().val_acc === 4 && ({POINTS})().loss === 40")
            assert page.evaluate("window.__noReload") == "still-the-same-document"  # appended live
            assert page.evaluate(POINTS) == {"loss": 40, "steps_per_s": 40, "samples_per_s": 40, "val_acc": 4}
            page.reload()
            page.wait_for_selector('figure[data-metric="val_acc"]')
            assert page.evaluate("window.__noReload") is None
            assert page.evaluate(POINTS) == {"loss": 40, "steps_per_s": 40, "samples_per_s": 40, "val_acc": 4}
            assert page.locator("#job-progress").inner_text() == "100.0 % (40 of 40 steps)"
        finally:
            browser.close()
    assert not errors, f"JavaScript errors: {errors}"

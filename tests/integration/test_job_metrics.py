"""A real job's reports kept as its metrics: the script writes progress and its own val_acc through
workers.runtime, the agent forwards every record, the console stores them; after the job ends its page (real
Chromium, when there is one) draws the curves from the stored metrics, val_acc included."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, _missing
from tests.integration.live import ADMIN_PASSWORD, LiveCluster, create_team

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCRIPT = Path(__file__).parent / "scripts" / "report_metrics.py"


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


def test_after_the_job_ends_its_page_draws_the_stored_curves(cluster, finished, tmp_path):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_context(base_url=cluster.url).new_page()
            page.set_default_timeout(30_000)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto("/accounts/login/")
            page.get_by_label("Username").fill("admin")
            page.get_by_label("Password").fill(ADMIN_PASSWORD)
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url(f"{cluster.url}/")
            page.goto(f"/jobs/{finished['id']}/")
            page.reload()
            page.wait_for_selector('figure[data-metric="val_acc"]')
            points = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll("figure.metric-chart")]
                .map((f) => [f.dataset.metric, Number(f.dataset.points)]))""")
            assert points == {"loss": 40, "steps_per_s": 40, "samples_per_s": 40, "val_acc": 4}
        finally:
            browser.close()
    assert not errors, f"JavaScript errors: {errors}"

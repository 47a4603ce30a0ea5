"""The console in a real browser against a REAL console: uvicorn (HTTP + websockets), a Celery worker with beat
and a host agent on simulated GPUs (tests.integration.live.LiveCluster), not pytest-django's WSGI live server.

A member logs in, submits a CPU-burning command job through the form and watches it on its page (state and log
lines arrive over the websocket, no reload), sees its GPU's utilization rise in the overview's heat map, cancels a
job from its page; a viewer gets no controls and the server refuses their cancel; another team gets 404.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from tests.browser import STEP_TIMEOUT_MS
from tests.browser.conftest import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _missing
from tests.integration.live import LiveCluster, create_team

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.slow]
PASSWORD = "a-long-pass-for-browser-7"
BURN_S = 25
BURN = Path(__file__).parent / "scripts" / "burn.py"
NO_RELOAD = "window.__noReload = 'still-the-same-document'"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("browser-live")
    live = LiveCluster(base, agents={"br-a": "2xH200"})
    try:
        live.start()
        admin = live.admin()
        for team in ("web", "rival"):
            create_team(admin, team, 2)
        for user, team, role in [("wendy", "web", "member"), ("walt", "web", "viewer"), ("rolf", "rival", "member")]:
            assert admin.post("/api/v1/users/", json={"username": user, "password": PASSWORD}).status_code == 201
            assert admin.post(f"/api/v1/teams/{team}/members/",
                              json={"username": user, "role": role}).status_code == 201
        live.burn = BURN
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def chromium(cluster):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def login(cluster, chromium):
    """A browser context logged in through the login form as `username`; fails the test on JavaScript errors."""
    contexts, errors = [], []

    def make(username: str):
        context = chromium.new_context(viewport={"width": 1400, "height": 1000}, base_url=cluster.url)
        context.set_default_timeout(STEP_TIMEOUT_MS)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(f"{username}: {exc}"))
        page.goto("/accounts/login/")
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{cluster.url}/")
        return page

    yield make
    for context in contexts:
        context.close()
    assert not errors, f"JavaScript errors: {errors}"


def util_of_job_cell(page, job_id: int) -> float | None:
    return page.evaluate("""jobId => {
        for (const cell of document.querySelectorAll('li.gpu')) {
            const job = cell.querySelector('[data-f="job"]');
            if (job && job.textContent.includes('job ' + jobId)) {
                const m = /([0-9.]+) %/.exec(cell.querySelector('[data-f="util"]').textContent);
                return m ? parseFloat(m[1]) : -1;
            }
        }
        return null;
    }""", job_id)


def test_live_console_in_a_browser(cluster, login):
    ARTIFACTS.mkdir(exist_ok=True)
    wendy_api = cluster.user_client("wendy", PASSWORD)
    sleeper = wendy_api.post("/api/v1/jobs/", json={
        "name": "sleeper", "team": "web", "gpus": 1, "gpu_type": "H200",
        "workload": {"command": [sys.executable, "-c", "import time; time.sleep(120)"]}}).json()

    # A member submits a command job through the form: one argument per line.
    page = login("wendy")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Jobs").click()
    page.get_by_role("link", name="Submit a job").click()
    page.get_by_label("Name", exact=True).fill("burner")
    page.get_by_label("Kind").select_option("train")
    page.get_by_role("radio", name="command").check()
    page.get_by_label("Command", exact=True).fill(f"{sys.executable}\n{cluster.burn}\n{BURN_S}")
    page.get_by_label("Time limit (minutes)").fill("5")
    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert cluster.job(job_id)["workload"] == {"command": [sys.executable, str(cluster.burn), str(BURN_S)]}
    page.evaluate(NO_RELOAD)
    first_state = page.locator("#job-state").inner_text()
    page.wait_for_function("document.getElementById('live-status').dataset.state === 'live'")

    # State and log lines arrive over the websocket while the page stays the same document.
    page.wait_for_function("document.getElementById('job-state').textContent === 'running'", timeout=60_000)
    page.wait_for_function("/burn [3-9]/.test(document.getElementById('job-log').textContent)", timeout=30_000)
    assert page.evaluate("window.__noReload") == "still-the-same-document"
    assert "burn start" in page.locator("#job-log").inner_text()
    assert page.locator("#job-placed").inner_text().startswith("br-a:")  # placed after the page loaded
    page.wait_for_function("document.querySelectorAll('#gpu-charts figure .uplot').length === 4")  # its GPU's charts
    assert "→ running" in page.locator("#job-events").inner_text()
    seen_states = {first_state, "running"}

    # The overview's heat map shows this job's GPU busy, live.
    overview = page.context.new_page()
    overview.goto("/")
    overview.evaluate(NO_RELOAD)
    overview.wait_for_function("document.getElementById('live-status').dataset.state === 'live'")
    deadline = time.monotonic() + 60  # only "never": frames come once a second
    util = None
    while time.monotonic() < deadline:
        util = util_of_job_cell(overview, job_id)
        if util is not None and util > 50:
            break
        overview.wait_for_timeout(250)
    assert util is not None and util > 50, f"utilization of job {job_id}'s GPU in the heat map: {util}"
    cell = overview.locator("li.gpu", has=overview.get_by_role("link", name=f"job {job_id}"))
    assert re.search(r"\bheat-[2-4]\b", cell.get_attribute("class")), cell.get_attribute("class")
    assert overview.evaluate("window.__noReload") == "still-the-same-document"
    overview.screenshot(path=str(ARTIFACTS / "live-overview.png"), full_page=True)
    page.bring_to_front()
    page.wait_for_timeout(1500)  # a few GPU samples in the job's charts
    page.screenshot(path=str(ARTIFACTS / "live-job.png"), full_page=True)

    # A viewer: no submit or cancel controls, and the server refuses their cancel anyway.
    cluster.wait_state(sleeper["id"], {"running"}, timeout=60)
    viewer = login("walt")
    viewer.goto("/jobs/")
    assert viewer.locator("#submit-job").count() == 0
    assert viewer.goto("/jobs/new/").status == 403
    viewer.goto(f"/jobs/{sleeper['id']}/")
    assert viewer.locator("#job-state").inner_text() == "running"
    assert viewer.locator("#cancel-form").count() == 0 and viewer.locator("#cancel-button").count() == 0
    refused = viewer.evaluate("""jobId => fetch('/jobs/' + jobId + '/cancel/', {
        method: 'POST', credentials: 'same-origin',
        headers: {'X-CSRFToken': document.cookie.match(/csrftoken=([^;]+)/)[1],
                  'Content-Type': 'application/x-www-form-urlencoded'},
        body: 'reason=viewer'}).then(r => r.status)""", sleeper["id"])
    assert refused == 403
    assert cluster.job(sleeper["id"])["state"] == "running"

    # Another team's member: 404 on the job pages.
    rival = login("rolf")
    assert rival.goto(f"/jobs/{job_id}/").status == 404
    assert rival.goto(f"/jobs/{sleeper['id']}/").status == 404

    # The member cancels the sleeper from its page.
    cancel_page = page.context.new_page()
    cancel_page.goto(f"/jobs/{sleeper['id']}/")
    cancel_page.get_by_label("Reason (optional)").fill("done with it")
    cancel_page.once("dialog", lambda dialog: dialog.accept())  # the confirm step
    cancel_page.get_by_role("button", name="Cancel job").click()
    cancel_page.wait_for_url(f"**/jobs/{sleeper['id']}/")
    assert f"Job {sleeper['id']} cancelled." in cancel_page.locator(".messages").inner_text()
    assert cancel_page.locator("#job-state").inner_text() == "cancelled"
    assert cancel_page.locator("#cancel-form").count() == 0
    assert cluster.wait_state(sleeper["id"], {"cancelled"}, timeout=60)["state"] == "cancelled"

    # Back on the burner's page, never reloaded: it finishes, live.
    page.bring_to_front()
    page.wait_for_function("document.getElementById('job-state').textContent === 'succeeded'",
                           timeout=(BURN_S + 30) * 1000)
    page.wait_for_function("document.getElementById('job-log').textContent.includes('burn done')", timeout=30_000)
    seen_states.add("succeeded")
    assert page.evaluate("window.__noReload") == "still-the-same-document"
    assert len(seen_states) >= 2

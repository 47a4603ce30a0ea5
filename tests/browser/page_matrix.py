"""Issue 18's acceptance matrix (run by test_page_matrix*.py, a module per persona so that pytest-xdist runs them
on different workers at once): every page of the console, at 1280 and 390 px, light and dark, as a site admin, a
team member and a user without a team, in real Chromium. Each visit asserts the status the page answers that
persona (a page it may not open answers the console's own 403/404 page, checked the same way), no JavaScript errors
(uncaught exceptions and console errors) and no sideways scrolling, and saves a screenshot under
test-artifacts/matrix/ (JPEG: the admin's matrix took 17 % less CPU than with PNG, 36.8 against 44.2 CPU-s).

One browser for the module and one context per viewport for the persona under test; each page is checked in light
colours, then again after the browser switches to dark. Failures are gathered and reported together, so one run
shows everything that is wrong."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.template import loader
from django.test import Client
from django.urls import Resolver404, resolve
from django.utils import timezone

from apps.accounts import services as account_services
from apps.accounts.secrets import secret_create
from apps.jobs.metrics import record_metrics
from apps.jobs.models import Job
from apps.quotas.services import quota_request_create
from apps.serving import services as serving_services
from apps.telemetry import history
from apps.telemetry.models import Alert, AlertRule, GpuSampleBucket
from tests.browser import STEP_TIMEOUT_MS
from tests.browser.conftest import ARTIFACTS
from tests.dashboard.conftest import hold, make_job
from workers.protocol import TrainingProgress

VIEWPORTS = {"1280": {"width": 1280, "height": 900}, "390": {"width": 390, "height": 844}}
SCHEMES = ("light", "dark")
PERSONAS = ("admin", "member", "noteam")
SHOTS = ARTIFACTS / "matrix"

# Console errors that say nothing about the page: the test's live server is WSGI and serves no websockets, so the
# pages' live connections fail and retry (they say so on the page, which is what is checked elsewhere).
IGNORED_CONSOLE = ("WebSocket connection to",)
# The console's 500 page, as Django's server_error view renders it, answered at this address (no view fails on
# purpose): its stylesheet comes from the live server as on any page.
SERVER_ERROR = "/__server-error__/"

OVERFLOW = """() => {
    const s = document.scrollingElement;
    if (s.scrollWidth <= s.clientWidth + 1) { return null; }
    // what overflows: the outermost elements past the right edge that no scrolling box clips
    const limit = s.clientWidth + 1;
    const clipped = (el) => {  // an absolutely positioned box is clipped only from its containing block up
        let free = getComputedStyle(el).position === 'absolute';
        for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
            const style = getComputedStyle(a);
            if (free && style.position === 'static') { continue; }
            free = false;
            if (style.overflowX !== 'visible') { return true; }
        }
        return false;
    };
    const past = (el) => el.getBoundingClientRect().right > limit && getComputedStyle(el).position !== 'fixed';
    const wide = [...document.body.querySelectorAll('*')]
        .filter((el) => past(el) && !clipped(el) && !(el.parentElement && past(el.parentElement)))
        .slice(0, 4).map((el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
            + (typeof el.className === 'string' && el.className.trim() ? '.' + el.className.trim().split(/\\s+/).join('.') : '')
            + ' ' + Math.round(el.getBoundingClientRect().right) + 'px');
    return {scrollWidth: s.scrollWidth, clientWidth: s.clientWidth, wide};
}"""


@dataclass
class Visit:
    name: str
    url: str
    status: dict[str, int | None]  # persona -> the status the page answers it (None: not for this persona)
    then: Callable[[Any], Any] | None = None  # an action after loading (e.g. submit a form), then re-checked
    then_status: int = 200  # the status of the page the action answers
    optional: bool = False  # a page another branch adds: visited when its route exists
    full_page: bool = True  # the screenshot: the whole page, or the first screen (Swagger UI is very long)


@dataclass
class World:
    users: dict[str, Any]
    visits: list[Visit] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)  # visit name -> its URL


def _samples(gpus, now, minutes: int = 10) -> None:
    GpuSampleBucket.objects.bulk_create([
        GpuSampleBucket(gpu=gpu, resolution_s=10, bucket_start=now - timedelta(seconds=10 * k), samples=10,
                        available_samples=10, utilization_avg=30.0 + (k * 7 + n * 13) % 60,
                        memory_used_max_mb=20_000 + 100 * k, memory_total_mb=143_771, temperature_max=40.0 + k % 20,
                        power_avg_w=150.0 + k)
        for n, gpu in enumerate(gpus) for k in range(6 * minutes)])


def _metrics(job: Job, steps: int, start: float) -> None:
    record_metrics(job, 1, [
        TrainingProgress(step=s, max_steps=steps * 2, loss=2.0 / s, steps_per_s=4.0 + s % 3, samples_per_s=256.0,
                         ts=start + s, metrics={"val_acc": s / (steps + 1)} if s % 5 == 0 else {})
        for s in range(1, steps + 1)])


def _route_exists(url: str) -> bool:
    try:
        resolve(url.split("?")[0])
    except Resolver404:
        return False
    return True


def _submit_without_dialog(selector: str) -> Callable[[Any], Any]:
    """Submit a destructive form as a browser without JavaScript would: the server answers its confirm page."""

    def act(page):
        with page.expect_navigation() as navigation:
            page.evaluate("""(sel) => { const f = document.querySelector(sel); f.removeAttribute('data-confirm-text');
                                        HTMLFormElement.prototype.submit.call(f); }""", selector)
        return navigation.value

    return act


def _fill_and_submit(form: str, values: dict[str, str]) -> Callable[[Any], Any]:
    """Fill a form's fields (by name) and submit it: the page it answers (a refusal's field errors, a new token)."""

    def act(page):
        for name, value in values.items():
            page.locator(f"{form} [name='{name}']").fill(value)
        with page.expect_navigation() as navigation:
            page.locator(f"{form} button[type='submit']").last.click()
        return navigation.value

    return act


@pytest.fixture(name="console")  # by this name in the modules that import it under another
def console(world) -> World:
    """A cluster with something on every page: running, queued, finished (with kept metrics) and failed jobs with
    GPU history, a service, a secret, alerts, tokens, a quota request and a month of usage."""
    now = timezone.now()
    vision, nlp = world.vision, world.nlp
    running = make_job(vision, world.member, state=Job.State.RUNNING, gpus=2,
                       name="resnet50-imagenet-a-rather-long-run-name-with-no-spaces-at-all",
                       placed_at=now - timedelta(minutes=20), started_at=now - timedelta(minutes=20), max_steps=400)
    hold(running, world.gpus[0:2], now - timedelta(minutes=20))
    _metrics(running, 60, (now - timedelta(minutes=15)).timestamp())
    done = make_job(vision, world.member, state=Job.State.SUCCEEDED, gpus=1, name="baseline",
                    placed_at=now - timedelta(hours=3), started_at=now - timedelta(hours=3),
                    finished_at=now - timedelta(hours=2), exit_code=0, max_steps=120)
    hold(done, world.gpus[2:3], now - timedelta(hours=3), now - timedelta(hours=2))
    _metrics(done, 120, (now - timedelta(hours=3)).timestamp())
    make_job(vision, world.member2, state=Job.State.QUEUED, gpus=8, name="big-sweep",
             pending_reason="team vision holds 8 of 8 GPUs")
    make_job(vision, world.manager, state=Job.State.FAILED, gpus=1, name="oom", exit_code=137,
             finished_at=now - timedelta(minutes=50))
    nlp_job = make_job(nlp, world.other, state=Job.State.RUNNING, gpus=4, name="bert",
                       placed_at=now - timedelta(minutes=5), started_at=now - timedelta(minutes=5))
    hold(nlp_job, world.gpus[8:12], now - timedelta(minutes=5))
    _samples(world.gpus, now)
    history.snapshot_cluster(now)
    service = serving_services.service_create(user=world.member, spec=serving_services.ServiceSpec(
        team=vision, name="digits", workload="mlp-digits", max_replicas=2))
    secret_create(team=vision, name="HF_TOKEN", value="hf-secret", actor=world.manager)
    rule = AlertRule.objects.create(name="idle-jobs", kind=AlertRule.Kind.JOB_IDLE, severity="critical")
    Alert.objects.create(rule=rule, subject=f"job:{running.pk}", team=vision, job=running,
                         message=f"job {running.pk} has used under 5 % of its GPUs for 30 minutes")
    Alert.objects.create(rule=rule, subject="gpu:x", host=world.gpus[0].host, gpu=world.gpus[0],
                         message="GPU 0 of node-a at 91 °C")
    for user in (world.admin, world.member, world.noteam):
        account_services.token_create(user=user, name="laptop", expires_in_days=30)
    quota_request_create(team=vision, requested_by=world.manager, reason="a deadline next week", max_gpus=12)

    everyone = dict.fromkeys(PERSONAS, 200)
    team_only = {"admin": 200, "member": 200, "noteam": 404}
    visits = [
        Visit("overview", "/", everyone),
        Visit("jobs", "/jobs/", everyone),
        Visit("jobs-filtered", "/jobs/?state=running&team=vision", everyone),
        Visit("jobs-pending", "/jobs/pending/", everyone, optional=True),
        Visit("job-new", "/jobs/new/", {"admin": 200, "member": 200, "noteam": 403}),
        Visit("job-running", f"/jobs/{running.pk}/", team_only),
        Visit("job-done", f"/jobs/{done.pk}/", team_only),
        Visit("job-other-team", f"/jobs/{nlp_job.pk}/", {"admin": 200, "member": 404, "noteam": 404}),
        Visit("job-cancel-confirm", f"/jobs/{running.pk}/", team_only,
              then=_submit_without_dialog("form[action$='/cancel/']")),
        Visit("job-new-refused", "/jobs/new/", {"admin": 200, "member": 200, "noteam": None},
              then=_fill_and_submit("#job-form", {"name": "too-many", "gpus": "1.5", "cpus": "0"}), then_status=400),
        Visit("job-compare", f"/jobs/compare/?ids={done.pk},{running.pk}&metric=loss", team_only),
        Visit("services", "/services/", everyone),
        Visit("service", f"/services/{service.pk}/", team_only),
        Visit("teams", "/teams/", everyone),
        Visit("team", "/teams/vision/", team_only),
        Visit("team-member-remove-confirm", "/teams/vision/", {"admin": 200, "member": None, "noteam": None},
              then=_submit_without_dialog("form[action$='/milo/remove/']")),
        Visit("team-secrets", "/teams/vision/secrets/", team_only),
        Visit("team-secret-delete-confirm", "/teams/vision/secrets/HF_TOKEN/delete/",
              {"admin": 200, "member": 403, "noteam": 404}),
        Visit("host", "/hosts/node-a/", team_only),
        Visit("gpu", "/hosts/node-a/gpus/0/", team_only),
        Visit("usage-report", "/reports/usage/", {"admin": 200, "member": 404, "noteam": 404}),
        Visit("alerts", "/alerts/", everyone),
        Visit("tokens", "/accounts/tokens/", everyone),
        Visit("token-created", "/accounts/tokens/", everyone,
              then=_fill_and_submit("#token-form", {"name": "a-token-with-a-long-name-for-ci"})),
        Visit("password", "/accounts/password_change/", everyone),
        Visit("password-done", "/accounts/password_change/done/", everyone),
        Visit("login", "/accounts/login/", everyone),
        Visit("not-found", "/no-such-page/", dict.fromkeys(PERSONAS, 404)),
        Visit("server-error", SERVER_ERROR, dict.fromkeys(PERSONAS, 500)),
        Visit("api-docs", "/api/docs/", everyone, full_page=False),
    ]
    users = {"admin": world.admin, "member": world.member, "noteam": world.noteam}
    visits = [v for v in visits if not v.optional or _route_exists(v.url)]
    return World(users, visits, {v.name: v.url for v in visits})


def _context(browser, live_server, user, viewport: dict, scheme: str):
    context = browser.new_context(viewport=viewport, color_scheme=scheme, base_url=live_server.url)
    context.set_default_timeout(STEP_TIMEOUT_MS)
    error_page = loader.get_template("500.html").render()
    context.route(f"**{SERVER_ERROR}", lambda route: route.fulfill(status=500, body=error_page,
                                                                   content_type="text/html; charset=utf-8"))
    client = Client()
    client.force_login(user)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME,
                          "value": client.cookies[settings.SESSION_COOKIE_NAME].value, "url": live_server.url}])
    return context


def _check(page, where: str, errors: list[str], failures: list[str], shot: str, full_page: bool) -> None:
    page.wait_for_load_state("networkidle")  # the charts' history fetches have answered and been drawn
    overflow = page.evaluate(OVERFLOW)
    if overflow:
        failures.append(f"{where}: sideways scrolling {overflow}")
    if errors:
        failures.append(f"{where}: JavaScript errors {errors}")
        errors.clear()
    page.screenshot(path=str(SHOTS / f"{shot}.jpg"), full_page=full_page, type="jpeg", quality=80)


def check_every_page(console: World, persona: str, browser, live_server) -> None:
    """Each page is loaded once per width, in light colours; then the browser switches to dark (as a user's system
    does at dusk: the stylesheet's media query and the charts' redraw on the change) and the page is checked again."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    visited = 0
    for size, viewport in VIEWPORTS.items():
        context = _context(browser, live_server, console.users[persona], viewport, SCHEMES[0])
        page = context.new_page()
        errors: list[str] = []
        expected_status: dict[str, int] = {"status": 200}
        page.on("pageerror", lambda exc, errors=errors: errors.append(f"uncaught: {exc}"))

        def console_error(msg, errors=errors, expected_status=expected_status) -> None:
            if msg.type != "error" or msg.text.startswith(IGNORED_CONSOLE):
                return
            if (expected_status["status"] >= 400 and msg.text.startswith("Failed to load resource")
                    and f"status of {expected_status['status']}" in msg.text):
                return  # the page under test is the console's own error page
            errors.append(f"console: {msg.text} ({msg.location.get('url')})")

        page.on("console", console_error)
        for visit in console.visits:
            want = visit.status[persona]
            if want is None:
                continue
            expected_status["status"] = want
            page.emulate_media(color_scheme=SCHEMES[0])
            where = f"{persona} {size}px {{scheme}} {visit.name} {visit.url}"
            response = page.goto(visit.url)
            assert response is not None
            if response.status != want:
                failures.append(f"{where.format(scheme=SCHEMES[0])}: answered {response.status}, expected {want}")
                continue
            if visit.then is not None and want == 200:
                expected_status["status"] = visit.then_status
                answered = visit.then(page)
                if answered.status != visit.then_status:
                    failures.append(f"{where.format(scheme=SCHEMES[0])}: its action answered {answered.status}, "
                                    f"not {visit.then_status}")
                    continue
            for scheme in SCHEMES:
                if scheme != SCHEMES[0]:
                    page.emulate_media(color_scheme=scheme)
                    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
                _check(page, where.format(scheme=scheme), errors, failures,
                       f"{persona}-{size}-{scheme}-{visit.name}", visit.full_page)
                visited += 1
        context.close()
    assert not failures, f"{len(failures)} of {visited} visits failed:\n" + "\n".join(failures)
    assert visited == 4 * sum(v.status[persona] is not None for v in console.visits)

"""Browser tests: Playwright (sync API) driving Debian's chromium against pytest-django's live server.

They skip, saying why, when /usr/bin/chromium (CONSOLE_CHROMIUM to override) or the playwright package is missing.
Browsers are never downloaded (no `playwright install`). The live server is WSGI: websockets are not served, so
the pages must degrade to what the database shows.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.browser import STEP_TIMEOUT_MS

CHROMIUM = os.environ.get("CONSOLE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                 "--no-first-run", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
T = TypeVar("T")



class _RequestsInFlight:
    """Requests the live server is handling (its request threads: not the test's own Client, in the main thread),
    counted by Django's request_started and request_finished signals (the latter sent when the response closes,
    after its body is sent or the client went away)."""

    def __init__(self) -> None:
        self._count = 0
        self._changed = threading.Condition()

    def started(self, **_: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            with self._changed:
                self._count += 1

    def finished(self, **_: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            with self._changed:
                self._count -= 1
                self._changed.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._count <= 0, timeout)


_IN_FLIGHT = _RequestsInFlight()


def pytest_configure(config: pytest.Config) -> None:
    from django.core.signals import request_finished, request_started

    request_started.connect(_IN_FLIGHT.started, weak=False, dispatch_uid="browser-tests-in-flight-started")
    request_finished.connect(_IN_FLIGHT.finished, weak=False, dispatch_uid="browser-tests-in-flight-finished")

    config.addinivalue_line("markers", "browser: drives a real browser (chromium + playwright) against a live server")


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; never `playwright install`)"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and not shutil.which(CHROMIUM):
        return f"no chromium at {CHROMIUM} (apt-get install -y chromium)"
    return None


@pytest.fixture(scope="module")
def browser():
    """Chromium for one test module. Playwright's sync API runs an event loop in this thread, so Django's
    async-safety check is lifted while it runs (the tests' ORM calls are plain synchronous ones), and restored
    afterwards so that no other test runs without it."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            yield chromium
            chromium.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture(autouse=True)
def _live_server_idle_at_teardown(request: pytest.FixtureRequest):
    """After a test with the live server: close its pages and wait for the requests they started to end before
    the database is flushed. With SQLite in memory the server's request threads share the test's connection, and
    a flush that meets a request's read fails with "database table is locked" (and the request reads an emptied
    database)."""
    if "live_server" not in request.fixturenames:
        yield
        return
    # (set up first, torn down after this fixture: its flush comes once the server is idle)
    request.getfixturevalue("transactional_db")
    yield
    if "browser" in request.fixturenames:
        for context in list(request.getfixturevalue("browser").contexts):
            context.close()
    _IN_FLIGHT.wait_idle(timeout=60)


@pytest.fixture
def page_for(browser, live_server):
    """A new page, logged in as `user` through a session cookie (None: anonymous). Fails on JavaScript errors."""
    from django.conf import settings
    from django.test import Client

    contexts = []
    errors: list[str] = []

    def make(user=None):
        context = browser.new_context(viewport={"width": 1400, "height": 900}, base_url=live_server.url)
        context.set_default_timeout(STEP_TIMEOUT_MS)
        if user is not None:
            client = Client()
            # (an earlier page of the test may still be fetching: the session's write waits for its read)
            write_beside_the_live_server(lambda: client.force_login(user))
            context.add_cookies([{"name": settings.SESSION_COOKIE_NAME,
                                  "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
                                  "url": live_server.url}])
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        return page

    yield make
    for context in contexts:
        context.close()
    assert not errors, f"JavaScript errors: {errors}"


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def write_beside_the_live_server(write: Callable[[], T], attempts: int = 600) -> T:
    """Run an ORM write while a page may be fetching. With SQLite in memory the live server's request threads share
    the test's one connection, so a write that meets a request's unfinished read fails at once with "database table
    is locked" (SQLITE_LOCKED, which no busy timeout waits on). The read ends within its request: try again."""
    from django.db import OperationalError

    for _ in range(attempts - 1):
        try:
            return write()
        except OperationalError as exc:
            if "locked" not in str(exc):
                raise
            time.sleep(0.05)
    return write()

"""Browser tests: Playwright (sync API) driving Debian's chromium against pytest-django's live server.

They skip, saying why, when /usr/bin/chromium (CONSOLE_CHROMIUM to override) or the playwright package is missing.
Browsers are never downloaded (no `playwright install`). The live server is WSGI: websockets are not served, so
the pages must degrade to what the database shows.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("CONSOLE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                 "--no-first-run", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"



def pytest_configure(config: pytest.Config) -> None:
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


@pytest.fixture
def page_for(browser, live_server):
    """A new page, logged in as `user` through a session cookie (None: anonymous). Fails on JavaScript errors."""
    from django.conf import settings
    from django.test import Client

    contexts = []
    errors: list[str] = []

    def make(user=None):
        context = browser.new_context(viewport={"width": 1400, "height": 900}, base_url=live_server.url)
        context.set_default_timeout(30_000)  # a busy machine: only "never" fails
        if user is not None:
            client = Client()
            client.force_login(user)
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

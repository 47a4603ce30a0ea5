"""The page matrix (tests/browser/page_matrix.py) as a site admin, and times in the browser's zone."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.test import Client

from tests.browser.page_matrix import VIEWPORTS, check_every_page
from tests.browser.page_matrix import console as matrix_console  # noqa: F401 - registers the `console` fixture

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_every_page_in_every_mode_as_a_site_admin(console, browser, live_server):
    check_every_page(console, "admin", browser, live_server)


def test_times_are_written_in_the_browsers_zone_24_hour_with_the_zone(console, browser, live_server):
    """A browser in New York with a 12-hour locale: the pages' times (server-written and script-written alike) are
    24-hour, in its zone, the zone said; the chart legends say the zone too."""
    context = browser.new_context(viewport=VIEWPORTS["1280"], base_url=live_server.url, timezone_id="America/New_York",
                                  locale="en-US")
    client = Client()
    client.force_login(console.users["member"])
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME,
                          "value": client.cookies[settings.SESSION_COOKIE_NAME].value, "url": live_server.url}])
    page = context.new_page()
    shown = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d)? (EST|EDT)")
    try:
        page.goto(console.urls["job-running"])
        texts = page.locator("time[data-when]").all_inner_texts()
        assert len(texts) >= 3 and all(shown.fullmatch(t) for t in texts), texts
        page.locator("#gpu-charts .u-legend").first.wait_for()
        assert "America/New_York" in page.locator("#gpu-charts .u-legend").first.inner_text()
        assert page.evaluate("GC.when(Date.UTC(2026, 11, 3, 18, 4, 5))") == "2026-12-03 13:04:05 EST"
        page.goto(console.urls["service"])
        page.locator("#live-status[data-state='live']").wait_for()
        assert shown.search(page.locator("#live-status").inner_text())
    finally:
        context.close()

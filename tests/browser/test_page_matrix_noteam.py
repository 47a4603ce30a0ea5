"""The page matrix (tests/browser/page_matrix.py) as a user without a team."""

from __future__ import annotations

import pytest

from tests.browser.page_matrix import check_every_page
from tests.browser.page_matrix import console as matrix_console  # noqa: F401 - registers the `console` fixture

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_every_page_in_every_mode_as_a_user_without_a_team(console, browser, live_server):
    check_every_page(console, "noteam", browser, live_server)

"""The page matrix (tests/browser/page_matrix.py) as a member of a team."""

from __future__ import annotations

import pytest

from tests.browser.page_matrix import check_every_page
from tests.browser.page_matrix import console as matrix_console  # noqa: F401 - registers the `console` fixture

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_every_page_in_every_mode_as_a_team_member(console, browser, live_server):
    check_every_page(console, "member", browser, live_server)

"""A manager's team secrets in a real browser: create (the value shown once, copied), rotate, delete after confirming."""

from __future__ import annotations

import pytest

from apps.accounts.models import TeamSecret
from apps.accounts.secrets import secret_values

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_manager_manages_the_team_secrets(world, page_for, artifacts):
    page = page_for(world.manager)
    page.goto("/teams/vision/")
    page.get_by_role("link", name="Secrets").click()
    page.get_by_label("Name").fill("WANDB_API_KEY")
    page.get_by_label("Value").fill("wb-first")
    page.get_by_role("button", name="Save", exact=True).click()
    assert page.locator("#secret-value").input_value() == "wb-first"
    page.get_by_role("button", name="Copy").click()
    page.get_by_role("button", name="Copied").wait_for()
    page.screenshot(path=str(artifacts / "team-secrets.png"), full_page=True)
    page.goto("/teams/vision/secrets/")
    assert page.locator("#secret-value").count() == 0 and "wb-first" not in page.content()
    page.locator("summary", has_text="Rotate").click()
    page.get_by_label("New value of WANDB_API_KEY").fill("wb-second")
    page.get_by_role("button", name="Save new value").click()
    assert page.locator("#secret-shown h2").inner_text() == "WANDB_API_KEY, version 2"
    assert secret_values(world.vision.pk, ["WANDB_API_KEY"]) == {"WANDB_API_KEY": "wb-second"}
    page.get_by_role("link", name="Delete WANDB_API_KEY").click()
    page.get_by_role("button", name="Delete WANDB_API_KEY").click()
    assert "Secret WANDB_API_KEY deleted." in page.locator(".messages").inner_text()
    assert not TeamSecret.objects.exists()

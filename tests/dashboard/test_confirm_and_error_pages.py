"""Destructive actions ask first (apps/dashboard/confirm.py), and errors answer the console's own pages."""

from __future__ import annotations

import logging

import pytest

from apps.accounts.models import Membership
from apps.jobs.models import Job
from tests.dashboard.conftest import make_job


def test_cancel_without_confirm_answers_the_confirm_page_and_changes_nothing(world, web):
    job = make_job(world.vision, world.member, name="precious")
    client = web(world.member)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'data-confirm-text="Cancel job {job.pk} (precious)?' in page  # the dialog, with JavaScript
    response = client.post(f"/jobs/{job.pk}/cancel/", {"reason": "wrong data"})
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="confirm-step"' in html and f"Cancel job {job.pk}?" in html
    assert '<input type="hidden" name="confirm" value="yes">' in html
    assert '<input type="hidden" name="reason" value="wrong data">' in html  # the reason survives the step
    assert f'href="/jobs/{job.pk}/"' in html  # the way back
    assert Job.objects.get(pk=job.pk).state == Job.State.QUEUED
    client.post(f"/jobs/{job.pk}/cancel/", {"reason": "wrong data", "confirm": "yes"})
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED and "wrong data" in job.events.last().reason


def test_the_confirm_page_is_only_for_who_may_act(world, web):
    job = make_job(world.vision, world.member)
    assert web(world.viewer).post(f"/jobs/{job.pk}/cancel/").status_code == 403
    assert web(world.member2).post(f"/jobs/{job.pk}/cancel/").status_code == 403
    assert web(world.other).post(f"/jobs/{job.pk}/cancel/").status_code == 404
    assert web(world.member).post("/teams/vision/members/milo/remove/").status_code == 403
    assert Membership.objects.filter(team=world.vision, user=world.member2).exists()


def test_member_removal_asks_first(world, web):
    client = web(world.manager)
    assert 'data-confirm-text="Remove milo from vision?"' in client.get("/teams/vision/").content.decode()
    response = client.post("/teams/vision/members/milo/remove/")
    assert response.status_code == 200 and "Remove milo from vision?" in response.content.decode()
    assert Membership.objects.filter(team=world.vision, user=world.member2).exists()
    assert client.post("/teams/vision/members/milo/remove/", {"confirm": "yes"}).status_code == 302
    assert not Membership.objects.filter(team=world.vision, user=world.member2).exists()


@pytest.mark.parametrize("debug", [False, True])
def test_403_404_and_500_are_the_consoles_pages_with_debug_on_and_off(
    world, web, settings, debug, monkeypatch
):
    settings.DEBUG = debug
    client = web(world.viewer)
    for url in ("/no-such-page/", "/jobs/999999/"):
        response = client.get(url)
        assert response.status_code == 404 and 'id="error-404"' in response.content.decode(), url
        assert 'aria-label="Main"' in response.content.decode()  # the console's menu, not Django's debug page
    assert client.get("/api/v1/no-such-thing/").json() == {"detail": "Not found."}
    forbidden = client.get("/jobs/new/")
    assert forbidden.status_code == 403 and 'id="error-403"' in forbidden.content.decode()
    assert "may submit jobs" in forbidden.content.decode()

    from apps.dashboard import views

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(views, "cluster_overview", broken)
    failing = web(world.member)
    failing.raise_request_exception = False
    logging.getLogger("django.request").disabled = True  # the expected traceback, kept out of the output
    try:
        response = failing.get("/")
    finally:
        logging.getLogger("django.request").disabled = False
    assert response.status_code == 500
    assert 'id="error-500"' in response.content.decode() and "a bug" not in response.content.decode()

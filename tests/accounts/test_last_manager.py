"""A team that has a manager always keeps one: demoting or removing the last manager is refused with 409."""

from __future__ import annotations

from apps.accounts.models import Membership, Role
from apps.core.models import AuditEvent


def test_the_last_manager_can_neither_step_down_nor_leave(world, client_for):
    client = client_for(world.manager)
    response = client.patch("/api/v1/teams/vision/members/manny/", {"role": "member"}, format="json")
    assert response.status_code == 409 and "last manager" in response.json()["detail"]
    response = client.delete("/api/v1/teams/vision/members/manny/")
    assert response.status_code == 409
    assert Membership.objects.get(team=world.vision, user=world.manager).role == Role.MANAGER
    admin = client_for(world.admin)  # a site admin too
    assert admin.delete("/api/v1/teams/vision/members/manny/").status_code == 409
    assert not AuditEvent.objects.filter(action=AuditEvent.Action.MEMBER_REMOVED).exists()


def test_with_a_second_manager_the_first_may_go(world, client_for):
    client = client_for(world.manager)
    assert client.patch("/api/v1/teams/vision/members/milo/", {"role": "manager"}, format="json").status_code == 200
    assert client.patch("/api/v1/teams/vision/members/manny/", {"role": "member"}, format="json").status_code == 200
    milo = client_for(world.member2)
    assert milo.delete("/api/v1/teams/vision/members/milo/").status_code == 409  # now the last one
    assert milo.delete("/api/v1/teams/vision/members/manny/").status_code == 204


def test_the_page_says_why(world):
    from django.test import Client

    browser = Client()
    browser.force_login(world.manager)
    response = browser.post("/teams/vision/members/manny/role/", {"role": "viewer"}, follow=True)
    assert b"last manager" in response.content
    assert Membership.objects.get(team=world.vision, user=world.manager).role == Role.MANAGER

"""Team pages: members and roles through the accounts services; the quota request flow through quota_update."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.admin.sites import AdminSite
from django.contrib.messages.storage.fallback import FallbackStorage
from django.test import RequestFactory

from apps.accounts.models import Membership, Role
from apps.core.models import AuditEvent
from apps.quotas.admin import QuotaRequestAdmin, approve_requests, reject_requests
from apps.quotas.models import QuotaRequest, TeamQuota
from apps.quotas.services import QuotaRequestError, quota_request_decide


def test_team_page_shows_quota_usage_and_members(world, web):
    html = web(world.viewer).get("/teams/vision/").content.decode()
    assert "GPUs held now" in html and "manny" in html and "vic" in html
    assert 'id="member-add"' not in html and 'id="quota-request-form"' not in html  # no manager controls
    manager_html = web(world.manager).get("/teams/vision/").content.decode()
    assert 'id="member-add"' in manager_html and 'id="quota-request-form"' in manager_html
    teams = web(world.member).get("/teams/").content.decode()
    assert "vision" in teams and "nlp" not in teams


def test_manager_adds_changes_and_removes_members(world, web):
    client = web(world.manager)
    assert client.post("/teams/vision/members/", {"username": "nobody", "role": "viewer"}).status_code == 302
    assert Membership.objects.get(team=world.vision, user=world.noteam).role == Role.VIEWER
    client.post("/teams/vision/members/nobody/role/", {"role": "member"})
    assert Membership.objects.get(team=world.vision, user=world.noteam).role == Role.MEMBER
    client.post("/teams/vision/members/nobody/remove/", {"confirm": "yes"})
    assert not Membership.objects.filter(team=world.vision, user=world.noteam).exists()
    actions = list(AuditEvent.objects.filter(actor=world.manager).exclude(action="login").values_list("action", flat=True))
    assert sorted(actions) == ["member_removed", "role_changed", "role_changed"]


def test_add_member_bad_username_shows_a_field_error(world, web):
    response = web(world.manager).post("/teams/vision/members/", {"username": "ghost", "role": "member"})
    assert response.status_code == 400
    assert "No active user" in response.content.decode()
    assert Membership.objects.filter(team=world.vision).count() == 4


@pytest.mark.parametrize("persona", ["member", "viewer"])
def test_non_managers_cannot_change_members(world, web, persona):
    client = web(world.persona(persona))
    assert client.post("/teams/vision/members/", {"username": "nobody", "role": "manager"}).status_code == 403
    assert client.post("/teams/vision/members/mia/role/", {"role": "manager"}).status_code == 403
    assert client.post("/teams/vision/members/milo/remove/").status_code == 403
    assert client.post("/teams/vision/quota-requests/", {"max_gpus": "64", "reason": "more"}).status_code == 403
    assert Membership.objects.get(team=world.vision, user=world.member).role == Role.MEMBER
    assert Membership.objects.filter(team=world.vision).count() == 4
    assert not QuotaRequest.objects.exists()


def test_other_teams_are_404(world, web):
    client = web(world.other)
    assert client.get("/teams/vision/").status_code == 404
    assert client.post("/teams/vision/members/", {"username": "olga", "role": "manager"}).status_code == 404
    assert not Membership.objects.filter(team=world.vision, user=world.other).exists()


def test_quota_request_approve_flow_is_applied_and_audited(world, web):
    response = web(world.manager).post("/teams/vision/quota-requests/",
                                       {"max_gpus": "12", "gpu_hours_per_month": "500", "reason": "paper deadline"})
    assert response.status_code == 302
    quota_request = QuotaRequest.objects.get()
    assert (quota_request.state, quota_request.requested_by, quota_request.max_gpus) == ("pending", world.manager, 12)
    assert AuditEvent.objects.filter(action=AuditEvent.Action.QUOTA_REQUESTED, actor=world.manager).exists()
    # Only admins decide; the manager's own attempt is refused and changes nothing.
    url = f"/teams/vision/quota-requests/{quota_request.pk}/decision/"
    assert web(world.manager).post(url, {"decision": "approve"}).status_code == 403
    assert TeamQuota.objects.get(team=world.vision).max_gpus == 8
    assert "Approve" in web(world.admin).get("/teams/vision/").content.decode()
    assert "vision" in web(world.admin).get("/teams/").content.decode()
    web(world.admin).post(url, {"decision": "approve", "note": "ok for Q1"})
    quota = TeamQuota.objects.get(team=world.vision)
    assert (quota.max_gpus, quota.gpu_hours_per_month) == (12, Decimal("500.00"))
    quota_request.refresh_from_db()
    assert (quota_request.state, quota_request.decided_by, quota_request.decision_note) == (
        "approved", world.admin, "ok for Q1")
    assert quota_request.decided_at is not None
    changed = AuditEvent.objects.get(action=AuditEvent.Action.QUOTA_CHANGED)
    assert changed.details["max_gpus"] == {"old": 8, "new": 12} and changed.actor == world.admin
    decided = AuditEvent.objects.get(action=AuditEvent.Action.QUOTA_REQUEST_DECIDED)
    assert decided.details["decision"] == "approved"
    # A decided request cannot be decided again.
    again = web(world.admin).post(url, {"decision": "reject"}, follow=True)
    assert "already approved" in again.content.decode()


def test_quota_request_reject_changes_no_quota(world, web):
    web(world.manager).post("/teams/vision/quota-requests/", {"max_gpus": "64", "reason": "all of them"})
    quota_request = QuotaRequest.objects.get()
    web(world.admin).post(f"/teams/vision/quota-requests/{quota_request.pk}/decision/",
                          {"decision": "reject", "note": "no"})
    quota_request.refresh_from_db()
    assert quota_request.state == "rejected"
    assert TeamQuota.objects.get(team=world.vision).max_gpus == 8
    assert not AuditEvent.objects.filter(action=AuditEvent.Action.QUOTA_CHANGED).exists()
    assert AuditEvent.objects.get(action=AuditEvent.Action.QUOTA_REQUEST_DECIDED).details["decision"] == "rejected"


def test_quota_request_form_needs_something_and_a_reason(world, web):
    response = web(world.manager).post("/teams/vision/quota-requests/", {"reason": "more"})
    assert response.status_code == 400 and "Ask for more GPUs" in response.content.decode()
    response = web(world.manager).post("/teams/vision/quota-requests/", {"max_gpus": "-1", "reason": ""})
    assert response.status_code == 400
    assert not QuotaRequest.objects.exists()


def test_service_refuses_non_admin_decisions(world):
    quota_request = QuotaRequest.objects.create(team=world.vision, requested_by=world.manager, max_gpus=10,
                                                reason="x")
    with pytest.raises(QuotaRequestError):
        quota_request_decide(quota_request=quota_request, approve=True, actor=world.manager)
    assert QuotaRequest.objects.get().state == "pending"


def test_admin_actions_approve_and_reject(world):
    approve = QuotaRequest.objects.create(team=world.vision, requested_by=world.manager, max_gpus=10, reason="a")
    reject = QuotaRequest.objects.create(team=world.nlp, requested_by=world.admin, max_gpus=20, reason="b")
    request = RequestFactory().post("/admin/")
    request.user = world.admin
    request.session = {}
    request._messages = FallbackStorage(request)
    model_admin = QuotaRequestAdmin(QuotaRequest, AdminSite())
    approve_requests(model_admin, request, QuotaRequest.objects.filter(pk=approve.pk))
    reject_requests(model_admin, request, QuotaRequest.objects.filter(pk=reject.pk))
    assert TeamQuota.objects.get(team=world.vision).max_gpus == 10
    assert TeamQuota.objects.get(team=world.nlp).max_gpus == 8
    assert QuotaRequest.objects.get(pk=reject.pk).state == "rejected"
    assert AuditEvent.objects.filter(action=AuditEvent.Action.QUOTA_REQUEST_DECIDED).count() == 2


def test_admin_changelist_renders(world, web):
    QuotaRequest.objects.create(team=world.vision, requested_by=world.manager, max_gpus=10, reason="a")
    assert web(world.admin).get("/admin/quotas/quotarequest/").status_code == 200

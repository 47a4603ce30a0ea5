from __future__ import annotations

from django.test import Client

from apps.core.models import AuditEvent


def test_browser_login_logout_is_audited(world):
    client = Client()
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b'name="password"' in page.content
    response = client.post("/accounts/login/", {"username": "mia", "password": "pw-for-tests-123"})
    assert response.status_code == 302
    assert client.get("/").status_code == 200
    assert client.post("/accounts/logout/").status_code == 302
    actions = list(AuditEvent.objects.order_by("id").values_list("action", flat=True))
    assert actions == ["login", "logout"]


def test_failed_login_shows_error_and_is_audited(world):
    response = Client().post("/accounts/login/", {"username": "mia", "password": "wrong"})
    assert response.status_code == 200 and b"didn't match" in response.content
    assert AuditEvent.objects.get().action == "login_failed"


def test_home_requires_login(db):
    response = Client().get("/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_admin_login_page_and_audit_admin(world):
    client = Client()
    assert client.get("/admin/login/").status_code == 200
    client.force_login(world.admin)
    for path in ["/admin/", "/admin/core/auditevent/", "/admin/accounts/team/", "/admin/quotas/teamquota/",
                 "/admin/cluster/host/", "/admin/jobs/job/"]:
        assert client.get(path).status_code == 200, path

"""Every change made in the Django admin site, and every host drain, is in the audit log."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model

from apps.cluster.models import Host
from apps.core.admin_audit import AuditedAdminMixin
from apps.core.models import AuditEvent
from apps.quotas.models import UserQuota


def test_every_registered_admin_is_audited():
    assert admin.site._registry  # the project's and Django's own (users, groups)
    assert get_user_model() in admin.site._registry
    unaudited = [str(model) for model, model_admin in admin.site._registry.items()
                 if not isinstance(model_admin, AuditedAdminMixin)]
    assert unaudited == []


def test_admin_add_change_and_delete_are_audited(world, client):
    client.force_login(world.admin)
    added = client.post("/admin/quotas/userquota/add/",
                        {"team": world.vision.pk, "user": world.member.pk, "max_gpus": 2})
    assert added.status_code == 302, added.content.decode()[-2000:]
    quota = UserQuota.objects.get()
    changed = client.post(f"/admin/quotas/userquota/{quota.pk}/change/",
                          {"team": world.vision.pk, "user": world.member.pk, "max_gpus": 4})
    assert changed.status_code == 302
    client.post(f"/admin/quotas/userquota/{quota.pk}/delete/", {"post": "yes"})
    assert not UserQuota.objects.exists()
    events = list(AuditEvent.objects.filter(action=AuditEvent.Action.ADMIN_CHANGED).order_by("pk"))
    assert [e.details["operation"] for e in events] == ["added", "changed", "deleted"]
    assert all(e.actor_name == "root-admin" and e.details["model"] == "quotas.userquota" for e in events)
    assert events[1].details["change"] == [{"changed": {"fields": ["Max gpus"]}}]


def test_a_user_changed_in_the_admin_is_audited(world, client):
    client.force_login(world.admin)
    response = client.post("/admin/auth/user/", {"action": "delete_selected", "_selected_action": [world.noteam.pk],
                                                 "post": "yes"})
    assert response.status_code == 302
    event = AuditEvent.objects.get(action=AuditEvent.Action.ADMIN_CHANGED)
    assert event.details["operation"] == "deleted" and "nobody" in event.target


def test_drains_are_audited(world, client):
    client.force_login(world.admin)
    host = Host.objects.get(name="node-a")
    for action in ("start_draining", "start_draining", "stop_draining"):
        client.post("/admin/cluster/host/", {"action": action, "_selected_action": [host.pk]})
    host.refresh_from_db()
    assert host.state == Host.State.UP and not host.drain
    drains = list(AuditEvent.objects.filter(action=AuditEvent.Action.HOST_DRAIN).order_by("pk"))
    # (draining a host that already drains changes nothing and records nothing)
    assert [e.details["draining"] for e in drains] == [True, False]
    assert drains[0].target == "host node-a" and drains[0].actor_name == "root-admin"

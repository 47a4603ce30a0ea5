from __future__ import annotations

import pytest

from apps.accounts.models import ApiToken
from apps.core.models import AuditEvent
from apps.dashboard.services import AlertPermissionError, alert_acknowledge
from apps.telemetry.models import Alert, AlertRule


@pytest.fixture
def alerts(world):
    rule = AlertRule.objects.create(name="test-rule", kind=AlertRule.Kind.JOB_IDLE, severity="critical")
    return {
        "vision": Alert.objects.create(rule=rule, subject="job:1", team=world.vision, message="vision job idle"),
        "nlp": Alert.objects.create(rule=rule, subject="job:2", team=world.nlp, message="nlp job idle"),
        "hardware": Alert.objects.create(rule=rule, subject="gpu:x", host=world.gpus[0].host, gpu=world.gpus[0],
                                         message="GPU hot"),
    }


def test_alert_list_visibility(world, web, alerts):
    html = web(world.viewer).get("/alerts/").content.decode()
    assert "vision job idle" in html and "GPU hot" in html and "nlp job idle" not in html
    assert ">Acknowledge<" not in html
    assert "nlp job idle" in web(world.admin).get("/alerts/").content.decode()
    assert "GPU hot" not in web(world.noteam).get("/alerts/").content.decode()
    firing = web(world.admin).get("/alerts/?state=resolved").content.decode()
    assert "GPU hot" not in firing


def test_manager_acknowledges_own_team_alert_only(world, web, alerts):
    client = web(world.manager)
    html = client.get("/alerts/").content.decode()
    assert html.count(">Acknowledge<") == 1  # the team's alert; hardware alerts are for admins
    assert client.post(f"/alerts/{alerts['vision'].pk}/ack/").status_code == 302
    alert = Alert.objects.get(pk=alerts["vision"].pk)
    assert (alert.state, alert.acknowledged_by) == ("acknowledged", world.manager) and alert.acknowledged_at
    assert client.post(f"/alerts/{alerts['hardware'].pk}/ack/").status_code == 403
    assert client.post(f"/alerts/{alerts['nlp'].pk}/ack/").status_code == 404
    assert Alert.objects.get(pk=alerts["hardware"].pk).state == "firing"
    assert Alert.objects.get(pk=alerts["nlp"].pk).state == "firing"


def test_members_cannot_acknowledge_and_admins_can(world, web, alerts):
    assert web(world.member).post(f"/alerts/{alerts['vision'].pk}/ack/").status_code == 403
    assert Alert.objects.get(pk=alerts["vision"].pk).state == "firing"
    with pytest.raises(AlertPermissionError):
        alert_acknowledge(alert=alerts["vision"], actor=world.viewer)
    web(world.admin).post(f"/alerts/{alerts['hardware'].pk}/ack/", {"state": "firing"})
    assert Alert.objects.get(pk=alerts["hardware"].pk).state == "acknowledged"
    assert alert_acknowledge(alert=alerts["hardware"], actor=world.admin) is False  # no longer firing


def test_overview_counts_visible_firing_alerts(world, web, alerts):
    assert web(world.viewer).get("/").context["overview"].active_alerts == 2
    assert web(world.admin).get("/").context["overview"].active_alerts == 3


def test_token_created_shown_once_listed_and_revoked(world, web):
    client = web(world.member)
    response = client.post("/accounts/tokens/", {"name": "laptop", "expires_in_days": "7"})
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    secret = response.context["secret"]
    assert secret and secret in response.content.decode()
    token = ApiToken.objects.get(user=world.member)
    assert token.name == "laptop" and token.prefix == secret[:12]
    listing = client.get("/accounts/tokens/").content.decode()
    assert "laptop" in listing and secret not in listing
    assert client.post(f"/accounts/tokens/{token.pk}/revoke/").status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert set(AuditEvent.objects.filter(actor=world.member).values_list("action", flat=True)) >= {
        "token_created", "token_revoked"}


def test_token_form_errors_and_others_tokens_are_404(world, web):
    response = web(world.member).post("/accounts/tokens/", {"name": "", "expires_in_days": "0"})
    assert response.status_code == 400 and not ApiToken.objects.exists()
    web(world.other).post("/accounts/tokens/", {"name": "olgas"})
    token = ApiToken.objects.get()
    assert web(world.member).post(f"/accounts/tokens/{token.pk}/revoke/").status_code == 404
    assert web(world.member).get("/accounts/tokens/").content.decode().count("olgas") == 0
    token.refresh_from_db()
    assert token.revoked_at is None


def test_password_change(world, web):
    client = web(world.member)
    bad = client.post("/accounts/password_change/", {"old_password": "wrong", "new_password1": "x",
                                                     "new_password2": "y"})
    assert bad.status_code == 200 and bad.context["form"].errors
    response = client.post("/accounts/password_change/", {
        "old_password": "pw-for-tests-123", "new_password1": "A-much-better-pass-42",
        "new_password2": "A-much-better-pass-42"})
    assert response.status_code == 302 and response["Location"] == "/accounts/password_change/done/"
    world.member.refresh_from_db()
    assert world.member.check_password("A-much-better-pass-42")
    assert client.get("/accounts/password_change/done/").status_code == 200

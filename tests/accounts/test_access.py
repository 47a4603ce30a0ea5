"""The access policy (apps/accounts/access.py) on its own: every action on every kind of object, per persona.

`can` and `restrict` must agree on every (persona, action, object): a rule changed in one and not the other fails.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from apps.accounts import access
from apps.accounts.access import Action, Viewer
from apps.accounts.models import ApiToken, Membership, TeamSecret
from apps.accounts.services import token_create
from apps.cluster.models import Host, Volume
from apps.core.models import AuditEvent
from apps.jobs.models import Job, JobEvent
from apps.quotas.models import QuotaRequest, TeamQuota
from apps.serving.models import InferenceService
from apps.telemetry.models import Alert, AlertRule

PERSONAS = ["admin", "manager", "member", "member2", "viewer", "other", "noteam", "anonymous"]
ALL = set(PERSONAS) - {"anonymous"}
VISION = {"admin", "manager", "member", "member2", "viewer"}
NLP = {"admin", "other"}
ANY_TEAM = VISION | {"other"}


@pytest.fixture
def objects(world):
    """One object of every kind the policy knows, most of them in team vision."""
    job = Job.objects.create(name="j", team=world.vision, user=world.member, gpus=1, preset="baseline-fp32",
                             workload={"builtin": "mlp-digits"}, time_limit_minutes=60)
    nlp_job = Job.objects.create(name="n", team=world.nlp, user=world.other, gpus=1, preset="baseline-fp32",
                                 workload={"builtin": "mlp-digits"}, time_limit_minutes=60)
    # Submitted while its owner was a member; the owner is a viewer now and may no longer cancel it.
    viewer_job = Job.objects.create(name="v", team=world.vision, user=world.viewer, gpus=1, preset="baseline-fp32",
                                    workload={"builtin": "mlp-digits"}, time_limit_minutes=60)
    rule = AlertRule.objects.create(name="r", kind=AlertRule.Kind.GPU_XID)
    token, _ = token_create(user=world.member, name="t")
    vision_volume = Volume.objects.create(name="imagenet", host_path="/data/imagenet", target="/mnt/imagenet")
    vision_volume.teams.set([world.vision])
    return {
        "team": world.vision,
        "membership": Membership.objects.get(team=world.vision, user=world.member),
        "quota": TeamQuota.objects.get(team=world.vision),
        "quota_request": QuotaRequest.objects.create(team=world.vision, requested_by=world.manager, max_gpus=9),
        "job": job,
        "nlp_job": nlp_job,
        "viewer_job": viewer_job,
        "job_event": JobEvent.objects.create(job=job, to_state="queued", reason="r"),
        "service": InferenceService.objects.create(team=world.vision, name="s", owner=world.member,
                                                   workload="mlp-digits"),
        "alert": Alert.objects.create(rule=rule, subject="a", message="m", team=world.vision, job=job),
        "cluster_alert": Alert.objects.create(rule=rule, subject="b", message="m"),
        "host": Host.objects.get(name="node-a"),
        "user": world.member,
        "token": token,
        "rule": rule,
        "audit": AuditEvent.objects.first() or AuditEvent.objects.create(action="token_created", target="t"),
        "secret": TeamSecret.objects.create(team=world.vision, name="WANDB_API_KEY", ciphertext="x"),
        "vision_volume": vision_volume,
        "shared_volume": Volume.objects.create(name="scratch", host_path="/scratch", target="/scratch",
                                               all_teams=True),
        "unused_volume": Volume.objects.create(name="unused", host_path="/unused", target="/mnt/unused"),
    }


# (object, action) -> the personas allowed; a pair not listed: admins only.
EXPECTED: dict[tuple[str, Action], set[str]] = {
    ("team", Action.VIEW): VISION,
    ("team", Action.SUBMIT): VISION - {"viewer"},
    ("team", Action.MANAGE_SERVICE): VISION - {"viewer"},
    ("team", Action.SUBMIT_HIGH): {"admin", "manager"},
    ("team", Action.MANAGE_MEMBERS): {"admin", "manager"},
    ("team", Action.REQUEST_QUOTA): {"admin", "manager"},
    ("team", Action.VIEW_REPORT): {"admin", "manager"},
    ("team", Action.CANCEL): {"admin", "manager"},
    ("team", Action.ACK_ALERT): {"admin", "manager"},
    ("membership", Action.VIEW): VISION,
    ("membership", Action.MANAGE_MEMBERS): {"admin", "manager"},
    ("quota", Action.VIEW): VISION,
    ("quota_request", Action.VIEW): VISION,
    ("job", Action.VIEW): VISION,
    ("job", Action.CANCEL): {"admin", "manager", "member"},  # member owns it; member2 does not
    ("viewer_job", Action.CANCEL): {"admin", "manager"},
    ("nlp_job", Action.VIEW): NLP,
    ("nlp_job", Action.CANCEL): NLP,
    ("job_event", Action.VIEW): VISION,
    ("service", Action.VIEW): VISION,
    ("service", Action.MANAGE_SERVICE): VISION - {"viewer"},
    ("alert", Action.VIEW): VISION,
    ("alert", Action.ACK_ALERT): {"admin", "manager"},
    ("cluster_alert", Action.VIEW): ANY_TEAM,
    ("host", Action.VIEW): ANY_TEAM,
    ("user", Action.VIEW): {"admin", "member"},
    ("vision_volume", Action.VIEW): VISION,
    ("shared_volume", Action.VIEW): ANY_TEAM,
}
# Team-scoped (object, action) pairs not in EXPECTED fall back to the action's role in the object's team.
TEAM_ROLE = {Action.VIEW: VISION, Action.SUBMIT: VISION - {"viewer"}, Action.MANAGE_SERVICE: VISION - {"viewer"},
             Action.SUBMIT_HIGH: {"admin", "manager"}, Action.CANCEL: {"admin", "manager"},
             Action.MANAGE_MEMBERS: {"admin", "manager"}, Action.REQUEST_QUOTA: {"admin", "manager"},
             Action.VIEW_REPORT: {"admin", "manager"}, Action.ACK_ALERT: {"admin", "manager"},
             Action.MANAGE_SECRETS: {"admin", "manager"}}
TEAM_SCOPED = {"team", "membership", "quota", "quota_request", "job", "viewer_job", "job_event", "service", "alert",
               "secret"}


def expected(kind: str, action: Action) -> set[str]:
    if (kind, action) in EXPECTED:
        return EXPECTED[(kind, action)]
    if kind == "token":
        return {"member"}
    if kind == "nlp_job":  # other is a member of nlp and owns the job
        return NLP if action in {Action.VIEW, Action.SUBMIT, Action.MANAGE_SERVICE, Action.CANCEL} else {"admin"}
    if kind in TEAM_SCOPED:
        return TEAM_ROLE.get(action, {"admin"})
    return {"admin"}


@pytest.mark.parametrize("persona", PERSONAS)
def test_can_and_restrict_follow_the_table_and_agree(world, objects, persona):
    user = world.persona(persona)
    wrong = []
    for kind, obj in objects.items():
        for action in Action:
            allowed = persona in expected(kind, action)
            decided = access.can(user, action, obj)
            restricted = access.restrict(type(obj).objects.filter(pk=obj.pk), user, action).exists()
            if decided != allowed or restricted != allowed:
                wrong.append((kind, str(action), f"expected {allowed}", f"can {decided}", f"restrict {restricted}"))
    assert not wrong


@pytest.mark.parametrize("persona", PERSONAS)
def test_site_wide_actions_are_for_admins(world, persona):
    user = world.persona(persona)
    for action in Action:
        assert access.can(user, action) == (persona == "admin"), action


def test_require_raises_a_permission_denied(world, objects):
    from django.core.exceptions import PermissionDenied

    from apps.jobs.errors import JobPermissionError

    access.require(world.manager, Action.MANAGE_MEMBERS, world.vision)
    with pytest.raises(access.AccessDenied, match="managers"):
        access.require(world.member, Action.MANAGE_MEMBERS, world.vision)
    assert issubclass(access.AccessDenied, PermissionDenied) and issubclass(JobPermissionError, access.AccessDenied)


def test_an_inactive_user_may_do_nothing(world, objects):
    for user in (world.admin, world.manager):
        user.is_active = False
        user.save()
        assert not any(access.can(user, action, obj) for obj in objects.values() for action in Action)
        assert not access.restrict(Job.objects.all(), user).exists()
        assert access.viewer(user) == access.NOBODY


def test_every_model_with_a_team_or_owner_has_a_scope():
    """A new model that belongs to a team must be given a scope, or nobody but... nobody sees it (fail closed)."""
    from django.apps import apps

    missing = []
    for model in apps.get_models():
        if not model.__module__.startswith("apps."):
            continue
        fields = {f.name for f in model._meta.get_fields()}
        if "team" in fields and access.scope_of(model) is None:
            missing.append(model._meta.label_lower)
    # Rows no user reads directly (ledgers, per-user quotas, the scheduler's records) are not listed on purpose.
    assert set(missing) <= {"jobs.usagesegment", "quotas.userquota"}, missing


def test_unknown_models_are_refused(world):
    from apps.jobs.models import JobLogChunk

    assert access.restrict(JobLogChunk.objects.all(), world.admin).query.is_empty()


def test_viewer_and_the_audience_of_live_events(world):
    admin, member, other, noteam = (access.viewer(u) for u in (world.admin, world.member, world.other, world.noteam))
    assert admin.is_admin and member.teams == {"vision"} and other.teams == {"nlp"} and noteam == Viewer(
        world.noteam.pk, False, frozenset())
    assert access.live_audience([admin, member, other, noteam], "vision") == [admin, member]
    assert access.live_audience([admin, member, other, noteam], None) == [admin, member, other]
    assert access.visible_queue({"vision": 2, "nlp": 1}, member) == {"vision": 2}
    assert access.visible_queue({"vision": 2, "nlp": 1}, admin) == {"vision": 2, "nlp": 1}


def test_visible_gpu_hides_another_teams_job(world):
    gpu = {"uuid": "g", "job": 7, "team": "nlp", "processes": [{"pid": 1}],
           "jobs": [{"job": 7, "team": "nlp"}, {"job": 8, "team": "vision"}]}
    member = access.viewer(world.member)
    seen = access.visible_gpu(gpu, member)
    assert seen == {"uuid": "g", "job": 8, "team": "vision", "jobs": [{"job": 8, "team": "vision"}],
                    "other_team": True}
    assert access.visible_gpu(gpu, access.viewer(world.admin)) == {k: v for k, v in gpu.items() if k != "processes"}
    only_theirs = access.visible_gpu({**gpu, "jobs": gpu["jobs"][:1]}, member)
    assert only_theirs["job"] is None and only_theirs["team"] is None and only_theirs["other_team"] is True


def test_users_and_tokens(world):
    token, _ = token_create(user=world.member, name="x")
    assert list(access.restrict(ApiToken.objects.all(), world.admin)) == []
    assert list(access.restrict(ApiToken.objects.all(), world.member)) == [token]
    users = get_user_model().objects.all()
    assert list(access.restrict(users, world.member)) == [world.member]
    assert access.restrict(users, world.admin).count() == users.count()


def test_role_may_is_what_can_decides_for_a_role():
    from apps.accounts.models import Role

    assert access.role_may(Role.MEMBER, Action.SUBMIT) and not access.role_may(Role.VIEWER, Action.SUBMIT)
    assert not access.role_may(Role.MEMBER, Action.SUBMIT_HIGH) and access.role_may("manager", Action.SUBMIT_HIGH)
    assert not access.role_may(Role.MANAGER, Action.SUBMIT_URGENT) and access.role_may(None, Action.SUBMIT_URGENT,
                                                                                          admin=True)
    assert not access.role_may(None, Action.VIEW)

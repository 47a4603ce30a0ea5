"""The access matrix: every URL pattern, API route and websocket route, for seven personas.

The routes are read from the resolver (console.urls) and the websocket router (console.routing): a route added
without a row here fails `test_every_route_is_in_the_matrix`. Each row is one request and the status each persona
gets. Personas: admin (staff), manager and member of team vision, other (member of nlp), noteam (no role),
anonymous, and host (a host agent's token, a machine credential that holds no role).

A row's answer is what the policy (apps/accounts/access.py) decides; `test_a_broken_policy_fails_the_matrix`
shows that a policy allowing everything, or one role check changed, fails it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.test import Client
from django.urls import URLResolver, get_resolver
from rest_framework.test import APIClient

from apps.accounts import access
from apps.accounts.secrets import secret_create
from apps.accounts.services import token_create
from apps.cluster.services import host_token_issue
from apps.cluster.volumes import volume_create
from apps.jobs.models import Job
from apps.quotas.models import QuotaRequest
from apps.serving.models import InferenceService
from apps.telemetry.models import Alert, AlertRule, JobGpuStats

PERSONAS = ["admin", "manager", "member", "other", "noteam", "anonymous", "host"]


@dataclass
class Fixture:
    world: Any
    vjob: Job  # team vision, submitted by milo (not one of the personas: member may not cancel it)
    mine: Job  # team vision, submitted by member
    njob: Job  # team nlp
    service: InferenceService  # team vision
    alert: Alert  # team vision, firing
    cluster_alert: Alert  # no team, firing
    rule: AlertRule
    quota_request: QuotaRequest  # team vision, pending
    token_id: int  # member's API token
    host_secret: str
    audit_id: int
    snapshot_id: str  # a code snapshot of team vision, uploaded by member


def _job(team, user, name: str) -> Job:
    return Job.objects.create(name=name, team=team, user=user, gpus=1, preset="baseline-fp32",
                              workload={"builtin": "mlp-digits"}, time_limit_minutes=60)


def _archive() -> SimpleUploadedFile:
    from tests.jobs.conftest import tar_gz

    return SimpleUploadedFile("code.tar.gz", tar_gz({"main.py": b"print(1)\n"}))


@pytest.fixture
def fx(world, settings, tmp_path) -> Fixture:
    from apps.core.models import AuditEvent
    from apps.jobs.code_snapshots import code_snapshot_create

    settings.ARTIFACT_STORE_URL = (tmp_path / "artifacts").as_uri()
    snapshot = code_snapshot_create(user=world.member, team_slug="vision", chunks=_archive().chunks())

    rule = AlertRule.objects.create(name="xid (matrix)", kind=AlertRule.Kind.GPU_XID)
    vjob, mine, njob = _job(world.vision, world.member2, "v"), _job(world.vision, world.member, "m"), _job(
        world.nlp, world.other, "n")
    JobGpuStats.objects.create(job=vjob, samples=2, utilization_sum=100.0, utilization_max=60.0, energy_j=3600.0)
    token, _ = token_create(user=world.member, name="matrix")
    _, secret = host_token_issue(name="node-a")
    secret_create(team=world.vision, name="WANDB_API_KEY", value="v1", actor=world.manager)
    volume_create(actor=world.admin, name="imagenet", host_path="/data/imagenet", teams=[world.vision])
    return Fixture(
        world=world, vjob=vjob, mine=mine, njob=njob,
        service=InferenceService.objects.create(team=world.vision, name="digits", owner=world.member,
                                                workload="mlp-digits", state=InferenceService.State.ACTIVE),
        alert=Alert.objects.create(rule=rule, subject="gpu:1", message="m", team=world.vision, job=vjob),
        cluster_alert=Alert.objects.create(rule=rule, subject="gpu:2", message="m"),
        rule=rule,
        quota_request=QuotaRequest.objects.create(team=world.vision, requested_by=world.manager, max_gpus=9,
                                                  reason="more"),
        token_id=token.pk, host_secret=secret, audit_id=AuditEvent.objects.order_by("pk").first().pk,
        snapshot_id=str(snapshot.pk),
    )


def api_client(fx: Fixture, persona: str) -> APIClient:
    if persona == "host":
        return APIClient(HTTP_AUTHORIZATION=f"Host {fx.host_secret}")
    client = APIClient()
    user = fx.world.persona(persona) if persona != "host" else None
    if user is not None:
        client.force_authenticate(user)
    return client


def page_client(fx: Fixture, persona: str) -> Client:
    if persona == "host":
        return Client(HTTP_AUTHORIZATION=f"Host {fx.host_secret}")
    client = Client()
    user = fx.world.persona(persona)
    if user is not None:
        client.force_login(user)
    return client


def statuses(admin, manager, member, other, noteam, anonymous, host) -> dict[str, int]:
    return dict(zip(PERSONAS, (admin, manager, member, other, noteam, anonymous, host), strict=True))


def same(code: int, anonymous: int = 401, host: int | None = None) -> dict[str, int]:
    """Every logged-in persona gets `code`."""
    return statuses(code, code, code, code, code, anonymous, anonymous if host is None else host)


@dataclass
class Row:
    method: str
    path: Callable[[Fixture], str]
    expected: dict[str, int]
    data: Callable[[Fixture], dict] | dict | None = None
    kind: str = "api"  # "api": DRF client with JSON; "page": a browser's client, form-encoded; "upload": multipart
    note: str = ""


# Answers the same for every persona that has no session: 302 to the login page for pages, 401 for the API.
LOGIN = 302
VISION = statuses(200, 200, 200, 404, 404, 401, 401)  # vision's members see it; others: 404 (no existence leak)
VISION_PAGE = statuses(200, 200, 200, 404, 404, LOGIN, LOGIN)
ADMIN_ONLY = statuses(200, 403, 403, 403, 403, 401, 401)
ADMIN_PAGE_403 = statuses(302, 403, 403, 404, 404, LOGIN, LOGIN)

# pattern (as the resolver spells it) -> the requests that exercise it
MATRIX: dict[str, list[Row]] = {
    # --- machine endpoints and the outside world
    "metrics": [Row("GET", lambda f: "/metrics", statuses(200, 401, 401, 401, 401, 401, 401), kind="page",
                    note="Prometheus: staff sessions (or the scrape token) only")],
    "serve/<slug:team>/<slug:service>/predict": [
        Row("POST", lambda f: "/serve/vision/digits/predict", statuses(401, 401, 401, 401, 401, 401, 401),
            kind="page", data={"inputs": [[1]]}, note="the gateway takes API tokens only, never a session"),
    ],
    "accounts/login/": [Row("GET", lambda f: "/accounts/login/", same(200, anonymous=200, host=200), kind="page")],
    "accounts/logout/": [Row("POST", lambda f: "/accounts/logout/", same(302, anonymous=302, host=302),
                             kind="page")],
    "api/v1/auth/token/": [Row("POST", lambda f: "/api/v1/auth/token/", same(400, anonymous=400, host=400),
                               data={"username": "mia", "password": "wrong"})],
    "api/v1/agent/register/": [Row("POST", lambda f: "/api/v1/agent/register/",
                                   statuses(403, 403, 403, 403, 403, 401, 400), data={})],
    "api/v1/agent/heartbeat/": [Row("POST", lambda f: "/api/v1/agent/heartbeat/",
                                    statuses(403, 403, 403, 403, 403, 401, 200), data={})],
    "api/v1/agent/telemetry/": [Row("POST", lambda f: "/api/v1/agent/telemetry/",
                                    statuses(403, 403, 403, 403, 403, 401, 400), data={"gpus": "x"})],
    "api/v1/agent/jobs/<int:job_id>/status/": [Row("POST", lambda f: f"/api/v1/agent/jobs/{f.vjob.pk}/status/",
                                                   statuses(403, 403, 403, 403, 403, 401, 400), data={})],
    "api/v1/agent/jobs/<int:job_id>/logs/": [Row("POST", lambda f: f"/api/v1/agent/jobs/{f.vjob.pk}/logs/",
                                                 statuses(403, 403, 403, 403, 403, 401, 400), data={})],
    "api/v1/agent/jobs/<int:job_id>/progress/": [
        Row("POST", lambda f: f"/api/v1/agent/jobs/{f.vjob.pk}/progress/",
            statuses(403, 403, 403, 403, 403, 401, 400), data={})],
    # a job's secret values: only the host its current attempt is placed on (this host holds none of it: 409)
    "api/v1/agent/jobs/<int:job_id>/secrets/": [
        Row("GET", lambda f: f"/api/v1/agent/jobs/{f.vjob.pk}/secrets/?attempt=1",
            statuses(403, 403, 403, 403, 403, 401, 409))],
    # the job API: a running job's own attempt token, nothing else (a person: 403; a host: 401)
    "api/v1/job/": [Row("GET", lambda f: "/api/v1/job/", same(403, host=401))],
    "api/v1/job/progress/": [Row("POST", lambda f: "/api/v1/job/progress/", same(403, host=401), data={})],
    "api/v1/job/artifacts/": [Row("GET", lambda f: "/api/v1/job/artifacts/", same(403, host=401))],
    "api/v1/job/artifacts/<path:path>": [Row("GET", lambda f: "/api/v1/job/artifacts/a.txt",
                                             same(403, host=401))],
    "api/v1/job/code/": [Row("GET", lambda f: "/api/v1/job/code/", same(403, host=401))],
    # --- code snapshots: the team's members (those who submit upload; another team's: 404, or 400 on team)
    "api/v1/code-snapshots/": [
        Row("POST", lambda f: "/api/v1/code-snapshots/", statuses(201, 201, 201, 400, 400, 401, 401),
            data=lambda f: {"team": "vision", "archive": _archive()}, kind="upload")],
    "api/v1/code-snapshots/<uuid:snapshot_id>/": [
        Row("GET", lambda f: f"/api/v1/code-snapshots/{f.snapshot_id}/", VISION)],
    "api/v1/code-snapshots/<uuid:snapshot_id>/download/": [
        Row("GET", lambda f: f"/api/v1/code-snapshots/{f.snapshot_id}/download/", VISION)],
    "api/v1/ws-ticket/": [Row("POST", lambda f: "/api/v1/ws-ticket/", same(201))],
    # --- teams, members, quotas
    "api/v1/^teams/$": [
        Row("GET", lambda f: "/api/v1/teams/", same(200)),
        Row("POST", lambda f: "/api/v1/teams/", statuses(201, 403, 403, 403, 403, 401, 401),
            data={"slug": "robotics"}),
    ],
    "api/v1/^teams/(?P<slug>[^/.]+)/$": [
        Row("GET", lambda f: "/api/v1/teams/vision/", VISION),
        Row("PATCH", lambda f: "/api/v1/teams/vision/", statuses(200, 403, 403, 403, 403, 401, 401),
            data={"name": "Vision!"}),
        Row("DELETE", lambda f: "/api/v1/teams/vision/", statuses(409, 403, 403, 403, 403, 401, 401),
            note="a team with jobs is kept"),
    ],
    "api/v1/teams/<slug:slug>/members/": [
        Row("GET", lambda f: "/api/v1/teams/vision/members/", VISION),
        Row("POST", lambda f: "/api/v1/teams/vision/members/", statuses(201, 201, 403, 404, 404, 401, 401),
            data={"username": "nobody", "role": "viewer"}),
    ],
    "api/v1/teams/<slug:slug>/members/<str:username>/": [
        Row("GET", lambda f: "/api/v1/teams/vision/members/milo/", VISION),
        Row("PATCH", lambda f: "/api/v1/teams/vision/members/milo/", statuses(200, 200, 403, 404, 404, 401, 401),
            data={"role": "viewer"}),
        Row("DELETE", lambda f: "/api/v1/teams/vision/members/milo/",
            statuses(204, 204, 403, 404, 404, 401, 401)),
    ],
    "api/v1/teams/<slug:slug>/quota/": [
        Row("GET", lambda f: "/api/v1/teams/vision/quota/", VISION),
        Row("PATCH", lambda f: "/api/v1/teams/vision/quota/", statuses(200, 403, 403, 404, 404, 401, 401),
            data={"max_gpus": 12}),
    ],
    "api/v1/teams/<slug:slug>/usage/": [Row("GET", lambda f: "/api/v1/teams/vision/usage/", VISION)],
    # Issue 18: history series. Hosts and GPUs are cluster-wide; a queue and an allocation belong to their team.
    "api/v1/metrics/cluster/": [Row("GET", lambda f: "/api/v1/metrics/cluster/?range=1h", same(200),
                                    note="no team: empty series")],
    "api/v1/hosts/<str:name>/metrics/": [Row("GET", lambda f: "/api/v1/hosts/node-a/metrics/",
                                             statuses(200, 200, 200, 200, 404, 401, 401))],
    "api/v1/gpus/<str:uuid>/metrics/": [Row("GET", lambda f: "/api/v1/gpus/GPU-node-a-0/metrics/?range=24h",
                                            statuses(200, 200, 200, 200, 404, 401, 401))],
    "api/v1/teams/<slug:slug>/allocation/": [Row("GET", lambda f: "/api/v1/teams/vision/allocation/?range=7d",
                                                 VISION)],
    # --- team secrets: names for the team, changes for its managers; others do not learn the team has any
    "api/v1/teams/<slug:slug>/secrets/": [
        Row("GET", lambda f: "/api/v1/teams/vision/secrets/", VISION),
        Row("POST", lambda f: "/api/v1/teams/vision/secrets/", statuses(201, 201, 403, 404, 404, 401, 401),
            data={"name": "HF_TOKEN", "value": "hf-1"}),
    ],
    "api/v1/teams/<slug:slug>/secrets/<str:name>/": [
        Row("GET", lambda f: "/api/v1/teams/vision/secrets/WANDB_API_KEY/", VISION),
        Row("PUT", lambda f: "/api/v1/teams/vision/secrets/WANDB_API_KEY/",
            statuses(200, 200, 403, 404, 404, 401, 401), data={"value": "v2"}),
        Row("DELETE", lambda f: "/api/v1/teams/vision/secrets/WANDB_API_KEY/",
            statuses(204, 204, 403, 404, 404, 401, 401)),
    ],
    # --- users and tokens
    "api/v1/^users/$": [
        Row("GET", lambda f: "/api/v1/users/", same(200)),
        Row("POST", lambda f: "/api/v1/users/", statuses(201, 403, 403, 403, 403, 401, 401),
            data={"username": "newbie", "password": "a-Long-pass-9876"}),
    ],
    "api/v1/^users/me/$": [Row("GET", lambda f: "/api/v1/users/me/", same(200))],
    "api/v1/^users/(?P<username>[\\w.@+-]+)/$": [
        Row("GET", lambda f: "/api/v1/users/mia/", statuses(200, 404, 200, 404, 404, 401, 401),
            note="a user sees only themselves"),
        Row("PATCH", lambda f: "/api/v1/users/mia/", statuses(200, 403, 403, 403, 403, 401, 401),
            data={"first_name": "M"}),
    ],
    "api/v1/^tokens/$": [
        Row("GET", lambda f: "/api/v1/tokens/", same(200)),
        Row("POST", lambda f: "/api/v1/tokens/", same(201), data={"name": "ci"}),
    ],
    "api/v1/^tokens/(?P<pk>[^/.]+)/$": [
        Row("GET", lambda f: f"/api/v1/tokens/{f.token_id}/", statuses(404, 404, 200, 404, 404, 401, 401),
            note="tokens are private, even to admins"),
        Row("DELETE", lambda f: f"/api/v1/tokens/{f.token_id}/", statuses(404, 404, 204, 404, 404, 401, 401)),
    ],
    "api/v1/^tokens/(?P<pk>[^/.]+)/revoke/$": [
        Row("POST", lambda f: f"/api/v1/tokens/{f.token_id}/revoke/", statuses(404, 404, 200, 404, 404, 401, 401)),
    ],
    # --- cluster
    "api/v1/^hosts/$": [Row("GET", lambda f: "/api/v1/hosts/", same(200))],
    "api/v1/^hosts/(?P<name>[\\w.-]+)/$": [
        Row("GET", lambda f: "/api/v1/hosts/node-a/", statuses(200, 200, 200, 200, 404, 401, 401)),
    ],
    # --- volumes: admins define them; others list those their teams may use
    "api/v1/^volumes/$": [
        Row("GET", lambda f: "/api/v1/volumes/", same(200)),
        Row("POST", lambda f: "/api/v1/volumes/", statuses(201, 403, 403, 403, 403, 401, 401),
            data={"name": "corpus", "host_path": "/data/corpus"}),
    ],
    "api/v1/^volumes/(?P<name>[^/.]+)/$": [
        Row("GET", lambda f: "/api/v1/volumes/imagenet/", VISION),
        Row("PATCH", lambda f: "/api/v1/volumes/imagenet/", statuses(200, 403, 403, 403, 403, 401, 401),
            data={"read_only": False}),
        Row("DELETE", lambda f: "/api/v1/volumes/imagenet/", statuses(204, 403, 403, 403, 403, 401, 401)),
    ],
    # --- jobs
    "api/v1/^jobs/$": [
        Row("GET", lambda f: "/api/v1/jobs/", same(200)),
        Row("POST", lambda f: "/api/v1/jobs/", statuses(201, 201, 201, 400, 400, 401, 401),
            data={"name": "j", "team": "vision", "gpus": 1, "workload": {"builtin": "mlp-digits"}},
            note="another team's name is a 400 on the team field: the slug relation only knows visible teams"),
    ],
    "api/v1/^jobs/(?P<pk>[^/.]+)/$": [Row("GET", lambda f: f"/api/v1/jobs/{f.vjob.pk}/", VISION)],
    "api/v1/^jobs/cancel/$": [
        Row("POST", lambda f: "/api/v1/jobs/cancel/", same(200), data=lambda f: {"ids": [f.vjob.pk, f.mine.pk]},
            note="one result per id: who may cancel which is in tests/jobs/test_jobs_table_api.py"),
    ],
    "api/v1/^jobs/(?P<pk>[^/.]+)/cancel/$": [
        Row("POST", lambda f: f"/api/v1/jobs/{f.vjob.pk}/cancel/", statuses(200, 200, 403, 404, 404, 401, 401),
            data={}, note="a member cancels only their own jobs"),
        Row("POST", lambda f: f"/api/v1/jobs/{f.mine.pk}/cancel/", statuses(200, 200, 200, 404, 404, 401, 401),
            data={}),
    ],
    "api/v1/^jobs/(?P<pk>[^/.]+)/events/$": [Row("GET", lambda f: f"/api/v1/jobs/{f.vjob.pk}/events/", VISION)],
    "api/v1/^jobs/(?P<pk>[^/.]+)/logs/$": [Row("GET", lambda f: f"/api/v1/jobs/{f.vjob.pk}/logs/", VISION)],
    "api/v1/^jobs/(?P<pk>[^/.]+)/metrics/$": [Row("GET", lambda f: f"/api/v1/jobs/{f.vjob.pk}/metrics/", VISION)],
    "api/v1/jobs/<int:pk>/gpu-summary/": [
        Row("GET", lambda f: f"/api/v1/jobs/{f.vjob.pk}/gpu-summary/", VISION),
        Row("GET", lambda f: f"/api/v1/jobs/{f.mine.pk}/gpu-summary/", statuses(404, 404, 404, 404, 404, 401, 401),
            note="no samples yet: the same 404 as for a job one may not see")],
    "api/v1/^jobs/(?P<pk>[^/.]+)/artifacts/$": [
        Row("GET", lambda f: f"/api/v1/jobs/{f.vjob.pk}/artifacts/", VISION)],
    "api/v1/^jobs/(?P<pk>[^/.]+)/artifacts/(?P<path>.+)/$": [
        Row("GET", lambda f: f"/api/v1/jobs/{f.vjob.pk}/artifacts/a.txt/",
            statuses(404, 404, 404, 404, 404, 401, 401), note="no such file; unseen jobs 404 the same")],
    "api/v1/jobs/<int:pk>/artifacts/<path:path>": [
        Row("GET", lambda f: f"/api/v1/jobs/{f.vjob.pk}/artifacts/a.txt",
            statuses(404, 404, 404, 404, 404, 401, 401))],
    "api/v1/presets/": [Row("GET", lambda f: "/api/v1/presets/", same(200))],
    # The job runtime's wheel, for users' images: public (no secret in it).
    "api/v1/runtime/wheel/": [Row("GET", lambda f: "/api/v1/runtime/wheel/", same(302, anonymous=302, host=302))],
    "api/v1/^runtime/(?P<filename>[A-Za-z0-9_.+-]+\\.whl)$": [
        Row("GET", lambda f: "/api/v1/runtime/gpu_console_runtime-0.0.0-py3-none-any.whl",
            same(404, anonymous=404, host=404), note="only the current version's file is served")],
    "api/v1/workloads/": [Row("GET", lambda f: "/api/v1/workloads/", same(200))],
    # --- alerts, audit
    "api/v1/^alerts/$": [Row("GET", lambda f: "/api/v1/alerts/", same(200))],
    "api/v1/^alerts/(?P<pk>[^/.]+)/$": [
        Row("GET", lambda f: f"/api/v1/alerts/{f.alert.pk}/", VISION),
        Row("GET", lambda f: f"/api/v1/alerts/{f.cluster_alert.pk}/", statuses(200, 200, 200, 200, 404, 401, 401),
            note="a cluster-wide alert: whoever holds a role somewhere"),
    ],
    "api/v1/^alerts/(?P<pk>[^/.]+)/acknowledge/$": [
        Row("POST", lambda f: f"/api/v1/alerts/{f.alert.pk}/acknowledge/",
            statuses(200, 200, 403, 404, 404, 401, 401)),
        Row("POST", lambda f: f"/api/v1/alerts/{f.cluster_alert.pk}/acknowledge/",
            statuses(200, 403, 403, 403, 404, 401, 401), note="cluster-wide: admins only"),
    ],
    "api/v1/^alerts/(?P<pk>[^/.]+)/resolve/$": [
        Row("POST", lambda f: f"/api/v1/alerts/{f.alert.pk}/resolve/", statuses(200, 403, 403, 403, 403, 401, 401)),
    ],
    "api/v1/^alert-rules/$": [Row("GET", lambda f: "/api/v1/alert-rules/", ADMIN_ONLY)],
    "api/v1/^alert-rules/(?P<pk>[^/.]+)/$": [Row("GET", lambda f: f"/api/v1/alert-rules/{f.rule.pk}/", ADMIN_ONLY)],
    "api/v1/^audit/$": [Row("GET", lambda f: "/api/v1/audit/", ADMIN_ONLY)],
    "api/v1/^audit/(?P<pk>[^/.]+)/$": [Row("GET", lambda f: f"/api/v1/audit/{f.audit_id}/", ADMIN_ONLY)],
    # --- inference services
    "api/v1/^services/$": [
        Row("GET", lambda f: "/api/v1/services/", same(200)),
        Row("POST", lambda f: "/api/v1/services/", statuses(400, 400, 400, 400, 400, 401, 401),
            data={"team": "vision", "name": "digits", "workload": "mlp-digits"},
            note="vision: the name is taken (400 on name); others: 400 on team (an unseen team)"),
    ],
    "api/v1/^services/(?P<pk>[^/.]+)/$": [
        Row("GET", lambda f: f"/api/v1/services/{f.service.pk}/", VISION),
        Row("PATCH", lambda f: f"/api/v1/services/{f.service.pk}/", VISION, data={"max_replicas": 2}),
        Row("DELETE", lambda f: f"/api/v1/services/{f.service.pk}/", statuses(204, 204, 204, 404, 404, 401, 401)),
    ],
    "api/v1/^services/(?P<pk>[^/.]+)/events/$": [
        Row("GET", lambda f: f"/api/v1/services/{f.service.pk}/events/", VISION)],
    # --- API root and schema
    "api/v1/": [Row("GET", lambda f: "/api/v1/", same(200))],
    "api/schema/": [Row("GET", lambda f: "/api/schema/", same(200, anonymous=200, host=200), kind="page")],
    "api/docs/": [Row("GET", lambda f: "/api/docs/", same(200, anonymous=200, host=200), kind="page")],
    # --- pages
    "admin/": [Row("GET", lambda f: "/admin/", statuses(200, 302, 302, 302, 302, 302, 302), kind="page",
                   note="Django's admin site: staff only (each of its patterns shares this gate)")],
    "": [Row("GET", lambda f: "/", same(200, anonymous=LOGIN), kind="page")],
    "jobs/": [Row("GET", lambda f: "/jobs/", same(200, anonymous=LOGIN), kind="page")],
    "jobs/new/": [Row("GET", lambda f: "/jobs/new/", statuses(200, 200, 200, 200, 403, LOGIN, LOGIN), kind="page")],
    "jobs/<int:job_id>/": [Row("GET", lambda f: f"/jobs/{f.vjob.pk}/", VISION_PAGE, kind="page")],
    "jobs/pending/": [Row("GET", lambda f: "/jobs/pending/", same(200, anonymous=LOGIN), kind="page",
                          note="the waiting jobs each may see (tests/dashboard/test_jobs_table.py)")],
    "jobs/cancel/": [
        Row("POST", lambda f: "/jobs/cancel/", same(302, anonymous=LOGIN, host=LOGIN), kind="page",
            data=lambda f: {"ids": [f.vjob.pk], "confirm": "yes"},
            note="back to the list with what was cancelled and what refused (tests/dashboard/test_jobs_table.py)"),
    ],
    "jobs/compare/": [Row("GET", lambda f: f"/jobs/compare/?ids={f.vjob.pk}", VISION_PAGE, kind="page",
                          note="every run compared must be visible, else 404 as on its own page")],
    "jobs/<int:job_id>/cancel/": [
        Row("POST", lambda f: f"/jobs/{f.vjob.pk}/cancel/", statuses(302, 302, 403, 404, 404, LOGIN, LOGIN),
            kind="page", data={"confirm": "yes"}),
    ],
    "services/": [Row("GET", lambda f: "/services/", same(200, anonymous=LOGIN), kind="page")],
    "services/<int:service_id>/": [Row("GET", lambda f: f"/services/{f.service.pk}/", VISION_PAGE, kind="page")],
    "services/<int:service_id>/scale/": [
        Row("POST", lambda f: f"/services/{f.service.pk}/scale/", statuses(302, 302, 302, 404, 404, LOGIN, LOGIN),
            kind="page", data={"min_replicas": 1, "max_replicas": 2}),
    ],
    "services/<int:service_id>/delete/": [
        Row("POST", lambda f: f"/services/{f.service.pk}/delete/", statuses(302, 302, 302, 404, 404, LOGIN, LOGIN),
            kind="page", data={}),
    ],
    "teams/": [Row("GET", lambda f: "/teams/", same(200, anonymous=LOGIN), kind="page")],
    "teams/<slug:slug>/": [Row("GET", lambda f: "/teams/vision/", VISION_PAGE, kind="page")],
    "teams/<slug:slug>/members/": [
        Row("POST", lambda f: "/teams/vision/members/", statuses(302, 302, 403, 404, 404, LOGIN, LOGIN),
            kind="page", data={"username": "nobody", "role": "viewer"}),
    ],
    "teams/<slug:slug>/members/<str:username>/role/": [
        Row("POST", lambda f: "/teams/vision/members/milo/role/", statuses(302, 302, 403, 404, 404, LOGIN, LOGIN),
            kind="page", data={"role": "viewer"}),
    ],
    "teams/<slug:slug>/members/<str:username>/remove/": [
        Row("POST", lambda f: "/teams/vision/members/milo/remove/", statuses(302, 302, 403, 404, 404, LOGIN, LOGIN),
            kind="page", data={"confirm": "yes"}),
    ],
    "teams/<slug:slug>/quota-requests/": [
        Row("POST", lambda f: "/teams/vision/quota-requests/", statuses(302, 302, 403, 404, 404, LOGIN, LOGIN),
            kind="page", data={"max_gpus": 10, "reason": "more"}),
    ],
    "teams/<slug:slug>/quota-requests/<int:request_id>/decision/": [
        Row("POST", lambda f: f"/teams/vision/quota-requests/{f.quota_request.pk}/decision/", ADMIN_PAGE_403,
            kind="page", data={"decision": "approve"}),
    ],
    "teams/<slug:slug>/secrets/": [
        Row("GET", lambda f: "/teams/vision/secrets/", VISION_PAGE, kind="page"),
        Row("POST", lambda f: "/teams/vision/secrets/", statuses(200, 200, 403, 404, 404, LOGIN, LOGIN),
            kind="page", data={"name": "HF_TOKEN", "value": "hf-1"}, note="the answer shows the value once"),
    ],
    "teams/<slug:slug>/secrets/<str:name>/rotate/": [
        Row("POST", lambda f: "/teams/vision/secrets/WANDB_API_KEY/rotate/",
            statuses(200, 200, 403, 404, 404, LOGIN, LOGIN), kind="page", data={"value": "v2"}),
    ],
    "teams/<slug:slug>/secrets/<str:name>/delete/": [
        Row("GET", lambda f: "/teams/vision/secrets/WANDB_API_KEY/delete/",
            statuses(200, 200, 403, 404, 404, LOGIN, LOGIN), kind="page", note="the confirmation"),
        Row("POST", lambda f: "/teams/vision/secrets/WANDB_API_KEY/delete/",
            statuses(302, 302, 403, 404, 404, LOGIN, LOGIN), kind="page", data={}),
    ],
    "hosts/<str:name>/": [Row("GET", lambda f: "/hosts/node-a/", statuses(200, 200, 200, 200, 404, LOGIN, LOGIN),
                              kind="page", note="hosts are cluster-wide: whoever holds a role somewhere")],
    "hosts/<str:name>/gpus/<int:index>/": [Row("GET", lambda f: "/hosts/node-a/gpus/0/",
                                               statuses(200, 200, 200, 200, 404, LOGIN, LOGIN), kind="page")],
    "reports/usage/": [Row("GET", lambda f: "/reports/usage/", statuses(200, 200, 404, 404, 404, LOGIN, LOGIN),
                           kind="page")],
    "alerts/": [Row("GET", lambda f: "/alerts/", same(200, anonymous=LOGIN), kind="page")],
    "alerts/<int:alert_id>/ack/": [
        Row("POST", lambda f: f"/alerts/{f.alert.pk}/ack/", statuses(302, 302, 403, 404, 404, LOGIN, LOGIN),
            kind="page", data={}),
        Row("POST", lambda f: f"/alerts/{f.cluster_alert.pk}/ack/", statuses(302, 403, 403, 403, 404, LOGIN, LOGIN),
            kind="page", data={}),
    ],
    "accounts/tokens/": [Row("GET", lambda f: "/accounts/tokens/", same(200, anonymous=LOGIN), kind="page")],
    "accounts/tokens/<int:token_id>/revoke/": [
        Row("POST", lambda f: f"/accounts/tokens/{f.token_id}/revoke/", statuses(404, 404, 302, 404, 404, LOGIN, LOGIN),
            kind="page", data={}),
    ],
    "accounts/password_change/": [
        Row("GET", lambda f: "/accounts/password_change/", same(200, anonymous=LOGIN), kind="page")],
    "accounts/password_change/done/": [
        Row("GET", lambda f: "/accounts/password_change/done/", same(200, anonymous=LOGIN), kind="page")],
}
# Host persona on pages: the Host header is no session, so it is anonymous there.
for _rows in MATRIX.values():
    for _row in _rows:
        if _row.kind == "page" and _row.expected["anonymous"] == LOGIN:
            _row.expected["host"] = LOGIN

# websocket route -> (path, who may connect); refused: 4401 without a session, else the route's refusal code
WEBSOCKETS: dict[str, list[tuple[Callable[[Fixture], str], set[str], int]]] = {
    "ws/cluster/": [(lambda f: "/ws/cluster/", {"admin", "manager", "member", "other"}, 4403)],
    "ws/jobs/<int:job_id>/": [
        (lambda f: f"/ws/jobs/{f.vjob.pk}/", {"admin", "manager", "member"}, 4404),
        (lambda f: f"/ws/jobs/{f.njob.pk}/", {"admin", "other"}, 4404),
    ],
}

_FORMAT = re.compile(r"\\\.\(\?P<format>|<drf_format_suffix:format>")


def url_patterns() -> set[str]:
    """Every routed pattern of console.urls; the admin site's as the one prefix it shares its gate under."""

    def walk(patterns, prefix: str):
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                if route == "admin/":
                    yield route
                    continue
                yield from walk(pattern.url_patterns, route)
            elif not _FORMAT.search(route):  # `.json` twins route to the same view as their base pattern
                yield route

    return set(walk(get_resolver().url_patterns, ""))


def websocket_patterns() -> set[str]:
    from console.routing import websocket_urlpatterns

    return {str(p.pattern) for p in websocket_urlpatterns}


def test_every_route_is_in_the_matrix():
    routes, sockets = url_patterns(), websocket_patterns()
    assert routes - set(MATRIX) == set(), "routes without a row in the access matrix"
    assert set(MATRIX) - routes == set(), "rows for routes that do not exist"
    assert sockets == set(WEBSOCKETS)
    assert len(PERSONAS) == 7 and all(set(row.expected) == set(PERSONAS) for rows in MATRIX.values() for row in rows)


def request(fx: Fixture, persona: str, row: Row) -> int:
    path = row.path(fx)
    data = row.data(fx) if callable(row.data) else row.data
    if row.kind == "page":
        client = page_client(fx, persona)
        if row.method == "GET":
            return client.get(path).status_code
        if path.startswith("/serve/"):
            import json

            return client.post(path, json.dumps(data), content_type="application/json").status_code
        return client.post(path, data or {}).status_code
    client = api_client(fx, persona)
    if row.kind == "upload":
        return client.post(path, data, format="multipart").status_code
    call = getattr(client, row.method.lower())
    return (call(path) if data is None else call(path, data, format="json")).status_code


def run_matrix(fx: Fixture, persona: str) -> list[tuple]:
    """Every row for one persona, each in a savepoint rolled back after it: rows do not see each other's effects."""
    from django.core.cache import cache

    wrong = []
    for pattern, rows in MATRIX.items():
        for row in rows:
            cache.clear()  # no throttle, lockout or token cache carries from row to row
            with transaction.atomic():
                got = request(fx, persona, row)
                transaction.set_rollback(True)
            if got != row.expected[persona]:
                wrong.append((pattern, row.method, row.path(fx), f"expected {row.expected[persona]}", f"got {got}"))
    return wrong


@pytest.mark.parametrize("persona", PERSONAS)
def test_http_matrix(fx, persona):
    wrong = run_matrix(fx, persona)
    assert not wrong, "\n".join(map(str, wrong))


def session_headers(user) -> list[tuple[bytes, bytes]]:
    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if user is not None:
        client = Client()
        client.force_login(user)
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    return headers


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("persona", PERSONAS)
def test_websocket_matrix(fx, persona):
    from console.asgi import application

    user = fx.world.persona(persona) if persona != "host" else None
    headers = session_headers(user)
    if persona == "host":
        headers = [(b"authorization", f"Host {fx.host_secret}".encode())]

    async def close_code(path: str) -> int | None:
        socket = WebsocketCommunicator(application, path, headers=headers)
        connected, code = await socket.connect(timeout=30)
        await socket.disconnect(timeout=30 if connected else 0.1)
        return None if connected else code

    wrong = []
    for pattern, cases in WEBSOCKETS.items():
        for path, allowed, refusal in cases:
            expected = None if persona in allowed else (4401 if user is None else refusal)
            got = async_to_sync(close_code)(path(fx))
            if got != expected:
                wrong.append((pattern, path(fx), expected, got))
    assert wrong == []


# --- the home page shows what the live stream shows


@pytest.mark.parametrize("persona", ["admin", "manager", "member", "other"])
def test_home_page_shows_what_the_live_stream_shows(fx, persona):
    """Jobs of both teams on node-a's GPUs (one GPU shared by both) and queued jobs of both teams: the page's
    cells and queue equal the websocket's frame and queue event for the same user."""
    import time

    from apps.cluster.models import Host
    from apps.dashboard.selectors import cluster_overview
    from apps.jobs.models import JobAllocation
    from apps.telemetry import services
    from apps.telemetry.hub import Hub

    world = fx.world
    node_a = Host.objects.get(name="node-a")
    gpus = list(node_a.gpus.order_by("index"))
    # GPU 0: vision's; GPU 1: nlp's; GPU 2 shared by a vision and an nlp job (half each).
    placed = ((fx.vjob, 0, 100), (fx.njob, 1, 100), (fx.mine, 2, 50), (_job(world.nlp, world.other, "s"), 2, 50))
    for job, index, share in placed:
        Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, gpu_share_units=share)
        JobAllocation.objects.create(job=job, gpu=gpus[index], share_units=share)
    _job(world.nlp, world.other, "queued-n")  # queued: njob, vjob and mine are running now
    services.forget_host_maps()
    samples = [{"index": g.index, "uuid": g.uuid, "ts": time.time(), "available": True, "utilization_pct": 5.0,
                "memory_used_mb": 1, "memory_total_mb": 143771, "temperature_c": 40, "power_w": 100.0,
                "processes": []} for g in gpus]
    services.ingest_batch(node_a, {"gpus": samples})

    user = world.persona(persona)

    class Subscriber:
        job_id = None
        alive = True
        viewer = access.viewer(user)

        def __init__(self) -> None:
            self.samples: list = []
            self.events: list = []

        def offer_sample(self, message) -> None:
            self.samples.append(message)

        def offer_event(self, message) -> None:
            self.events.append(message)

        async def recheck_access(self) -> bool:
            return True

    import json

    subscriber = Subscriber()
    hub = Hub(subscribers={subscriber}, ticks=4)  # the 5th tick sends the queue
    hub._start_outbox()
    async_to_sync(hub.tick)()
    frame = {g["uuid"]: g for g in json.loads(subscriber.samples[-1])["gpus"] if g["host"] == "node-a"}
    queue = next(e["teams"] for e in subscriber.events if e["type"] == "queue")

    overview = cluster_overview(user)
    cells = {c.gpu.uuid: c for host, _, row in overview.hosts for c in row if host.name == "node-a"}
    assert set(cells) == set(frame)
    for uuid, cell in cells.items():
        live = frame[uuid]
        assert (cell.job_id, cell.team, cell.other_team) == (live["job"], live["team"],
                                                             live.get("other_team", False)), uuid
    assert overview.queue == queue
    expected_queue = {"admin": {"nlp": 1}, "other": {"nlp": 1}}.get(persona, {})
    assert queue == expected_queue
    page = page_client(fx, persona).get("/").content.decode()
    if persona in {"member", "manager"}:
        assert "nlp" not in page.split('id="t-queue"')[1].split("</span>")[0]
        assert f'href="/jobs/{fx.njob.pk}/"' not in page and ">another team's job<" in page


# --- the matrix catches a broken policy


def test_a_broken_policy_fails_the_matrix(fx, monkeypatch):
    """A policy that lets anyone do anything, or one role check moved, fails the matrix."""
    monkeypatch.setattr(access, "can", lambda user, action, obj=None: True)
    assert run_matrix(fx, "member"), "a policy allowing everything passed the matrix"
    monkeypatch.undo()
    monkeypatch.setitem(access.NEEDS, access.Action.CANCEL, access.Role.MEMBER)  # members cancel anyone's job
    wrong = run_matrix(fx, "member")
    assert wrong and all("cancel" in case[2] for case in wrong), wrong
    monkeypatch.undo()
    monkeypatch.setitem(access.SCOPES, "telemetry.alert", access.Scope())  # alerts cluster-wide
    assert run_matrix(fx, "other")

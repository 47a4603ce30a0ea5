"""Who may reach what, beyond the REST matrix (tests/test_permission_matrix.py): the websocket streams for every
persona, host tokens against user endpoints and user credentials against the agent API, what a host may say about
other hosts, 404 (never 403) for other tenants' objects, and secrets that never reach a URL, a log or the audit log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken
from apps.accounts.services import token_create
from apps.cluster.models import GPU, Host
from apps.cluster.services import host_token_issue
from apps.core.models import AuditEvent
from apps.jobs import services as job_services
from apps.jobs.models import Job, JobAllocation, JobLogChunk
from apps.jobs.scheduler import scheduler_pass
from apps.jobs.services import JobSpec, job_submit
from apps.telemetry import alerts, services, tickets
from apps.telemetry.hub import hub
from apps.telemetry.models import Alert, AlertRule, GpuSampleBucket
from console.asgi import application
from tests.cluster.test_agent_api import registration
from tests.telemetry.conftest import clean_live_state, gpu_sample  # noqa: F401 - clean_live_state is autouse
from workers.protocol import JobStatus

pytestmark = [pytest.mark.faults, pytest.mark.django_db]
PERSONAS = ["admin", "manager", "member", "viewer", "other", "noteam", "anonymous"]
VISION = {"admin", "manager", "member", "viewer"}
ORIGIN = b"http://localhost"


def agent(secret: str) -> APIClient:
    return APIClient(HTTP_AUTHORIZATION=f"Host {secret}")


def register(name: str) -> tuple[Host, str]:
    host, secret = host_token_issue(name=name)
    assert agent(secret).post("/api/v1/agent/register/", registration(name), format="json").status_code == 200
    host.refresh_from_db()
    return host, secret


def submit(user, team: str, name: str = "job") -> Job:
    return job_submit(user=user, spec=JobSpec(name=name, kind="train", gpus=1, team=team,
                                              workload={"builtin": "mlp-digits"}))


@pytest.fixture
def two_jobs(world):
    """A vision job and an nlp job placed on the two GPUs of agent host sim-t; returns (vision, nlp, agent)."""
    host, secret = register("sim-t")
    Host.objects.exclude(pk=host.pk).update(state="down")
    vision, nlp = submit(world.member, "vision", "v"), submit(world.other, "nlp", "n")
    scheduler_pass()
    vision.refresh_from_db()
    nlp.refresh_from_db()
    assert vision.state == nlp.state == "placed"
    services.forget_host_maps()
    return vision, nlp, agent(secret)


def gpu_of(job: Job) -> GPU:
    return JobAllocation.objects.select_related("gpu").get(job=job, released_at__isnull=True).gpu


# --- websockets: who may connect


def cookie_for(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def close_code(path: str, headers: list[tuple[bytes, bytes]]) -> int | None:
    """None when the socket was accepted, else the close code."""
    socket = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await socket.connect(timeout=30)
    await socket.disconnect(timeout=30 if connected else 0.1)  # a refused one has nothing left to do
    return None if connected else code


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("persona", PERSONAS)
def test_websocket_connect_matrix(world, two_jobs, persona):
    vision, nlp, _ = two_jobs
    user = world.persona(persona)
    paths = {"/ws/cluster/": VISION | {"other"}, f"/ws/jobs/{vision.pk}/": VISION,
             f"/ws/jobs/{nlp.pk}/": {"admin", "other"}, "/ws/jobs/999999/": set()}
    refusal = {"/ws/cluster/": 4403}
    session = [(b"origin", ORIGIN), (b"host", b"localhost")] + ([(b"cookie", cookie_for(user))] if user else [])
    api = APIClient()
    if user is not None:
        api.force_authenticate(user)
    token = token_create(user=user, name="ws")[1] if user else "gpc_not-a-token"

    async def run() -> dict[str, Any]:
        seen = {}
        for path, allowed in paths.items():
            expected = None if persona in allowed else 4401 if user is None else refusal.get(path, 4404)
            ticket = await sync_to_async(api.post)("/api/v1/ws-ticket/")
            by_ticket = None
            if user is None:
                assert ticket.status_code == 401
            else:
                by_ticket = await close_code(f"{path}?ticket={ticket.json()['ticket']}", [])
            seen[path] = (expected, await close_code(path, session), by_ticket)
            # An API token is never a websocket credential, wherever it is put in the URL.
            for query in (f"ticket={token}", f"token={token}", f"access_token={token}"):
                assert await close_code(f"{path}?{query}", []) == 4401, (path, query)
        return seen

    for path, (expected, by_session, by_ticket) in async_to_sync(run)().items():
        assert by_session == expected, (path, by_session)
        if user is not None:
            assert by_ticket == expected, (path, by_ticket)
    assert not hub.subscribers


# --- websockets: what each persona receives


def walk(value: Any, key: str | None = None):
    """Every (key, value) pair in a decoded message, nested ones included."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k, v
            yield from walk(v, k)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item, key)


def job_ids_named(message: dict) -> set[int]:
    ids = {v for k, v in walk(message) if k in {"job", "job_id"} and isinstance(v, int)}
    if message.get("type") == "job.state":
        ids.add(message["job"]["id"])
    return ids


def teams_named(message: dict) -> set[str]:
    teams = {v for k, v in walk(message) if k == "team" and isinstance(v, str)}
    if message.get("type") == "queue":
        teams |= set(message["teams"])
    return teams


@pytest.mark.django_db(transaction=True)
def test_streams_never_name_another_teams_jobs(world, two_jobs):
    vision, nlp, client = two_jobs
    AlertRule.objects.get_or_create(name="xid (test)", defaults={"kind": AlertRule.Kind.GPU_XID})
    alerts.reload_rules()
    gpus = {vision.pk: gpu_of(vision), nlp.pk: gpu_of(nlp)}
    sockets_of = {("cluster", p): "/ws/cluster/" for p in ["admin", "manager", "member", "viewer", "other"]}
    sockets_of |= {("vision-job", "member"): f"/ws/jobs/{vision.pk}/", ("nlp-job", "other"): f"/ws/jobs/{nlp.pk}/",
                   ("nlp-job", "admin"): f"/ws/jobs/{nlp.pk}/", ("vision-job", "viewer"): f"/ws/jobs/{vision.pk}/"}
    headers = {key: [(b"origin", ORIGIN), (b"host", b"localhost"), (b"cookie", cookie_for(world.persona(key[1])))] for key in sockets_of}

    def samples(util: float) -> dict:
        return {"gpus": [dict(gpu_sample(g.index, util=util), processes=[{"pid": 100 + g.index, "memory_mb": 5,
                                                                           "job": job_id}])
                         for job_id, g in gpus.items()]}

    def happen() -> dict[str, set[int]]:
        """Each job starts, logs a line and gets an XID alert; telemetry names both. Returns each team's jobs."""
        host = Host.objects.get(name="sim-t")
        for job in (vision, nlp):
            job_services.job_report_status(host=host, job_id=job.pk, status=JobStatus("running", 1))
            job_services.job_append_log(host=host, job_id=job.pk, attempt=1, data=f"log line of {job.team.slug}\n")
        services.forget_host_maps()
        xids = [{"uuid": g.uuid, "xid": 31, "ts": time.time()} for g in gpus.values()]
        assert client.post("/api/v1/agent/telemetry/", {**samples(77.0), "xid": xids}, format="json").status_code == 200
        return {"vision": {vision.pk, submit(world.member, "vision", "queued-v").pk},
                "nlp": {nlp.pk, submit(world.other, "nlp", "queued-n").pk}}

    own_jobs: dict[str, set[int]] = {}
    job_of = {"vision-job": (vision.pk, "vision"), "nlp-job": (nlp.pk, "nlp")}

    def seen_all(key: tuple[str, str], messages: list[dict]) -> bool:
        """The positive checks: what this socket must have shown once everything happened."""
        stream, persona = key
        named = set().union(*(job_ids_named(m) for m in messages))
        teams = set().union(*(teams_named(m) for m in messages))
        if not {"gpu.sample", "job.state", "alert"} <= {m["type"] for m in messages}:
            return False
        if stream != "cluster":
            job_id, team = job_of[stream]
            return job_id in named and f"log line of {team}" in json.dumps(messages)
        if persona == "admin":
            return {vision.pk, nlp.pk} <= named and {"vision", "nlp"} <= teams
        mine = "nlp" if persona == "other" else "vision"
        return bool(named & own_jobs[mine]) and mine in teams and any(
            g.get("other_team") for m in messages if m["type"] == "gpu.sample" for g in m["gpus"])

    assert client.post("/api/v1/agent/telemetry/", samples(55.0), format="json").status_code == 200

    async def run() -> dict[tuple[str, str], list[dict]]:
        opened = {}
        for key, path in sockets_of.items():
            socket = WebsocketCommunicator(application, path, headers=headers[key])
            assert (await socket.connect(timeout=30))[0], key
            opened[key] = socket
        received: dict[tuple[str, str], list[dict]] = {key: [] for key in opened}
        loop = asyncio.get_running_loop()

        async def collect(key, socket, done, what: str) -> None:
            """Every frame of the socket until done() holds for all; a timeout (60 s) only means "never"."""
            deadline = loop.time() + 60
            while not done():
                assert loop.time() < deadline, f"no {what} on {key} after 60 s: {[m['type'] for m in received[key]]}"
                # receive_nothing polls without a timeout: a timed-out receive_from would cancel the application.
                if not await socket.receive_nothing(timeout=0.05, interval=0.01):
                    received[key].append(json.loads(await socket.receive_from(timeout=30)))

        # Once a first frame arrives the hub runs, so it sees every event from now on.
        first = ("cluster", "member")
        await collect(first, opened[first], lambda: any(m["type"] == "gpu.sample" for m in received[first]),
                      "first telemetry frame")
        own_jobs.update(await sync_to_async(happen)())

        def everything_seen() -> bool:
            return all(seen_all(key, messages) for key, messages in received.items())

        await asyncio.gather(*(collect(key, socket, everything_seen, "complete picture")
                               for key, socket in opened.items()))
        for key, socket in opened.items():  # and what had arrived by then
            while not await socket.receive_nothing(timeout=0.05, interval=0.01):
                received[key].append(json.loads(await socket.receive_from(timeout=30)))
        await asyncio.gather(*(socket.disconnect(timeout=30) for socket in opened.values()))
        return received

    received = async_to_sync(run)()
    assert not hub.subscribers
    # The negative checks, over everything each socket received.
    for (stream, persona), messages in received.items():
        named = set().union(*(job_ids_named(m) for m in messages))
        teams = set().union(*(teams_named(m) for m in messages))
        text = json.dumps(messages)
        if stream != "cluster":  # a job's stream names that job only, whoever watches it
            job_id, _ = job_of[stream]
            assert named == {job_id}, (stream, persona, named)
            assert text.count("log line of") == 1, (stream, persona)
            continue
        if persona == "admin":
            continue
        mine, theirs = ("nlp", "vision") if persona == "other" else ("vision", "nlp")
        assert not named & own_jobs[theirs], (persona, named, own_jobs)
        assert theirs not in teams, (persona, teams)
        gpu_frames = [g for m in messages if m["type"] == "gpu.sample" for g in m["gpus"]]
        assert all("processes" not in g for g in gpu_frames)  # process lists name jobs: admins only
        busy = [g for g in gpu_frames if g.get("other_team")]
        assert all(g["job"] is None and g["team"] is None and g["jobs"] == [] for g in busy), busy


# --- host tokens and user credentials do not cross


USER_ENDPOINTS = [("get", "/api/v1/jobs/"), ("post", "/api/v1/jobs/"), ("get", "/api/v1/users/me/"),
                  ("get", "/api/v1/teams/"), ("get", "/api/v1/tokens/"), ("post", "/api/v1/tokens/"),
                  ("post", "/api/v1/ws-ticket/"), ("get", "/api/v1/hosts/"), ("get", "/api/v1/alerts/"),
                  ("get", "/api/v1/services/"), ("get", "/metrics")]
AGENT_ENDPOINTS = ["/api/v1/agent/register/", "/api/v1/agent/heartbeat/", "/api/v1/agent/telemetry/",
                   "/api/v1/agent/jobs/{job}/status/", "/api/v1/agent/jobs/{job}/logs/",
                   "/api/v1/agent/jobs/{job}/progress/"]


def test_a_host_token_opens_no_user_endpoint(world, two_jobs):
    _, host_secret = register("sim-x")
    vision = two_jobs[0]
    before = (Job.objects.count(), ApiToken.objects.count())
    for scheme in ("Host", "Bearer", "Token"):  # as itself, and passed off as a personal token
        client = APIClient(HTTP_AUTHORIZATION=f"{scheme} {host_secret}")
        for method, path in [*USER_ENDPOINTS, ("get", f"/api/v1/jobs/{vision.pk}/"),
                             ("post", f"/api/v1/jobs/{vision.pk}/cancel/")]:
            response = getattr(client, method)(path, {"name": "x", "gpus": 1, "workload": {"builtin": "mlp-digits"}}
                                               if method == "post" else None, format="json")
            assert response.status_code == 401, (scheme, method, path, response.status_code)
    assert (Job.objects.count(), ApiToken.objects.count()) == before
    vision.refresh_from_db()
    assert vision.state == "placed"


@pytest.mark.parametrize("persona", ["admin", "member"])
def test_user_credentials_open_no_agent_endpoint(world, two_jobs, persona):
    vision = two_jobs[0]
    user = world.persona(persona)
    _, secret = token_create(user=user, name="cli")
    session = Client()
    session.force_login(user)
    forced = APIClient()
    forced.force_authenticate(user)  # as if some other scheme had authenticated the user: still not a host
    clients = {"bearer": APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}"),
               "as host": APIClient(HTTP_AUTHORIZATION=f"Host {secret}"), "session": session, "forced": forced}
    bodies = {"register": registration("sim-t"), "status": {"state": "failed", "attempt": 1},
              "logs": {"attempt": 1, "data": "forged"}, "progress": {"attempt": 1, "progress": {"step": 9}},
              "telemetry": {"gpus": [gpu_sample(0)]}, "heartbeat": {"running": []}}
    for name, client in clients.items():
        for template in AGENT_ENDPOINTS:
            path = template.format(job=vision.pk)
            body = next(b for key, b in bodies.items() if key in path)
            if name == "session":
                response = client.post(path, json.dumps(body), content_type="application/json")
            else:
                response = client.post(path, body, format="json")
            # The agent API authenticates host tokens only (401); a user who got past that is no host (403).
            assert response.status_code == (403 if name == "forced" else 401), (name, path, response.status_code)
        secrets = client.get(f"/api/v1/agent/jobs/{vision.pk}/secrets/", {"attempt": 1})
        assert secrets.status_code == (403 if name == "forced" else 401), (name, secrets.status_code)
    vision.refresh_from_db()
    assert vision.state == "placed" and not JobLogChunk.objects.exists() and vision.steps_done == 0
    assert services.latest_frames(["sim-t"]) == {}


def test_a_host_speaks_only_for_its_own_gpus_and_jobs(world, two_jobs):
    vision, _, owner = two_jobs
    _, intruder_secret = register("sim-x")
    intruder = agent(intruder_secret)
    AlertRule.objects.get_or_create(name="xid (test)", defaults={"kind": AlertRule.Kind.GPU_XID})
    alerts.reload_rules()
    theirs = gpu_of(vision)
    own = GPU.objects.get(host__name="sim-x", index=0)
    batches = [
        {"gpus": [gpu_sample(theirs.index)]},  # sim-t's GPU, as sim-t names it
        {"gpus": [gpu_sample(0, host="sim-x"), dict(gpu_sample(0), uuid=theirs.uuid)]},  # one of them foreign
        {"gpus": [], "xid": [{"uuid": theirs.uuid, "xid": 79}]},
        {"gpus": [gpu_sample(0, host="sim-x")], "xid": [{"uuid": theirs.uuid, "xid": 48}]},
    ]
    for batch in batches:
        response = intruder.post("/api/v1/agent/telemetry/", batch, format="json")
        assert response.status_code == 400 and theirs.uuid in response.json()["detail"], response.content
    services.flush_buckets(everything=True)
    assert services.latest_frames(["sim-t", "sim-x"]) == {}  # a refused batch is refused whole
    assert not GpuSampleBucket.objects.exists() and not Alert.objects.exists()
    theirs.refresh_from_db()
    assert theirs.health == GPU.Health.OK
    # Its heartbeat cannot keep another host's job or have it failed; it is told to stop what it should not run.
    reply = intruder.post("/api/v1/agent/heartbeat/", {"running": [[vision.pk, 1]]}, format="json").json()
    assert reply["stop"] == [[vision.pk, 1]]
    vision.refresh_from_db()
    assert vision.state == "placed"
    # Registering another host's GPU (its UUID) is refused: the GPU stays the other host's.
    claim = registration("sim-x")
    claim["gpus"][1]["uuid"] = theirs.uuid
    response = intruder.post("/api/v1/agent/register/", claim, format="json")
    assert response.status_code == 409 and "sim-t" in response.json()["detail"], response.content
    theirs.refresh_from_db()
    assert theirs.host.name == "sim-t" and GPU.objects.filter(uuid=theirs.uuid).count() == 1
    # The owner still publishes its GPU; the intruder's own GPU is still its own.
    assert owner.post("/api/v1/agent/telemetry/", {"gpus": [gpu_sample(theirs.index)]}, format="json").status_code == 200
    assert intruder.post("/api/v1/agent/telemetry/", {"gpus": [gpu_sample(0, host="sim-x")]},
                         format="json").status_code == 200
    own.refresh_from_db()
    assert own.uuid == "GPU-sim-sim-x-0"


# --- another tenant's objects: 404, exactly as for an object that does not exist


def test_other_tenants_ids_answer_404_like_missing_ones(world, two_jobs, client_for):
    from apps.serving.services import ServiceSpec, service_create

    vision = two_jobs[0]
    service = service_create(user=world.member, spec=ServiceSpec(team=world.vision, name="digits",
                                                                 workload="mlp-digits"))
    token, _ = token_create(user=world.member, name="ci")
    alert = Alert.objects.create(rule=AlertRule.objects.get_or_create(name="idle (test)", kind="job_idle")[0],
                                 subject=f"job:{vision.pk}", job=vision, team=world.vision, message="idle")
    missing = 987654
    requests = [
        ("get", "/api/v1/jobs/{}/"), ("get", "/api/v1/jobs/{}/events/"), ("get", "/api/v1/jobs/{}/logs/"),
        ("get", "/api/v1/jobs/{}/artifacts/"), ("get", "/api/v1/jobs/{}/artifacts/outputs/model.pt/"),
        ("post", "/api/v1/jobs/{}/cancel/"),
    ]
    objects = [(vision.pk, requests),
               (service.pk, [("get", "/api/v1/services/{}/"), ("get", "/api/v1/services/{}/events/"),
                             ("patch", "/api/v1/services/{}/"), ("delete", "/api/v1/services/{}/")]),
               (token.pk, [("get", "/api/v1/tokens/{}/"), ("post", "/api/v1/tokens/{}/revoke/"),
                           ("delete", "/api/v1/tokens/{}/")]),
               (alert.pk, [("get", "/api/v1/alerts/{}/"), ("post", "/api/v1/alerts/{}/acknowledge/")])]
    for persona in ["other", "noteam", "member2"]:
        client = client_for(world.persona(persona))
        for pk, calls in objects:
            if persona == "member2" and "/tokens/" not in calls[0][1]:
                continue  # member2 is in vision: only another member's tokens are foreign to it
            for method, template in calls:
                body = {"max_replicas": 2} if method == "patch" else {}
                theirs = getattr(client, method)(template.format(pk), body, format="json")
                nothing = getattr(client, method)(template.format(missing), body, format="json")
                assert theirs.status_code == nothing.status_code == 404, (persona, method, template,
                                                                         theirs.status_code)
                assert theirs.content == nothing.content, (persona, template, theirs.content, nothing.content)
    vision.refresh_from_db()
    token.refresh_from_db()
    service.refresh_from_db()
    alert.refresh_from_db()
    assert vision.state == "placed" and token.revoked_at is None and service.max_replicas == 1
    assert service.state != "deleted" and alert.state == "firing"


# --- secrets: never in a URL, a log record or the audit log


def test_tokens_never_reach_urls_logs_or_the_audit_log(world, two_jobs, caplog):
    caplog.set_level(logging.DEBUG)
    secrets = []
    password = "pw-for-tests-123"
    client = APIClient()
    client.force_authenticate(world.member)
    created = client.post("/api/v1/tokens/", {"name": "laptop"}, format="json")
    assert created.status_code == 201
    secrets.append(created.json()["token"])
    login = APIClient().post("/api/v1/auth/token/", {"username": "mia", "password": password, "name": "ci"},
                             format="json")
    assert login.status_code == 201
    secrets.append(login.json()["token"])
    _, host_secret = register("sim-x")
    secrets.append(host_secret)
    for secret in secrets[:2]:
        bearer = APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}")
        assert bearer.get("/api/v1/jobs/").status_code == 200
        assert bearer.post("/api/v1/jobs/", {"name": "bad", "gpus": 0}, format="json").status_code == 400
        assert APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}x").get("/api/v1/jobs/").status_code == 401
        assert APIClient(HTTP_AUTHORIZATION=f"Host {secret}").post("/api/v1/agent/heartbeat/").status_code == 401
        ticket = bearer.post("/api/v1/ws-ticket/").json()
        # The websocket credential is a separate one-time ticket that lives seconds, not the token.
        assert ticket["ticket"] not in secrets and ticket["expires_in"] <= 60 and ticket["expires_in"] == tickets.TICKET_TTL_S
        assert tickets.redeem(ticket["ticket"]) == world.member.pk and tickets.redeem(ticket["ticket"]) is None
    assert APIClient().post("/api/v1/auth/token/", {"username": "mia", "password": password + "x", "name": "x"},
                            format="json").status_code == 400
    assert agent(host_secret).post("/api/v1/agent/heartbeat/", {}, format="json").status_code == 200
    assert agent(host_secret + "x").post("/api/v1/agent/heartbeat/", {}, format="json").status_code == 401
    revoke = ApiToken.objects.get(name="laptop").pk
    assert client.post(f"/api/v1/tokens/{revoke}/revoke/").status_code == 200
    assert APIClient(HTTP_AUTHORIZATION=f"Bearer {secrets[0]}").get("/api/v1/jobs/").status_code == 401

    assert caplog.records, "expected the requests above to log something"
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''} {r.__dict__}" for r in caplog.records)
    audited = json.dumps([{f.name: str(getattr(e, f.attname)) for f in AuditEvent._meta.fields}
                          for e in AuditEvent.objects.all()])
    assert AuditEvent.objects.filter(action=AuditEvent.Action.TOKEN_CREATED).count() >= 2
    stored = json.dumps(list(ApiToken.objects.values()), default=str)
    for secret in secrets:
        body = secret.split("_", 1)[1]  # the random part: the prefix "gpc_"/"gph_" is no secret
        for where, text in [("log records", logged), ("audit events", audited), ("token rows", stored),
                            ("token list", json.dumps(client.get("/api/v1/tokens/").json()))]:
            assert body not in text, f"a token's secret is in the {where}"
    assert password not in logged and password not in audited

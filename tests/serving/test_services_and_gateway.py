"""Inference services through the API, the reconciler and the gateway, with real HTTP replica stand-ins."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from apps.accounts.services import token_create
from apps.cluster.models import Host
from apps.jobs import services as job_services
from apps.jobs.models import Job
from apps.jobs.scheduler import scheduler_pass
from apps.serving import services
from apps.serving.models import InferenceService
from workers.protocol import REPLICA_SECRET_HEADER, JobStatus


class Replica(BaseHTTPRequestHandler):
    """A stand-in replica: /stats, and /predict answering class 7 (or failing when told to), both only with the
    replica's secret (as workers.runtime.serve)."""

    fail = False
    secret: str | None = None  # set once the replica's job is placed (its attempt is known)
    stats = {"requests": 10, "errors": 0, "rps": 2.0, "queue_depth": 0,
             "latency_ms": {"p50": 5.0, "p95": 9.0, "p99": 12.0}}

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, payload) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        if type(self).secret is not None and self.headers.get(REPLICA_SECRET_HEADER) == type(self).secret:
            return True
        self._send(401, {"detail": "no secret"})
        return False

    def do_GET(self) -> None:
        if self._authorized():
            self._send(200, type(self).stats)

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if type(self).fail:
            self._send(500, {"detail": "boom"})
        else:
            self._send(200, {"outputs": [7] * len(body["inputs"])})


@pytest.fixture
def replica_server():
    servers = []

    def start(fail: bool = False):
        handler = type("R", (Replica,), {"fail": fail})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()


@pytest.fixture(autouse=True)
def fresh_cache():
    cache.clear()


def create(client, **overrides):
    body = {"team": "vision", "name": "digits", "workload": "mlp-digits", "preset": "infer-int8",
            "min_replicas": 1, "max_replicas": 2, "target_p95_ms": 50}
    body.update(overrides)
    return client.post("/api/v1/services/", body, format="json")


def run_replica(job: Job, server: ThreadingHTTPServer) -> None:
    """What the agent does for a replica: claim it, then forward the port the server announced."""
    scheduler_pass()
    job.refresh_from_db()
    (_, message), = job_services.dispatch_messages(job)
    server.RequestHandlerClass.secret = message.replica_secret  # what the agent hands the replica
    port = server.server_address[1]
    host = Host.objects.get(gpus__allocations__job=job, gpus__allocations__released_at__isnull=True)
    Host.objects.filter(pk=host.pk).update(address="127.0.0.1")
    host.refresh_from_db()
    job_services.job_report_status(host=host, job_id=job.pk, status=JobStatus("running", job.attempts))
    job_services.job_record_progress(host=host, job_id=job.pk, attempt=job.attempts,
                                     progress={"type": "serving", "port": port})


def bearer(user) -> Client:
    _, secret = token_create(user=user, name="gw")
    return Client(headers={"Authorization": f"Bearer {secret}"})


@pytest.mark.parametrize(("persona", "status"), [("member", 201), ("manager", 201), ("viewer", 403),
                                                 ("other", 400), ("noteam", 400)])
def test_who_may_create_a_service(world, client_for, persona, status):
    response = create(client_for(getattr(world, persona)))
    assert response.status_code == status, response.content
    assert InferenceService.objects.exists() == (status == 201)


@pytest.mark.parametrize(("overrides", "field"), [
    ({"workload": "nope"}, "workload"), ({"preset": "amp-bf16"}, "preset"),
    ({"min_replicas": 3, "max_replicas": 2}, "min_replicas"), ({"checkpoint": "999/outputs/model.pt"}, "checkpoint"),
    ({"name": "Bad Name"}, "name"), ({"max_replicas": 0}, "max_replicas"),
])
def test_bad_service_specs_get_400(world, client_for, overrides, field):
    response = create(client_for(world.member), **overrides)
    assert response.status_code == 400 and field in response.json()
    assert not Job.objects.exists()


def test_a_service_runs_replicas_as_inference_jobs_and_the_gateway_routes_to_them(world, client_for,
                                                                                  replica_server):
    body = create(client_for(world.member)).json()
    replica_job = Job.objects.get()
    assert replica_job.kind == "inference" and replica_job.workload["serve"]["workload"] == "mlp-digits"
    assert replica_job.preset == "infer-int8"
    gateway = bearer(world.viewer)
    path = body["endpoint"]
    response = gateway.post(path, {"inputs": [[0] * 64]}, content_type="application/json")
    assert response.status_code == 503 and "ready" in response.json()["detail"]
    run_replica(replica_job, replica_server())
    service = InferenceService.objects.get()
    summary = services.reconcile(service)
    assert summary["ready"] == 1 and summary["p95_ms"] == 9.0
    response = gateway.post(path, {"inputs": [[0] * 64, [1] * 64]}, content_type="application/json")
    assert response.status_code == 200 and response.json() == {"outputs": [7, 7]}
    assert response["X-Replica-Job"] == str(replica_job.pk)
    detail = client_for(world.member).get(f"/api/v1/services/{service.pk}/").json()
    assert detail["stats"]["ready"] == 1 and detail["replicas"] == [{"job": replica_job.pk, "state": "running",
                                                                     "ready": True}]


def test_gateway_auth_team_and_input_checks(world, client_for, replica_server):
    create(client_for(world.member))
    path = "/serve/vision/digits/predict"
    assert Client().post(path, {"inputs": [1]}, content_type="application/json").status_code == 401
    assert bearer(world.other).post(path, {"inputs": [1]}, content_type="application/json").status_code == 404
    assert bearer(world.noteam).post(path, {"inputs": [1]}, content_type="application/json").status_code == 404
    member = bearer(world.member)
    assert member.post("/serve/vision/nope/predict", {"inputs": [1]},
                       content_type="application/json").status_code == 404
    for bad in [b"not json", b"[1, 2]", b'{"inputs": []}', b'{"data": [1]}']:
        response = member.post(path, bad, content_type="application/json")
        assert response.status_code == 400 and "inputs" in response.json()["detail"]
    assert member.get(path).status_code == 405


def test_a_failing_replica_is_retried_on_another(world, client_for, replica_server):
    create(client_for(world.member), min_replicas=2, max_replicas=2)
    broken, healthy = Job.objects.order_by("id")
    run_replica(broken, replica_server(fail=True))
    run_replica(healthy, replica_server())
    services.reconcile(InferenceService.objects.get())
    gateway = bearer(world.member)
    for _ in range(4):
        response = gateway.post("/serve/vision/digits/predict", {"inputs": [[0] * 64]},
                                content_type="application/json")
        assert response.status_code == 200 and response["X-Replica-Job"] == str(healthy.pk)


def test_a_ready_replica_that_misses_a_poll_stays_routed_through_the_grace_only(world, client_for, replica_server):
    create(client_for(world.member))
    job = Job.objects.get()
    server = replica_server()
    run_replica(job, server)
    service = InferenceService.objects.get()
    assert services.reconcile(service, now=1000.0)["ready"] == 1
    server.shutdown()  # polls fail from now on (a busy or dead server)
    server.server_close()
    assert services.reconcile(service, now=1000.0 + services.READY_GRACE_S)["ready"] == 1
    assert services.ready_replicas(service.pk)[0]["job"] == job.pk
    assert services.reconcile(service, now=1001.0 + services.READY_GRACE_S)["ready"] == 0
    assert services.ready_replicas(service.pk) == []


def test_replicas_that_end_are_replaced_and_delete_releases_everything(world, client_for, replica_server):
    body = create(client_for(world.member)).json()
    first = Job.objects.get()
    run_replica(first, replica_server())
    host = Host.objects.get(address="127.0.0.1")
    job_services.job_report_status(host=host, job_id=first.pk, status=JobStatus("failed", 1, exit_code=137,
                                                                               reason="killed by SIGKILL"))
    service = InferenceService.objects.get()
    services.reconcile(service)
    assert Job.objects.count() == 2
    assert set(Job.objects.values_list("service_group", flat=True)) == {f"service:{service.pk}"}
    kinds = list(service.events.values_list("kind", flat=True))
    assert kinds == ["created", "replica_started", "replica_ended", "replica_started"]
    assert client_for(world.viewer).delete(f"/api/v1/services/{body['id']}/").status_code == 403
    assert client_for(world.member).delete(f"/api/v1/services/{body['id']}/").status_code == 204
    assert not Job.objects.filter(state__in=["queued", "placed", "running"]).exists()
    assert client_for(world.member).get("/api/v1/services/").json()["count"] == 0


def test_autoscaling_decisions(world):
    """The service's fields reach the core's rule (apps.scheduling.autoscale; its cases are in tests/scheduling)."""
    service = InferenceService(team=world.vision, name="s", owner=world.member, workload="mlp-digits",
                               min_replicas=1, max_replicas=3, target_p95_ms=100, desired_replicas=1)
    now = timezone.now().timestamp()
    calm = {"replicas": 1, "ready": 1, "rps": 5.0, "window_requests": 150, "p95_ms": 20.0, "queue_depth": 0}
    assert services.autoscale_decision(service, calm, now) == (1, "steady")
    hot = {"replicas": 1, "ready": 1, "rps": 50.0, "window_requests": 1500, "p95_ms": 400.0, "queue_depth": 0}
    desired, reason = services.autoscale_decision(service, hot, now)
    assert desired == 2 and "p95 400 ms > target 100 ms" in reason
    service.desired_replicas, service.last_scaled_at = 2, timezone.now()
    assert services.autoscale_decision(service, {**hot, "replicas": 2}, now)[1].startswith("waiting for 1 replica")
    assert services.autoscale_decision(service, {**hot, "replicas": 2, "ready": 2}, now)[1] == "cooling down"
    later = now + 120
    desired, reason = services.autoscale_decision(service, {"replicas": 2, "ready": 2, "rps": 0.0, "p95_ms": None,
                                                            "queue_depth": 0}, later)
    assert desired == 1 and reason.startswith("idle")

"""Inference replicas past the gateway: a replica answers only the console, listens only where it was told, and the
console calls replicas only at their registered hosts; hosts register real addresses; revoked tokens stop at once.

The replica is the real server (`python -m workers.runtime.serve`), started with the argv and environment the
agent's JobRunner builds for a dispatched replica; the console side runs in-process on the test database, with
stand-in replicas (tests/serving) that count the requests reaching them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from apps.accounts import services as account_services
from apps.accounts import tokens
from apps.accounts.models import ApiToken
from apps.accounts.services import _token_cache_key
from apps.cluster.models import Host
from apps.cluster.services import host_token_issue
from apps.jobs import services as job_services
from apps.jobs.models import Job
from apps.jobs.scheduler import scheduler_pass
from apps.serving import services
from apps.serving.models import InferenceService
from apps.serving.replica_auth import replica_secret
from tests.cluster.test_agent_api import agent, registration
from tests.integration.live import wait_until
from tests.serving.test_services_and_gateway import Replica, bearer, create, run_replica
from workers.agent import main as agent_main
from workers.agent.runner import JobProcess, JobRunner
from workers.protocol import REPLICA_SECRET_ENV, REPLICA_SECRET_HEADER, Dispatch

pytestmark = [pytest.mark.faults]

REPO = Path(__file__).resolve().parents[2]
SECRET = replica_secret(41, 1)
PREDICT = {"inputs": [[0] * 64]}


# --- the replica process, as the agent starts it


def replica_dispatch(secret: str = SECRET) -> Dispatch:
    return Dispatch(job_id=41, attempt=1, host="sim-a", gpu_indices=(0,), kind="inference", preset="infer-fp32",
                    workload={"serve": {"workload": "mlp-digits", "max_batch": 1, "max_wait_ms": 1.0}},
                    time_limit_s=600, replica_secret=secret)


def agent_launch(tmp: Path, address: str, secret: str = SECRET) -> tuple[list[str], dict[str, str]]:
    """The argv and environment JobRunner gives a dispatched replica (it runs them under its shim)."""
    runner = JobRunner(None, work_root=tmp / "work", artifacts_root=tmp / "artifacts", simulated=True,
                       address=address)
    dispatch = replica_dispatch(secret)
    job = JobProcess(dispatch, tmp / "work")
    env = runner.environment(job)
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return runner.command(dispatch), env


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replica")
    argv, env = agent_launch(tmp, "127.0.0.1")
    log = (tmp / "server.log").open("wb")
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    progress = Path(env["CONSOLE_PROGRESS_FILE"])
    deadline = time.monotonic() + 180
    port = None
    while port is None:
        lines = progress.read_text().splitlines() if progress.exists() else []
        records = [json.loads(line) for line in lines if line.strip()]
        port = next((record["port"] for record in records if record.get("type") == "serving"), None)
        if port is None:
            assert proc.poll() is None, (tmp / "server.log").read_text()
            assert time.monotonic() < deadline, "the replica did not start serving"
            time.sleep(0.1)
    try:
        yield {"proc": proc, "port": port, "argv": argv, "env": env}
    finally:
        proc.kill()
        proc.wait(timeout=10)


def call(method: str, url: str, secret: str | None, **options) -> httpx.Response:
    headers = {REPLICA_SECRET_HEADER: secret} if secret is not None else {}
    return httpx.request(method, url, headers=headers, timeout=10, **options)


def test_the_agent_hands_the_secret_over_in_the_environment_and_binds_the_registered_address(replica):
    argv, env = replica["argv"], replica["env"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert env[REPLICA_SECRET_ENV] == SECRET
    assert not any(SECRET in arg for arg in argv)
    cmdline = Path(f"/proc/{replica['proc'].pid}/cmdline").read_bytes()  # what every local user can read
    assert SECRET.encode() not in cmdline and b"--host\x00127.0.0.1" in cmdline


def test_the_agent_does_not_start_a_replica_without_a_secret(tmp_path):
    with pytest.raises(ValueError, match="replica secret"):
        agent_launch(tmp_path, "127.0.0.1", secret="")


@pytest.mark.parametrize("path", ["/health", "/stats", "/predict", "/nope"])
@pytest.mark.parametrize("secret", [None, "", "wrong-secret-0123456789abcdef", SECRET[:-1], SECRET + "x"])
def test_without_the_secret_every_path_is_401(replica, path, secret):
    method = "POST" if path == "/predict" else "GET"
    response = call(method, f"http://127.0.0.1:{replica['port']}{path}", secret,
                    **({"json": PREDICT} if method == "POST" else {}))
    assert response.status_code == 401, response.text
    assert REPLICA_SECRET_HEADER in response.json()["detail"] and "workload" not in response.text


def test_with_the_secret_it_answers_and_refused_requests_did_no_work(replica):
    base = f"http://127.0.0.1:{replica['port']}"
    before = call("GET", f"{base}/stats", SECRET).json()["requests"]
    for _ in range(3):
        assert call("POST", f"{base}/predict", "nope-nope-nope-nope", json=PREDICT).status_code == 401
    assert call("GET", f"{base}/stats", SECRET).json()["requests"] == before  # nothing ran for them
    answer = call("POST", f"{base}/predict", SECRET, json=PREDICT)
    assert answer.status_code == 200 and len(answer.json()["outputs"]) == 1
    assert call("GET", f"{base}/health", SECRET).json()["ready"] is True
    assert call("GET", f"{base}/stats", SECRET).json()["requests"] == before + 1
    # Two secret headers (one right, one wrong) are not the secret.
    doubled = httpx.get(f"{base}/health", headers=[(REPLICA_SECRET_HEADER, SECRET), (REPLICA_SECRET_HEADER, "x")],
                        timeout=10)
    assert doubled.status_code == 401


def test_it_is_not_reachable_on_another_interface_address(replica):
    with pytest.raises(httpx.ConnectError):
        call("GET", f"http://127.0.0.2:{replica['port']}/health", SECRET)
    # The control: a socket on all interfaces is reachable there (127.0.0.0/8 is loopback on Linux).
    with socket.socket() as wide:
        wide.bind(("0.0.0.0", 0))
        wide.listen(1)
        with socket.create_connection(("127.0.0.2", wide.getsockname()[1]), timeout=5):
            pass


@pytest.mark.parametrize(("extra", "env", "reason"), [
    (["--host", "0.0.0.0"], {REPLICA_SECRET_ENV: SECRET}, "every interface"),
    (["--host", "::"], {REPLICA_SECRET_ENV: SECRET}, "every interface"),
    ([], {}, REPLICA_SECRET_ENV),
    ([], {REPLICA_SECRET_ENV: "short"}, REPLICA_SECRET_ENV),
    (["--no-auth", "--host", "10.1.2.3"], {}, "loopback"),
])
def test_the_server_refuses_to_start_open(extra, env, reason):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONSOLE_")}
    done = subprocess.run([sys.executable, "-m", "workers.runtime.serve", "--workload", "mlp-digits", *extra],
                          cwd=REPO, env={**clean, "PYTHONPATH": str(REPO), **env}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and reason in done.stderr, done.stderr


# --- host addresses


BAD_ADDRESSES = ["http://10.0.0.1", "10.0.0.1:8000", "gpu-1/x", "user@gpu-1", "gpu 1", "gpu-1\n", " 10.0.0.1",
                 "-gpu.example", "gpu_1.example", "fe80::1%eth0", "[::1]", "1.2.3", "999.1.1.1", "a..b",
                 "x" * 64 + ".example", "gpu-1.", "gpu-1?x=1", "gpu-1#x", "évil.example"]


@pytest.fixture
def registered(db):
    host, secret = host_token_issue(name="sim-a")
    response = agent(secret).post("/api/v1/agent/register/", registration("sim-a", address="10.0.0.7"),
                                  format="json")
    assert response.status_code == 200, response.content
    return agent(secret)


@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_registration_with_a_bad_address_is_a_400_naming_it(registered, address):
    response = registered.post("/api/v1/agent/register/",
                               registration("sim-a", address=address, agent_version="9.9.9"), format="json")
    assert response.status_code == 400 and "address" in response.json(), response.content
    host = Host.objects.get(name="sim-a")
    assert host.address == "10.0.0.7" and host.agent_version == "0.1.0"  # nothing of it was recorded


@pytest.mark.parametrize("address", ["10.0.0.8", "::1", "2001:db8::5", "gpu-01", "gpu-01.lab.example", ""])
def test_registration_with_an_address_or_host_name_is_recorded(registered, address):
    response = registered.post("/api/v1/agent/register/", registration("sim-a", address=address), format="json")
    assert response.status_code == 200, response.content
    assert Host.objects.get(name="sim-a").address == address


@pytest.mark.parametrize("address", ["http://10.0.0.1", "10.0.0.1:8000", "", "gpu 1"])
def test_the_agent_refuses_a_bad_address_at_start(address, capsys):
    with pytest.raises(SystemExit) as stopped:
        agent_main.parse_args(["--address", address])
    assert stopped.value.code == 2 and "--address" in capsys.readouterr().err
    assert agent_main.parse_args(["--address", "10.0.0.1"]).address == "10.0.0.1"


# --- the console calls registered endpoints only


@pytest.fixture(autouse=True)
def fresh_cache():
    cache.clear()


@pytest.fixture
def stand_in():
    """Stand-in replicas (tests/serving) on 127.0.0.1, answering only with their replica's secret."""
    servers = []

    def start() -> ThreadingHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", 0), type("R", (Replica,), {}))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()


def counting(server) -> list[str]:
    """The paths of the requests reaching a stand-in replica."""
    seen: list[str] = []
    handler = server.RequestHandlerClass
    for name in ("do_GET", "do_POST"):
        original = getattr(handler, name)

        def wrapped(self, original=original):
            seen.append(self.path)
            original(self)

        setattr(handler, name, wrapped)
    return seen


def test_the_endpoint_host_is_the_placement_hosts_registered_address(world, client_for, stand_in):
    create(client_for(world.member))
    job = Job.objects.get()
    server = stand_in()
    seen = counting(server)
    run_replica(job, server)  # registered address 127.0.0.1
    # The replica's record claims another host: only its port is used.
    host = Host.objects.get(address="127.0.0.1")
    job_services.job_record_progress(host=host, job_id=job.pk, attempt=job.attempts, progress={
        "type": "serving", "host": "10.9.9.9", "port": server.server_address[1]})
    service = InferenceService.objects.get()
    assert services.reconcile(service)["ready"] == 1
    assert seen == ["/stats"]
    (ready,) = services.ready_replicas(service.pk)
    assert (ready["address"], ready["port"]) == ("127.0.0.1", server.server_address[1])
    assert bearer(world.member).post("/serve/vision/digits/predict", PREDICT,
                                     content_type="application/json").status_code == 200
    assert seen == ["/stats", "/predict"]


@pytest.mark.parametrize("port", [True, "8080", 0, 70000, -1, 80.0, None])
def test_a_reported_port_that_is_not_1_to_65535_is_never_used(world, client_for, stand_in, port):
    create(client_for(world.member))
    job = Job.objects.get()
    server = stand_in()
    seen = counting(server)
    run_replica(job, server)
    Job.objects.filter(pk=job.pk).update(runtime_info={})
    job_services.job_record_progress(host=Host.objects.get(address="127.0.0.1"), job_id=job.pk,
                                     attempt=job.attempts, progress={"type": "serving", "port": port})
    assert "port" not in Job.objects.get(pk=job.pk).runtime_info
    assert services.reconcile(InferenceService.objects.get())["ready"] == 0 and seen == []


# "x@127.0.0.1" would reach the stand-in if the console built its URL unchecked (a user part, then its host).
@pytest.mark.parametrize("address", ["127.0.0.1:1@10.9.9.9", "127.0.0.1/x?", "http://127.0.0.1", "x@127.0.0.1"])
def test_a_host_whose_stored_address_is_not_an_address_is_never_called(world, client_for, stand_in,
                                                                       address):
    create(client_for(world.member))
    job = Job.objects.get()
    server = stand_in()
    seen = counting(server)
    run_replica(job, server)
    Host.objects.filter(address="127.0.0.1").update(address=address)  # a row from before the validation
    assert services.reconcile(InferenceService.objects.get())["ready"] == 0 and seen == []


def test_an_earlier_attempts_endpoint_is_never_called(world, client_for, stand_in):
    create(client_for(world.member))
    job = Job.objects.get()
    server = stand_in()
    seen = counting(server)
    run_replica(job, server)
    Job.objects.filter(pk=job.pk).update(attempts=job.attempts + 1)  # requeued and placed again, not reported yet
    assert services.reconcile(InferenceService.objects.get())["ready"] == 0 and seen == []


def test_the_gateway_refuses_a_published_entry_that_is_not_a_registered_endpoint(world, client_for, stand_in):
    create(client_for(world.member))
    job = Job.objects.get()
    server = stand_in()
    seen = counting(server)
    run_replica(job, server)
    service = InferenceService.objects.get()
    port = server.server_address[1]
    cache.set(services.replicas_key(service.pk), [
        {"job": job.pk, "attempt": job.attempts, "address": f"127.0.0.1:{port}/x#", "port": port},
        {"job": job.pk, "attempt": job.attempts, "address": "127.0.0.1", "port": str(port)},
        {"job": job.pk, "url": f"http://127.0.0.1:{port}"},  # the old shape: a URL from wherever
    ], timeout=30)
    response = bearer(world.member).post("/serve/vision/digits/predict", PREDICT, content_type="application/json")
    assert response.status_code == 503 and seen == []


def test_replica_secrets_differ_per_job_and_attempt_and_only_replicas_get_one(world, client_for):
    assert len({replica_secret(1, 1), replica_secret(1, 2), replica_secret(2, 1)}) == 3
    create(client_for(world.member))
    scheduler_pass()
    job = Job.objects.get()
    (_, message), = job_services.dispatch_messages(job)
    assert message.replica_secret == replica_secret(job.pk, job.attempts)
    assert message.replica_secret not in repr(message)
    detail = client_for(world.member).get(f"/api/v1/jobs/{job.pk}/").content.decode()
    assert message.replica_secret not in detail
    training = client_for(world.member).post("/api/v1/jobs/", {"name": "t", "team": "vision", "gpus": 1, "workload": {
        "builtin": "mlp-digits"}}, format="json").json()
    scheduler_pass()
    (_, other), = job_services.dispatch_messages(Job.objects.get(pk=training["id"]))
    assert other.replica_secret == ""


# --- the gateway's token cache


def test_a_revoked_token_stops_at_the_next_gateway_call(world, client_for, stand_in):
    create(client_for(world.member))
    run_replica(Job.objects.get(), stand_in())
    services.reconcile(InferenceService.objects.get())
    gateway = bearer(world.member)
    path = "/serve/vision/digits/predict"
    assert gateway.post(path, PREDICT, content_type="application/json").status_code == 200
    token = ApiToken.objects.get(user=world.member)
    assert cache.get(_token_cache_key(token.digest)) == world.member.pk  # the call went through the cache
    revoked = client_for(world.member).post(f"/api/v1/tokens/{token.pk}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["active"] is False
    assert gateway.post(path, PREDICT, content_type="application/json").status_code == 401


def test_a_lookup_racing_the_revocation_does_not_put_the_token_back(world, client_for, stand_in):
    create(client_for(world.member))
    run_replica(Job.objects.get(), stand_in())
    services.reconcile(InferenceService.objects.get())
    gateway = bearer(world.member)
    path = "/serve/vision/digits/predict"
    token = ApiToken.objects.get(user=world.member)
    revoked_at = client_for(world.member).post(f"/api/v1/tokens/{token.pk}/revoke/").json()["revoked_at"]
    # A gateway lookup that read the row before the revocation committed: it still sees the token active...
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=None)
    assert gateway.post(path, PREDICT, content_type="application/json").status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=revoked_at)  # ...and then the revocation commits
    assert gateway.post(path, PREDICT, content_type="application/json").status_code == 401


def test_unknown_tokens_are_not_cached(world, client_for):
    create(client_for(world.member))
    for n in range(20):
        secret = f"gpc_unknown-{n}"
        response = Client(headers={"Authorization": f"Bearer {secret}"}).post(
            "/serve/vision/digits/predict", PREDICT, content_type="application/json")
        assert response.status_code == 401
        assert cache.get(_token_cache_key(tokens.digest(secret))) is None


def test_a_cached_token_past_its_expiry_stops_once_the_cache_entry_lapses(world, client_for, stand_in, monkeypatch):
    """The cache holds a token's user for TOKEN_CACHE_S only: that bounds how long a token the database no longer
    accepts (expired here; its user deactivated is checked on each call) still opens the gateway."""
    monkeypatch.setattr(account_services, "TOKEN_CACHE_S", 1)  # the cache's lifetime, short for the test
    create(client_for(world.member))
    run_replica(Job.objects.get(), stand_in())
    services.reconcile(InferenceService.objects.get())
    gateway = bearer(world.member)
    path = "/serve/vision/digits/predict"
    assert gateway.post(path, PREDICT, content_type="application/json").status_code == 200
    token = ApiToken.objects.get(user=world.member)
    assert cache.get(_token_cache_key(token.digest)) == world.member.pk  # the call went through the cache
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    wait_until(lambda: gateway.post(path, PREDICT, content_type="application/json").status_code == 401,
               timeout=60, what="the expired token's cache entry to lapse and the gateway to refuse it")

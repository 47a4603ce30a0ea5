"""Hostile input (issue 20, point 7): deep JSON, forged client addresses, foreign websocket origins, example secret
keys, tickets in access logs, token lifetimes, huge artifact listings, unknown fields.

In-process through Django's test client and Channels' communicator, except where a real server process is what is
tested (the ASGI server's access log, the settings at start).
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from rest_framework.test import APIClient

from apps.cluster.services import host_token_issue
from apps.core.client_address import client_address
from apps.core.models import AuditEvent
from apps.jobs.models import Job
from tests.conftest import train_spec

pytestmark = [pytest.mark.faults]
ROOT = Path(__file__).resolve().parents[2]

DEEP = 100_000


def deep_list(levels: int) -> str:
    return "[" * levels + "]" * levels


def deep_params(levels: int) -> str:
    """A submission whose workload params nest `levels` objects (params itself is the first)."""
    inner = "1"
    for _ in range(levels):
        inner = '{"a": ' + inner + "}"
    return ('{"name": "deep", "team": "vision", "gpus": 1, "workload": {"builtin": "mlp-digits", "params": '
            + inner + "}}")


# --- 1. deeply nested JSON


@pytest.mark.django_db
def test_deep_json_in_job_params_is_a_400(world, client_for):
    client = client_for(world.member)
    body = '{"name": "deep", "team": "vision", "gpus": 1, "workload": {"builtin": "mlp-digits", "params": {"a": ' \
        + deep_list(DEEP) + "}}}"
    answer = client.post("/api/v1/jobs/", body, content_type="application/json")
    assert answer.status_code == 400, answer.content[:300]
    assert "nested deeper than 64 levels" in answer.json()["detail"]
    assert not Job.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("form", [False, True])
def test_a_nul_byte_in_a_related_name_is_a_400_naming_the_field(world, client_for, form):
    """Found by schemathesis on PostgreSQL: a slug relation looked up 'v\\x00' as is and the database refused it."""
    body = {"name": "r", "kind": "gpu_no_data", "severity": "critical", "teams": ["vision", "n\x00lp"]}
    client = client_for(world.admin)
    answer = (client.post("/api/v1/alert-rules/", body) if form
              else client.post("/api/v1/alert-rules/", body, format="json"))
    assert answer.status_code == 400, answer.content[:300]
    assert answer.json() == {"teams": ["Must not contain NUL bytes."]}


@pytest.mark.django_db
def test_params_deeper_than_32_levels_are_a_400_naming_workload(world, client_for):
    client = client_for(world.member)
    answer = client.post("/api/v1/jobs/", deep_params(33), content_type="application/json")
    assert answer.status_code == 400
    assert answer.json() == {"workload": {"params": ["Nested deeper than 32 levels."]}}
    assert not Job.objects.exists()
    # 32 levels pass the depth cap (and reach the workload's own rules: mlp-digits takes no "a").
    at_cap = client.post("/api/v1/jobs/", deep_params(32), content_type="application/json").json()
    assert "unknown parameter" in at_cap["workload"]["params"]["a"][0]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/v1/auth/token/", "/api/v1/agent/register/", "/api/v1/agent/heartbeat/",
                                  "/api/v1/agent/telemetry/", "/api/v1/tokens/", "/api/v1/ws-ticket/"])
def test_deep_json_in_unauthenticated_bodies_is_never_a_500(world, path):
    for client in (APIClient(), APIClient(headers={"Authorization": "Bearer not-a-token"})):
        answer = client.post(path, deep_list(DEEP), content_type="application/json")
        assert answer.status_code in {400, 401, 403}, (path, answer.status_code, answer.content[:300])
    if path == "/api/v1/auth/token/":
        answer = APIClient().post(path, deep_list(DEEP), content_type="application/json")
        assert answer.status_code == 400 and "nested deeper" in answer.json()["detail"]


@pytest.mark.django_db
def test_deep_json_from_an_agent_is_a_400(world):
    _, token = host_token_issue(name="node-a")
    client = APIClient(HTTP_AUTHORIZATION=f"Host {token}")
    for path in ("/api/v1/agent/register/", "/api/v1/agent/heartbeat/", "/api/v1/agent/telemetry/"):
        answer = client.post(path, deep_list(DEEP), content_type="application/json")
        assert answer.status_code == 400, (path, answer.content[:300])
        assert "nested deeper" in answer.json()["detail"]


@pytest.mark.django_db
def test_deep_json_in_the_dashboard_params_field_is_a_form_error(world):
    from django.test import Client

    browser = Client()
    browser.force_login(world.member)
    answer = browser.post("/jobs/new/", {"name": "deep", "team": "vision", "gpus": "1", "kind": "train",
                                         "priority": "normal", "builtin": "mlp-digits",
                                         "params": '{"a": ' + deep_list(DEEP) + "}"})
    assert answer.status_code == 400
    assert "Nested deeper than 32 levels." in answer.content.decode()
    assert not Job.objects.exists()


# --- 2. X-Forwarded-For only from trusted proxies

PASSWORD = "pw-for-tests-123"


def token_attempt(client: APIClient, username: str, password: str, forwarded_for: str):
    return client.post("/api/v1/auth/token/", {"username": username, "password": password, "name": "t"},
                       format="json", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR=forwarded_for)


def failed_login_addresses() -> list[str | None]:
    return list(AuditEvent.objects.filter(action=AuditEvent.Action.LOGIN_FAILED).values_list("ip_address", flat=True))


@pytest.mark.django_db
def test_forged_forwarded_for_neither_dodges_the_lockout_nor_reaches_the_audit_log(world, settings):
    settings.TRUSTED_PROXIES = ()
    client = APIClient()
    for attempt in range(5):  # the fifth failure locks the account out at once
        assert token_attempt(client, "mia", "wrong", f"198.51.100.{attempt}").status_code == (429 if attempt == 4 else 400)
    locked = token_attempt(client, "mia", PASSWORD, "198.51.100.77")
    assert locked.status_code == 429, locked.content
    assert not world.member.api_tokens.exists()
    # Every failure (the refused sixth attempt too) is recorded under the peer's address, none under a forged one.
    addresses = failed_login_addresses()
    assert len(addresses) >= 5 and set(addresses) == {"127.0.0.1"}


@pytest.mark.django_db
def test_a_trusted_proxys_forwarded_for_is_the_client_address(world, settings):
    settings.TRUSTED_PROXIES = (ipaddress.ip_network("127.0.0.1/32"),)
    client = APIClient()
    for attempt in range(5):
        assert token_attempt(client, "mia", "wrong", "203.0.113.9, 127.0.0.1").status_code == (429 if attempt == 4 else 400)
    assert token_attempt(client, "mia", PASSWORD, "203.0.113.9").status_code == 429
    # Another client behind the same proxy is not locked out by the first one's failures.
    assert token_attempt(client, "mia", PASSWORD, "203.0.113.10").status_code == 201
    addresses = failed_login_addresses()
    assert len(addresses) >= 5 and set(addresses) == {"203.0.113.9"}


@pytest.mark.parametrize(("peer", "forwarded", "trusted", "expected"), [
    ("127.0.0.1", "10.1.1.1", "", "127.0.0.1"),
    ("10.0.0.2", "198.51.100.1, 10.0.0.3", "10.0.0.0/8", "198.51.100.1"),
    ("10.0.0.2", "6.6.6.6, 198.51.100.1", "10.0.0.0/8", "198.51.100.1"),  # the client's own claim is not believed
    ("10.0.0.2", "not-an-address", "10.0.0.0/8", "10.0.0.2"),
    ("::1", "[2001:db8::1]:443", "::1", "2001:db8::1"),
    ("", "1.2.3.4", "", None),
])
def test_client_address_rules(settings, peer, forwarded, trusted, expected):
    settings.TRUSTED_PROXIES = tuple(ipaddress.ip_network(n) for n in trusted.split(",") if n)
    assert client_address(peer, forwarded) == expected


def test_trusted_proxies_setting_is_parsed_strictly(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from console.env import env_networks

    monkeypatch.setenv("CONSOLE_TRUSTED_PROXIES", "127.0.0.1, 10.0.0.0/8,::1")
    assert [str(n) for n in env_networks("CONSOLE_TRUSTED_PROXIES")] == ["127.0.0.1/32", "10.0.0.0/8", "::1/128"]
    monkeypatch.setenv("CONSOLE_TRUSTED_PROXIES", "proxy.example")
    with pytest.raises(ImproperlyConfigured, match="CONSOLE_TRUSTED_PROXIES"):
        env_networks("CONSOLE_TRUSTED_PROXIES")


def uvicorn_commands() -> list[str]:
    """Every command line of a recipe that starts the console's ASGI server."""
    files = [ROOT / "Procfile", ROOT / "tests" / "integration" / "live.py",
             *sorted((ROOT / "deploy").rglob("*.service")), *sorted((ROOT / "deploy").rglob("*.yaml")),
             *sorted((ROOT / "deploy").rglob("Dockerfile*"))]
    found = []
    for path in files:
        text = path.read_text()
        for match in re.finditer(r"uvicorn\W+console\.asgi:application", text):
            end = text.find("]", match.end()) if text[match.start() - 1] in "\"'" else text.find("\n", match.end())
            found.append(f"{path.relative_to(ROOT)}: {text[match.start():end]}")
    return found


def test_every_recipe_runs_uvicorn_without_its_proxy_headers():
    # uvicorn believes X-Forwarded-For from 127.0.0.1 by default and rewrites the peer address before Django sees it.
    commands = uvicorn_commands()
    assert len(commands) >= 6, commands
    for command in commands:
        assert "--no-proxy-headers" in command and "forwarded-allow-ips" not in command, command


def test_every_recipe_keeps_idle_connections_longer_than_its_clients_pools():
    # uvicorn's own keep-alive (5 s) equals httpx's pool expiry (the agents', gpuctl's, the tests'): the server could
    # close an idle connection just as a client sent its next request on it, which then fails with no response.
    expiry = httpx.Limits().keepalive_expiry
    for command in uvicorn_commands():
        found = re.search(r"--timeout-keep-alive\W+(\d+)", command)
        assert found and expiry is not None and int(found[1]) > 2 * expiry, command


# --- 3. the websocket Origin check compares scheme, host and port


def socket_answer(path: str, hdrs: list[tuple[bytes, bytes]]) -> int | None:
    """None when the socket opened, else the close code."""
    from asgiref.sync import async_to_sync
    from channels.testing import WebsocketCommunicator

    from console.asgi import application

    async def run():
        socket = WebsocketCommunicator(application, path, headers=hdrs)
        connected, code = await socket.connect(timeout=30)
        await socket.disconnect()
        return None if connected else code

    return async_to_sync(run)()


def browser_headers(user, origin: bytes, host: bytes = b"127.0.0.1:8000") -> list[tuple[bytes, bytes]]:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return [(b"origin", origin), (b"host", host), (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("origin", [b"http://localhost:9999", b"https://evil.example", b"http://127.0.0.1:8000.evil",
                                    b"https://127.0.0.1:8000", b"http://127.0.0.1:8001", b"http://127.0.0.1",
                                    b"null", b"http://127.0.0.1:8000/path"])
def test_foreign_origins_are_refused(world, origin):
    assert socket_answer("/ws/cluster/", browser_headers(world.member, origin)) == 4403


@pytest.mark.django_db(transaction=True)
def test_the_consoles_own_origin_opens_the_socket(world, settings):
    assert socket_answer("/ws/cluster/", browser_headers(world.member, b"http://127.0.0.1:8000")) is None
    # A Host the console does not serve makes no origin its own.
    settings.ALLOWED_HOSTS = ["console.example.org"]
    assert socket_answer("/ws/cluster/", browser_headers(world.member, b"http://127.0.0.1:8000")) == 4403
    # Behind a TLS proxy (Django's SECURE_PROXY_SSL_HEADER), the https origin is the console's.
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    hdrs = browser_headers(world.member, b"https://console.example.org", b"console.example.org")
    assert socket_answer("/ws/cluster/", hdrs + [(b"x-forwarded-proto", b"https")]) is None
    assert socket_answer("/ws/cluster/", hdrs) == 4403
    # A CSRF-trusted origin, port and all.
    settings.CSRF_TRUSTED_ORIGINS = ["https://app.example.org:8443"]
    assert socket_answer("/ws/cluster/", browser_headers(world.member, b"https://app.example.org:8443",
                                                         b"console.example.org")) is None
    assert socket_answer("/ws/cluster/", browser_headers(world.member, b"https://app.example.org",
                                                         b"console.example.org")) == 4403


# --- 4. production refuses the example secret keys


def example_secret_keys() -> set[str]:
    """Every DJANGO_SECRET_KEY value written in deploy/ (env examples, compose, Helm values)."""
    found = set()
    for path in (ROOT / "deploy").rglob("*"):
        if path.is_file() and path.suffix in {"", ".example", ".yaml", ".yml", ".env", ".md"}:
            text = path.read_text(errors="replace")
            found |= set(re.findall(r"DJANGO_SECRET_KEY[=:]\s*([^\s\"'$]{8,})", text))
            found |= set(re.findall(r"djangoSecretKey:\s*\"?([^\s\"]{8,})", text))
    return found


def start_production(secret_key: str, secrets_key: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CONSOLE_", "DATABASE_URL",
                                                                     "REDIS_URL", "CELERY_"))}
    env.update(CONSOLE_MODE="production", DJANGO_SECRET_KEY=secret_key, DJANGO_ALLOWED_HOSTS="console.example.org",
               DATABASE_URL="postgres://console@127.0.0.1:5432/console", DJANGO_SETTINGS_MODULE="console.settings")
    if secrets_key is not None:
        env["CONSOLE_SECRETS_KEY"] = secrets_key
    return subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_production_refuses_every_example_secret_key():
    keys = example_secret_keys()
    assert "change-me-to-at-least-fifty-random-characters-0123456789abcdef" in keys, keys
    for key in keys:
        result = start_production(key)
        assert result.returncode != 0, key
        assert "DJANGO_SECRET_KEY is an example or placeholder key" in result.stderr, result.stderr[-2000:]


def test_production_starts_with_a_real_secret_key():
    import secrets

    from cryptography.fernet import Fernet

    result = start_production(secrets.token_urlsafe(50), Fernet.generate_key().decode())
    assert result.returncode == 0, result.stderr[-2000:]


# --- 5. websocket tickets never reach the access log


def test_the_asgi_servers_log_never_shows_a_ticket(tmp_path):
    import httpx
    from websockets.exceptions import InvalidStatus, WebSocketException
    from websockets.sync.client import connect

    from tests.integration.live import free_port, wait_until

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CONSOLE_", "DATABASE_URL",
                                                                     "REDIS_URL", "CELERY_"))}
    env.update(CONSOLE_VAR_DIR=str(tmp_path / "var"), DJANGO_SETTINGS_MODULE="console.settings",
               PYTHONPATH=str(ROOT))
    log_path = tmp_path / "web.log"
    # As the recipes start it, with the access log on (uvicorn's default level, info).
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--no-proxy-headers", "--timeout-keep-alive", "75", "--log-level", "info"],
        cwd=ROOT, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # uvicorn binds its socket after the application's startup: "running on" is the line that says it listens.
        wait_until(lambda: "Uvicorn running on" in log_path.read_text() or server.poll() is not None, timeout=60,
                   what="uvicorn to listen", details=log_path.read_text)
        assert server.poll() is None, log_path.read_text()
        secrets_sent = ["wsT1cketSecretAAAA", "wsT1cketSecretBBBB"]
        try:
            with connect(f"ws://127.0.0.1:{port}/ws/cluster/?ticket={secrets_sent[0]}", open_timeout=30) as socket:
                socket.recv(timeout=30)
        except (InvalidStatus, WebSocketException, TimeoutError):
            pass  # an unknown ticket is refused: what matters is the handshake's log line
        # The same URL as a plain HTTP request goes to the access log proper.
        httpx.get(f"http://127.0.0.1:{port}/ws/cluster/?after=1&ticket={secrets_sent[1]}", timeout=30)
        wait_until(lambda: log_path.read_text().count("/ws/cluster/?") >= 2, timeout=30,
                   what="both request lines in the log", details=log_path.read_text)
        text = log_path.read_text()
        assert '"WebSocket /ws/cluster/?ticket=[redacted]"' in text, text
        assert "GET /ws/cluster/?after=1&ticket=[redacted] HTTP/1.1" in text, text
        for secret in secrets_sent:
            assert secret not in text, text
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize(("line", "expected"), [
    ("/ws/jobs/3/?ticket=abc", "/ws/jobs/3/?ticket=[redacted]"),
    ("/ws/cluster/?a=1&TICKET=abc&b=2", "/ws/cluster/?a=1&TICKET=[redacted]&b=2"),
    ("/ws/cluster/?myticket=abc", "/ws/cluster/?myticket=abc"),
])
def test_ticket_redaction(line, expected):
    from console.log_redaction import redact

    assert redact(line) == expected


# --- 6. the dashboard's token form has the API's lifetime cap


@pytest.mark.django_db
def test_dashboard_token_form_caps_the_lifetime_like_the_api(world, client_for, settings):
    from django.test import Client

    cap = settings.API_TOKEN_MAX_DAYS
    browser = Client()
    browser.force_login(world.member)
    answer = browser.post("/accounts/tokens/", {"name": "forever", "expires_in_days": "3650"})
    assert answer.status_code == 400
    assert f"Ensure this value is less than or equal to {cap}." in answer.content.decode()
    api = client_for(world.member).post("/api/v1/tokens/", {"name": "forever", "expires_in_days": 3650},
                                        format="json")
    assert api.status_code == 400 and "expires_in_days" in api.json()
    assert not world.member.api_tokens.exists()
    assert browser.post("/accounts/tokens/", {"name": "a year", "expires_in_days": str(cap)}).status_code == 200
    assert world.member.api_tokens.get().name == "a year"


def test_token_create_refuses_a_lifetime_past_the_cap(db, world, settings):
    from apps.accounts.services import token_create

    with pytest.raises(ValueError, match="1 to 366 days"):
        token_create(user=world.member, name="x", expires_in_days=settings.API_TOKEN_MAX_DAYS + 1)
    assert not world.member.api_tokens.exists()


# --- 7. artifact listings are paged


@pytest.mark.django_db
def test_artifact_listing_pages_through_more_files_than_the_cap(world, client_for, settings, tmp_path):
    from django.test import Client

    from apps.jobs.api import MAX_ARTIFACTS_PER_PAGE

    settings.ARTIFACT_STORE_URL = tmp_path.as_uri()
    client = client_for(world.member)
    job = client.post("/api/v1/jobs/", train_spec(), format="json").json()
    outputs = tmp_path / str(job["id"]) / "outputs"
    outputs.mkdir(parents=True)
    total = MAX_ARTIFACTS_PER_PAGE + 5
    for index in range(total):
        (outputs / f"f{index:05d}.bin").write_bytes(b"x")

    first = client.get(f"/api/v1/jobs/{job['id']}/artifacts/")
    assert first.status_code == 200
    assert len(first.json()) == MAX_ARTIFACTS_PER_PAGE and first["X-Truncated"] == "true"
    assert first.json()[-1]["path"] == f"outputs/f{MAX_ARTIFACTS_PER_PAGE - 1:05d}.bin"
    next_url = re.fullmatch(r'<(.+)>; rel="next"', first["Link"]).group(1)
    second = client.get(next_url)
    assert [a["path"] for a in second.json()] == [f"outputs/f{i:05d}.bin" for i in range(MAX_ARTIFACTS_PER_PAGE, total)]
    assert "X-Truncated" not in second and "Link" not in second
    assert client.get(f"/api/v1/jobs/{job['id']}/artifacts/?limit=100000").status_code == 400

    browser = Client()
    browser.force_login(world.member)
    page = browser.get(f"/jobs/{job['id']}/").content.decode()
    assert page.count(f"/api/v1/jobs/{job['id']}/artifacts/outputs/") == 200
    assert "the full listing" in page


def check_list_page(store, tmp_path) -> None:
    source = tmp_path / "src.bin"
    source.write_bytes(b"abc")
    names = sorted(f"d{i % 3}/f{i:03d}" for i in range(25))
    for name in reversed(names):
        store.put("job-9", name, source)
    assert store.list_page("job-9", limit=10) == [(n, 3) for n in names[:10]]
    assert store.list_page("job-9", after=names[9], limit=10) == [(n, 3) for n in names[10:20]]
    assert store.list_page("job-9", after=names[19], limit=10) == [(n, 3) for n in names[20:]]
    assert store.list_page("job-none", limit=10) == []


def test_artifact_stores_list_one_page_in_path_order(tmp_path, fake_s3):
    from workers.runtime.artifacts import artifact_store_from_url

    check_list_page(artifact_store_from_url((tmp_path / "store").as_uri()), tmp_path)
    check_list_page(artifact_store_from_url("s3://artifacts/console"), tmp_path)


# --- 8. unknown fields are a 400 naming them


@pytest.mark.django_db
@pytest.mark.parametrize(("body", "errors"), [
    (train_spec(gpuz=1), {"gpuz": ["Unknown field."]}),
    (train_spec(max_retry=2, priorty="high"), {"max_retry": ["Unknown field."], "priorty": ["Unknown field."]}),
    (train_spec(workload={"builtin": "mlp-digits", "parms": {}}), {"workload": {"parms": ["Unknown field."]}}),
    (train_spec(workload={"command": ["python", "x.py"], "env": {}}), {"workload": {"env": ["Unknown field."]}}),
])
def test_unknown_fields_of_a_submission_are_a_400_naming_them(world, client_for, body, errors):
    answer = client_for(world.member).post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 400
    assert answer.json() == errors
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_unknown_fields_elsewhere_are_a_400_too(world, client_for):
    from apps.accounts.models import ApiToken

    member, admin = client_for(world.member), client_for(world.admin)
    assert member.post("/api/v1/tokens/", {"name": "ci", "expires": 9}, format="json").json() == {
        "expires": ["Unknown field."]}
    assert APIClient().post("/api/v1/auth/token/", {"username": "mia", "password": PASSWORD, "name": "x",
                                                    "otp": "1"}, format="json").json() == {"otp": ["Unknown field."]}
    assert not ApiToken.objects.exists()
    quota = admin.patch("/api/v1/teams/vision/quota/", {"max_gpu": 1}, format="json")
    assert quota.status_code == 400 and quota.json() == {"max_gpu": ["Unknown field."]}
    assert world.vision.quota.max_gpus == 8
    service = member.post("/api/v1/services/", {"name": "s", "team": "vision", "replicaz": 3}, format="json")
    assert service.status_code == 400 and service.json()["replicaz"] == ["Unknown field."]
    # Read-only fields a client read back are known, not errors.
    back = admin.patch("/api/v1/teams/vision/quota/", {**admin.get("/api/v1/teams/vision/quota/").json(),
                                                        "max_gpus": 6}, format="json")
    assert back.status_code == 200, back.json()

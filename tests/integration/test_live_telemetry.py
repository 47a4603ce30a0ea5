"""Live telemetry end to end: simulated agents → ingest → websockets (real ASGI server, real websocket client),
alerts from injected faults feeding the scheduler, and a real Prometheus scraping /metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import websockets
from websockets.sync.client import connect

from tests.integration.live import LiveCluster, create_team, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCRIPTS = Path(__file__).parent / "scripts"
PY = sys.executable
PASSWORD = "a-long-pass-for-tests-9"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    live = LiveCluster(tmp_path_factory.mktemp("telemetry"), agents={"tm-a": "2xH200", "tm-f": "2xH100"})
    try:
        live.start()
        admin = live.admin()
        for team, user in [("red", "rita"), ("blue", "bob")]:
            create_team(admin, team, 4)
            assert admin.post("/api/v1/users/", json={"username": user, "password": PASSWORD}).status_code == 201
            assert admin.post(f"/api/v1/teams/{team}/members/",
                              json={"username": user, "role": "member"}).status_code == 201
        live.rita = live.user_client("rita", PASSWORD)
        live.bob = live.user_client("bob", PASSWORD)
        yield live
    finally:
        live.stop()


def frames(url: str, seconds: float, kind: str = "gpu.sample", **kwargs) -> list[tuple[float, dict]]:
    received = []
    with connect(url, open_timeout=10, **kwargs) as socket:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                message = json.loads(socket.recv(timeout=max(0.01, deadline - time.monotonic())))
            except TimeoutError:
                break
            if message["type"] == kind:
                received.append((time.time(), message))
    return received


def alerts(cluster, **params) -> list[dict]:
    return cluster.admin().get("/api/v1/alerts/", params=params).json()["results"]


def gpu_health(cluster, host: str, index: int) -> str:
    hosts = {h["name"]: h for h in cluster.admin().get("/api/v1/hosts/").json()["results"]}
    return next(g["health"] for g in hosts[host]["gpus"] if g["index"] == index)


def test_samples_arrive_about_once_a_second_with_their_sample_time(cluster):
    received = frames(cluster.ws_url("/ws/cluster/", cluster.rita), 6.5)
    assert 4 <= len(received) <= 8, len(received)
    for at, message in received[1:]:
        gpus = [g for g in message["gpus"] if g["host"] in {"tm-a", "tm-f"}]
        assert len(gpus) == 4 and all(g["simulated"] for g in gpus)
        assert all(at - g["ts"] < 3.0 for g in gpus)  # staleness: sampled on the host under 3 s ago
        assert all(g["available"] and g["utilization_pct"] is not None for g in gpus)


def test_unauthenticated_and_foreign_origin_sockets_are_refused_before_any_data(cluster):
    base = f"ws://127.0.0.1:{cluster.port}/ws/cluster/"
    with pytest.raises(websockets.exceptions.InvalidStatus):
        connect(base, open_timeout=10)
    ticket_url = cluster.ws_url("/ws/cluster/", cluster.rita)
    with pytest.raises(websockets.exceptions.InvalidStatus):
        connect(ticket_url, origin="https://evil.example", open_timeout=10)


def test_other_teams_see_none_of_a_jobs_metrics(cluster):
    job = cluster.rita.post("/api/v1/jobs/", json={
        "name": "sleepy", "team": "red", "gpus": 1, "gpu_type": "H200",
        "workload": {"command": [PY, str(SCRIPTS / "show_env.py"), "45"]}}).json()
    cluster.wait_state(job["id"], {"running"})
    mine = frames(cluster.ws_url(f"/ws/jobs/{job['id']}/", cluster.rita), 4)
    assert mine and all(g["job"] == job["id"] for _, m in mine for g in m["gpus"])
    assert any(m["gpus"] for _, m in mine)
    theirs = frames(cluster.ws_url("/ws/cluster/", cluster.bob), 3)
    assert theirs
    for _, message in theirs:
        assert all(g["job"] != job["id"] and g["team"] != "red" for g in message["gpus"])
    busy = [g for _, m in theirs for g in m["gpus"] if g.get("other_team")]
    assert busy, "the GPU shows as busy for another team, without naming the job"
    with pytest.raises(websockets.exceptions.InvalidStatus):
        connect(cluster.ws_url(f"/ws/jobs/{job['id']}/", cluster.bob), open_timeout=10)
    cluster.admin().post(f"/api/v1/jobs/{job['id']}/cancel/", json={})


def test_an_idle_job_gets_its_warning(cluster):
    rule = next(r for r in cluster.admin().get("/api/v1/alert-rules/").json()["results"] if r["kind"] == "job_idle")
    assert cluster.admin().patch(f"/api/v1/alert-rules/{rule['id']}/", json={"duration_s": 5}).status_code == 200
    job = cluster.rita.post("/api/v1/jobs/", json={
        "name": "idle", "team": "red", "gpus": 1, "gpu_type": "H200",
        "workload": {"command": [PY, str(SCRIPTS / "show_env.py"), "60"]}}).json()
    cluster.wait_state(job["id"], {"running"})
    warned = cluster.wait_for(lambda: [a for a in cluster.rita.get("/api/v1/alerts/").json()["results"]
                                       if a["job"] == job["id"]], timeout=30, what="the idle warning")
    assert "idle" in warned[0]["message"] and warned[0]["team"] == "red"
    assert not [a for a in cluster.bob.get("/api/v1/alerts/").json()["results"] if a["job"] == job["id"]]
    cluster.admin().patch(f"/api/v1/alert-rules/{rule['id']}/", json={"duration_s": 900})
    cluster.admin().post(f"/api/v1/jobs/{job['id']}/cancel/", json={})


def test_xid_raises_an_alert_within_2_seconds_and_marks_the_gpu_faulty(cluster):
    injected = time.monotonic()
    cluster.inject("tm-f", {1: "xid:48"})
    alert = cluster.wait_for(lambda: [a for a in alerts(cluster) if "XID 48" in a["message"]], timeout=10,
                             what="the XID alert", interval=0.1)[0]
    assert time.monotonic() - injected < 2.0 + 0.5  # poll interval slack
    assert alert["host"] == "tm-f" and gpu_health(cluster, "tm-f", 1) == "faulty"
    assert cluster.admin().post(f"/api/v1/alerts/{alert['id']}/resolve/").status_code == 200
    assert gpu_health(cluster, "tm-f", 1) == "ok"
    cluster.inject("tm-f", {})


def test_overheating_gpu_alerts_within_35_s_takes_no_jobs_and_recovers_when_cool(cluster):
    injected = time.monotonic()
    cluster.inject("tm-f", {0: "overheat"})
    alert = cluster.wait_for(lambda: [a for a in alerts(cluster, state="firing") if "°C" in a["message"]],
                             timeout=40, what="the temperature alert", interval=0.5)[0]
    latency = time.monotonic() - injected
    assert latency < 35, f"the alert came {latency:.1f} s after the fault"
    assert alert["host"] == "tm-f" and gpu_health(cluster, "tm-f", 0) == "hot"
    job = cluster.rita.post("/api/v1/jobs/", json={
        "name": "needs-two-h100", "team": "red", "gpus": 2, "gpu_type": "H100",
        "workload": {"command": [PY, str(SCRIPTS / "show_env.py")]}}).json()
    time.sleep(3)
    waiting = cluster.job(job["id"])
    assert waiting["state"] == "queued", waiting
    assert "2 GPUs" in waiting["pending_reason"], waiting["pending_reason"]
    cluster.inject("tm-f", {0: "clear"})
    cluster.wait_for(lambda: not [a for a in alerts(cluster, state="firing") if a["id"] == alert["id"]],
                     timeout=90, what="the alert to resolve as the GPU cools")
    assert gpu_health(cluster, "tm-f", 0) == "ok"
    assert cluster.wait_state(job["id"], {"succeeded", "failed"}, timeout=60)["state"] == "succeeded"


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus package")
def test_a_real_prometheus_scrapes_the_console(cluster, tmp_path):
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: console\n"
        "    metrics_path: /metrics\n"
        f"    authorization: {{type: Bearer, credentials: {cluster.admin_token}}}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{cluster.port}']}}]\n"
    )
    server = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def scraped():
            try:
                targets = httpx.get(f"http://127.0.0.1:{port}/api/v1/targets", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                return None
            active = targets["data"]["activeTargets"]
            return active and active[0]["health"] == "up" and active[0]

        target = cluster.wait_for(scraped, timeout=60, what="Prometheus to scrape /metrics")
        assert target["lastError"] == ""
        result = cluster.wait_for(
            lambda: httpx.get(f"http://127.0.0.1:{port}/api/v1/query",
                              params={"query": "DCGM_FI_DEV_GPU_UTIL"}).json()["data"]["result"],
            timeout=30, what="GPU utilization in Prometheus")
        assert {r["metric"]["host"] for r in result} >= {"tm-a", "tm-f"}
    finally:
        server.terminate()
        server.wait(timeout=10)

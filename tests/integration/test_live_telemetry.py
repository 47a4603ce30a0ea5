"""Live telemetry end to end: simulated agents → ingest → websockets (real ASGI server, real websocket client),
alerts from injected faults feeding the scheduler, and a real Prometheus scraping /metrics."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import httpx
import pytest
import websockets
from websockets.sync.client import connect

from tests.integration.live import LiveCluster, create_team, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.real_backends]
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


def frames(url: str, until, *, what: str, timeout: float = 60, kind: str = "gpu.sample",
           **kwargs) -> list[tuple[float, dict]]:
    """(arrival time, message) of the `kind` frames a socket gets until until(frames) holds; fails naming `what`
    if it has not after `timeout` s (which only means "never": frames come once a second)."""
    received: list[tuple[float, dict]] = []
    with connect(url, open_timeout=30, **kwargs) as socket:
        deadline = time.monotonic() + timeout
        while not until(received):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} ({len(received)} frames)")
            try:
                message = json.loads(socket.recv(timeout=left))
            except TimeoutError:
                continue
            if message["type"] == kind:
                received.append((time.time(), message))
    return received


class Recorder:
    """A socket kept open in a thread, recording every frame (the browser's cluster page, as a witness)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.messages: list[dict] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with connect(self.url, open_timeout=30) as socket:
            while not self.stopped.is_set():
                try:
                    message = json.loads(socket.recv(timeout=1))
                except TimeoutError:
                    continue
                except websockets.exceptions.ConnectionClosed:
                    return
                if message["type"] == "gpu.sample":
                    self.messages.append(message)

    def samples(self, host: str, index: int) -> list[dict]:
        """The GPU's samples, each once, in the order they were taken (their own ts)."""
        found = {g["ts"]: g for m in list(self.messages) for g in m["gpus"] if (g["host"], g["index"]) == (host, index)}
        return [found[ts] for ts in sorted(found)]

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)


def alerts(cluster, **params) -> list[dict]:
    return cluster.admin().get("/api/v1/alerts/", params=params).json()["results"]


def gpu_health(cluster, host: str, index: int) -> str:
    hosts = {h["name"]: h for h in cluster.admin().get("/api/v1/hosts/").json()["results"]}
    return next(g["health"] for g in hosts[host]["gpus"] if g["index"] == index)


def test_samples_arrive_about_once_a_second_with_their_sample_time(cluster):
    received = frames(cluster.ws_url("/ws/cluster/", cluster.rita), lambda got: len(got) >= 6, what="six frames")
    # One frame per tick of the hub (1 s), never a burst: a busy machine only spaces them more. (Their rate and
    # staleness under load are benchmarks/telemetry.py's figures.)
    sent = [message["ts"] for _, message in received]
    assert statistics.median([b - a for a, b in pairwise(sent)]) >= 0.5, sent
    for at, message in received[1:]:
        gpus = [g for g in message["gpus"] if g["host"] in {"tm-a", "tm-f"}]
        assert len(gpus) == 4 and all(g["simulated"] for g in gpus)
        # Each GPU carries the time it was sampled on its host, before the frame was sent and received.
        assert all(g["ts"] <= message["ts"] <= at for g in gpus), (at, message)
        assert all(g["available"] and g["utilization_pct"] is not None for g in gpus)
    taken = {g["ts"] for _, message in received for g in message["gpus"] if g["host"] == "tm-a"}
    assert len(taken) >= 2, "the frames kept repeating one sample"


def test_unauthenticated_and_foreign_origin_sockets_are_refused_before_any_data(cluster):
    base = f"ws://127.0.0.1:{cluster.port}/ws/cluster/"
    with pytest.raises(websockets.exceptions.InvalidStatus):
        connect(base, open_timeout=30)
    ticket_url = cluster.ws_url("/ws/cluster/", cluster.rita)
    with pytest.raises(websockets.exceptions.InvalidStatus):
        connect(ticket_url, origin="https://evil.example", open_timeout=30)


def test_other_teams_see_none_of_a_jobs_metrics(cluster):
    job = cluster.rita.post("/api/v1/jobs/", json={
        "name": "sleepy", "team": "red", "gpus": 1, "gpu_type": "H200",
        "workload": {"command": [PY, str(SCRIPTS / "show_env.py"), "45"]}}).json()
    cluster.wait_state(job["id"], {"running"})
    mine = frames(cluster.ws_url(f"/ws/jobs/{job['id']}/", cluster.rita), lambda got: any(m["gpus"] for _, m in got),
                  what="a frame with the job's GPU")
    assert all(g["job"] == job["id"] for _, m in mine for g in m["gpus"])
    # The GPU shows as busy for another team, without naming the job.
    theirs = frames(cluster.ws_url("/ws/cluster/", cluster.bob),
                    lambda got: any(g.get("other_team") for _, m in got for g in m["gpus"]),
                    what="the job's GPU, busy for another team")
    for _, message in theirs:
        assert all(g["job"] != job["id"] and g["team"] != "red" for g in message["gpus"])
    with pytest.raises(websockets.exceptions.InvalidStatus):
        connect(cluster.ws_url(f"/ws/jobs/{job['id']}/", cluster.bob), open_timeout=30)
    cluster.admin().post(f"/api/v1/jobs/{job['id']}/cancel/", json={})


def test_an_idle_job_gets_its_warning(cluster):
    rule = next(r for r in cluster.admin().get("/api/v1/alert-rules/").json()["results"] if r["kind"] == "job_idle")
    assert cluster.admin().patch(f"/api/v1/alert-rules/{rule['id']}/", json={"duration_s": 5}).status_code == 200
    job = cluster.rita.post("/api/v1/jobs/", json={
        "name": "idle", "team": "red", "gpus": 1, "gpu_type": "H200",
        "workload": {"command": [PY, str(SCRIPTS / "show_env.py"), "60"]}}).json()
    cluster.wait_state(job["id"], {"running"})
    warned = cluster.wait_for(lambda: [a for a in cluster.rita.get("/api/v1/alerts/").json()["results"]
                                       if a["job"] == job["id"]], timeout=90, what="the idle warning")
    assert "idle" in warned[0]["message"] and warned[0]["team"] == "red"
    assert not [a for a in cluster.bob.get("/api/v1/alerts/").json()["results"] if a["job"] == job["id"]]
    cluster.admin().patch(f"/api/v1/alert-rules/{rule['id']}/", json={"duration_s": 900})
    cluster.admin().post(f"/api/v1/jobs/{job['id']}/cancel/", json={})


def test_xid_raises_an_alert_and_marks_the_gpu_faulty(cluster):
    cluster.inject("tm-f", {1: "xid:48"})
    alert = cluster.wait_for(lambda: [a for a in alerts(cluster) if "XID 48" in a["message"]], timeout=60,
                             what="the XID alert", interval=0.1)[0]
    assert alert["host"] == "tm-f" and gpu_health(cluster, "tm-f", 1) == "faulty"
    assert cluster.admin().post(f"/api/v1/alerts/{alert['id']}/resolve/").status_code == 200
    assert gpu_health(cluster, "tm-f", 1) == "ok"
    cluster.inject("tm-f", {})


def test_overheating_gpu_alerts_after_its_rule_duration_takes_no_jobs_and_recovers_when_cool(cluster):
    rule = next(r for r in cluster.admin().get("/api/v1/alert-rules/").json()["results"]
                if r["kind"] == "gpu_temperature")
    witness = Recorder(cluster.ws_url("/ws/cluster/", cluster.admin()))
    try:
        cluster.wait_for(lambda: witness.samples("tm-f", 0), timeout=60, what="tm-f:0's samples before the fault")
        cluster.inject("tm-f", {0: "overheat"})
        alert = cluster.wait_for(lambda: [a for a in alerts(cluster, state="firing") if "°C" in a["message"]],
                                 timeout=150, what="the temperature alert", interval=0.5)[0]
    finally:
        witness.stop()
    assert alert["host"] == "tm-f" and gpu_health(cluster, "tm-f", 0) == "hot"
    # The order of the events, from the times the system recorded (not the test's clock): the alert started at
    # least the rule's duration after the GPU's last sample under the threshold, and it names a hot sample.
    started = datetime.fromisoformat(alert["started_at"]).timestamp()
    samples = witness.samples("tm-f", 0)
    cool = [g["ts"] for g in samples if g["temperature_c"] < rule["threshold"] and g["ts"] < started]
    assert cool, samples
    assert started >= cool[-1] + rule["duration_s"], (alert, samples)
    assert alert["value"] >= rule["threshold"], alert
    job = cluster.rita.post("/api/v1/jobs/", json={
        "name": "needs-two-h100", "team": "red", "gpus": 2, "gpu_type": "H100",
        "workload": {"command": [PY, str(SCRIPTS / "show_env.py")]}}).json()
    cluster.wait_for(lambda: "2 GPUs" in (j := cluster.job(job["id"]))["pending_reason"] or j["state"] != "queued",
                     timeout=60, what="a scheduler pass to look at the job")
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
            timeout=60, what="GPU utilization in Prometheus")
        assert {r["metric"]["host"] for r in result} >= {"tm-a", "tm-f"}
    finally:
        server.terminate()
        server.wait(timeout=10)

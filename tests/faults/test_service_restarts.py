"""Redis, PostgreSQL and the console's web server restarted under a running console, with jobs queued, placed and
running.

Redis keeps nothing on disk here (as on this machine kind's own server), so its restart loses every message in
the broker and every cached telemetry frame: the console's database is the truth, and the jobs must come out
exactly once. PostgreSQL is shut down fast (every connection cut), kept down a while, and started again.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.faults.conftest import record_fault
from tests.faults.support import (
    FINAL,
    PY,
    SCRIPTS,
    assert_ledger_holds,
    counted_job,
    runs_of,
    start_cluster,
    wait_all_final,
)

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, private_postgres, private_redis):
    live = start_cluster(tmp_path_factory.mktemp("restarts"), private_postgres, private_redis,
                         agents={"fr-a": "2xH200", "fr-b": "2xH200"})
    live.postgres, live.redis = private_postgres, private_redis
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture(autouse=True)
def _services_back_after_each_test(cluster):
    """A test that fails while it holds Redis or PostgreSQL down must not leave them down for the next one."""
    yield
    for service in (cluster.redis, cluster.postgres):
        if not service.answers():
            service.start()


class LiveView:
    """What the browser's cluster page does: keep a socket open, reconnect with a new ticket when it drops."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.samples: list[float] = []  # arrival times of telemetry frames
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                with connect(self.cluster.ws_url("/ws/cluster/", self.cluster.admin()), open_timeout=30) as socket:
                    while not self.stopped.is_set():
                        message = json.loads(socket.recv(timeout=15))
                        if message["type"] == "gpu.sample":
                            self.samples.append(time.monotonic())
            except Exception:  # noqa: BLE001 - any failure: wait and reconnect, as console.js does
                time.sleep(1)

    def first_sample_after(self, moment: float) -> float | None:
        return next((t for t in self.samples if t > moment), None)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=20)


def test_redis_restart_loses_no_job_and_runs_none_twice(cluster):
    view = LiveView(cluster)
    cluster.wait_for(lambda: view.samples, timeout=60, what="live telemetry before the fault")
    # 4 GPUs: four jobs run, four wait in the queue.
    running = [counted_job(cluster, 25, name=f"long-{n}") for n in range(4)]
    for job in running:
        cluster.wait_state(job["id"], {"running"})
    queued = [counted_job(cluster, 3, name=f"short-{n}") for n in range(4)]
    time.sleep(2)

    cluster.redis.kill()
    down_at = time.monotonic()
    # Submissions while Redis is down are still accepted: the database is the queue.
    during = []
    for n in range(2):
        response = cluster.admin().post("/api/v1/jobs/", json={"team": "it", "name": f"during-{n}", "gpus": 1,
                                                                "workload": queued[0]["workload"]})
        assert response.status_code == 201, response.text
        during.append(response.json())
    # While Redis is down: an API client gets no ticket (503, not a dead ticket), and a page opening its socket
    # is turned away at once (the page retries) without a traceback: the socket needs the user's group, which
    # carries role changes, and the group lives in Redis.
    assert cluster.admin().post("/api/v1/ws-ticket/").status_code == 503
    web_log = cluster.base / "web.log"
    log_before = web_log.stat().st_size
    page = browser_session(cluster)
    cookies = "; ".join(f"{name}={value}" for name, value in page.cookies.items())

    def open_page_socket() -> None:
        with connect(f"ws://127.0.0.1:{cluster.port}/ws/cluster/", open_timeout=30,
                     additional_headers={"Cookie": cookies, "Origin": cluster.url}) as socket:
            socket.recv(timeout=30)

    # Turned away: the handshake refused or the socket closed by the server. A socket that hangs instead ends
    # in the client's own timeouts (TimeoutError), which no busy machine reaches when the server answers.
    with pytest.raises((InvalidStatus, ConnectionClosed, TimeoutError)) as refused:
        open_page_socket()
    assert not isinstance(refused.value, TimeoutError), f"the socket hung instead of being refused: {refused.value!r}"
    with web_log.open(errors="replace") as handle:
        handle.seek(log_before)
        during_log = handle.read()
    # (The cache logs its ignored errors with their tracebacks; none may come from the socket's code.)
    assert "channel layer is unavailable" in during_log and "apps/telemetry/" not in during_log, during_log[-3000:]
    time.sleep(max(0.0, 5 - (time.monotonic() - down_at)))
    cluster.redis.start()
    up_at = time.monotonic()

    # A timeout here only means "never": how soon it comes back is the fault table's figure.
    resumed = cluster.wait_for(lambda: view.first_sample_after(up_at), timeout=90,
                               what="telemetry to reach the browser again")
    telemetry_gap = resumed - up_at
    ids = [job["id"] for job in running + queued + during]
    jobs = wait_all_final(cluster, ids, timeout=180)
    finished = time.monotonic() - up_at
    view.stop()

    assert all(job["state"] in FINAL for job in jobs.values())
    assert {job["state"] for job in jobs.values()} == {"succeeded"}, {i: (j["state"], j["failure_reason"])
                                                                       for i, j in jobs.items()}
    completions = {job_id: runs_of(cluster, job_id)[1] for job_id in ids}
    assert set(completions.values()) == {1}, f"a job ran to completion twice or never: {completions}"
    assert_ledger_holds(cluster)
    record_fault("Redis killed for 5 s (no persistence: broker and cache emptied)",
                 f"10/10 jobs succeeded once each; telemetry back {telemetry_gap:.1f} s after Redis",
                 finished, 0)


def test_a_web_server_restart_loses_no_line_of_a_running_jobs_log(cluster):
    """The agent keeps a job's output while the console does not answer and sends it, in order and once, when it
    answers again; meanwhile the job prints more than its output pipe holds and is never held up by it."""
    job = cluster.submit(gpus=1, name="chatty", workload={"command": [PY, str(SCRIPTS / "chatty_run.py")]})
    cluster.wait_for(lambda: "line 00005" in cluster.log(job["id"]), timeout=120, what="the job's first lines")
    outputs = cluster.base / "artifacts" / str(job["id"]) / "outputs"
    cluster.kill("web")
    down_at = time.monotonic()
    (outputs / "go").touch()
    cluster.wait_for(lambda: (outputs / "burst.done").exists(), timeout=120,
                     what="the job to print its burst while the console is down")
    agent_logs = [cluster.base / f"agent-{name}.log" for name in cluster.agents]
    # Down through three tries of the same chunk (the third is followed by a wait of 2 s).
    cluster.wait_for(lambda: any("log not sent" in line and "again in 2.0 s" in line for path in agent_logs
                                 for line in path.read_text(errors="replace").splitlines()),
                     timeout=60, what="the agent to try its log three times")
    cluster.restart("web")
    up_at = time.monotonic()
    cluster.wait_for(cluster._server_answers, timeout=90, what="the web server to answer again")
    final = wait_all_final(cluster, [job["id"]], timeout=180)[job["id"]]
    assert final["state"] == "succeeded", (final["state"], final["failure_reason"])
    log = cluster.whole_log(job["id"]).splitlines()
    lines = [entry for entry in log if entry.startswith("line ")]
    assert lines == [f"line {n:05d}" for n in range(len(lines))] and len(lines) > 100, lines[-5:]
    assert [entry[:10] for entry in log if entry.startswith("burst ")] == [f"burst {j:04d}" for j in range(300)]
    assert log[-1].startswith("[agent] succeeded")
    record_fault(f"web server killed for {up_at - down_at:.0f} s while a job printed 300 KB",
                 f"job succeeded; its log whole and in order ({len(lines)} lines and the burst)",
                 time.monotonic() - up_at, 0)


def browser_session(cluster) -> httpx.Client:
    """A logged-in browser: a session cookie, so every page reads the database."""
    return cluster.browser()


def test_postgres_restart_answers_503_recovers_and_loses_nothing_acknowledged(cluster):
    admin = cluster.admin()
    browser = browser_session(cluster)
    accepted = [counted_job(cluster, 12, name=f"before-{n}") for n in range(3)]
    for job in accepted:
        cluster.wait_state(job["id"], {"running"})

    cluster.postgres.stop()
    down_at = time.monotonic()
    answers = []

    def long_enough() -> bool:
        """Down longer than a heartbeat timeout (30 s), and the running jobs have ended meanwhile (their processes
        write that down in their outputs, which need no database)."""
        return time.monotonic() - down_at >= 35 and all(runs_of(cluster, job["id"])[1] == 1 for job in accepted)

    while not long_enough():
        # The jobs last 12 s: a timeout here only means they never ended.
        assert time.monotonic() - down_at < 300, {job["id"]: runs_of(cluster, job["id"]) for job in accepted}
        for client, method, path, body in [
                (admin, "GET", "/api/v1/jobs/", None), (browser, "GET", "/", None),
                (admin, "POST", "/api/v1/jobs/", {"team": "it", "gpus": 1, "workload": accepted[0]["workload"]})]:
            try:
                response = client.request(method, path, json=body)
                answers.append((path, response.status_code, response.headers.get("content-type", "")))
            except httpx.HTTPError as exc:
                answers.append((path, type(exc).__name__, ""))
        time.sleep(1)
    assert answers and all(status == 503 for _, status, _ in answers), answers
    assert all("text/html" in kind if path == "/" else "json" in kind for path, _, kind in answers)

    down_for = time.monotonic() - down_at
    cluster.postgres.start()
    up_at = time.monotonic()
    cluster.wait_for(lambda: admin.get("/api/v1/jobs/").status_code == 200, timeout=90,
                     what="the API to answer again")
    recovered = time.monotonic() - up_at
    after = counted_job(cluster, 1, name="after")
    jobs = wait_all_final(cluster, [job["id"] for job in accepted] + [after["id"]], timeout=120)
    assert {job["state"] for job in jobs.values()} == {"succeeded"}, {i: (j["state"], j["failure_reason"])
                                                                       for i, j in jobs.items()}
    # The jobs that ended while the database was down have their end recorded, once.
    assert all(runs_of(cluster, job["id"]) == (1, 1) for job in accepted)
    # Their heartbeats had nowhere to go: no host was declared lost for it.
    hosts = {h["name"]: h["state"] for h in admin.get("/api/v1/hosts/").json()["results"]}
    assert set(hosts.values()) == {"up"}, hosts
    assert_ledger_holds(cluster)
    record_fault(f"PostgreSQL shut down (fast) for {down_for:.0f} s, then started",
                 f"{len(answers)} requests while down: all 503; jobs that ended meanwhile recorded after",
                 recovered, 0)

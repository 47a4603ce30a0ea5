"""A real console on this machine for integration tests: ASGI server, Celery worker with beat, host agents.

Everything runs as separate processes, as `make run` starts them, against a fresh database: SQLite under a temp
folder by default, or a fresh PostgreSQL database and Redis broker when the environment names them (CI).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx

ROOT = Path(__file__).resolve().parents[2]
ADMIN_PASSWORD = "integration-admin-pass-42"
# How long a request to the live console may go unanswered: every client of these tests, the token requests too
# (httpx's default of 5 s is shorter than a token request takes on a loaded 2-core machine: the password's
# PBKDF2 alone is seconds of CPU there, and a login timed out this way in a CI rehearsal).
REQUEST_TIMEOUT_S = 30


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition, *, timeout: float, what: str, interval: float = 0.5, details=lambda: ""):
    """Poll `condition` until it returns something true (returned), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{details()}")


def create_team(admin: httpx.Client, slug: str, max_gpus: int) -> None:
    """A team with a GPU quota, through the API as an admin (what every live test starts with)."""
    assert admin.post("/api/v1/teams/", json={"slug": slug}).status_code == 201
    assert admin.patch(f"/api/v1/teams/{slug}/quota/", json={"max_gpus": max_gpus}).status_code == 200


def gone(pid: int) -> bool:
    """The process has exited (a zombie has too: it only waits to be reaped by its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


MAX_XDIST_WORKERS = 4  # Redis has 16 databases: 2 per worker for its live clusters, 2 for its test process


def live_redis_dbs() -> tuple[int, int]:
    """The Redis databases (broker, cache and channel layer) of this process's live clusters.

    Without xdist 5 and 6 (beside the test process's 0 and 1 that CI names); under xdist worker N takes 2N and
    2N+1, and its test process 8+2N and 9+2N (console/settings_test.py), so workers never share state."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return 5, 6
    index = int(worker.removeprefix("gw"))
    if index >= MAX_XDIST_WORKERS:
        raise RuntimeError(f"live clusters run on at most {MAX_XDIST_WORKERS} xdist workers (-n), not {index + 1}")
    return 2 * index, 2 * index + 1


def worker_suffix() -> str:
    return f"_{os.environ['PYTEST_XDIST_WORKER']}" if "PYTEST_XDIST_WORKER" in os.environ else ""


def _fresh_postgres(url: str, name: str, template: str | None = None) -> str:
    """An empty database `name` on the server of `url`, or a copy of `template` (PostgreSQL copies it file by
    file: much faster than migrating again)."""
    import psycopg

    parsed = urlparse(url)
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return parsed._replace(path=f"/{name}").geturl()


# The database every live cluster of this test process starts from, migrated by the first one: a PostgreSQL
# database to copy (CREATE DATABASE ... TEMPLATE) per server, or a SQLite file. Made afresh in each test run, so
# it always has this checkout's migrations.
_TEMPLATES: dict[str, str] = {}


def _sqlite_copy(source: str, target: Path) -> None:
    import sqlite3

    with contextlib.closing(sqlite3.connect(source)) as src, contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


# bootstrap_console and one issue_host_token per agent in one process (each manage.py call starts Django anew).
_BOOTSTRAP = """
import sys
import django
django.setup()
from django.core.management import call_command
call_command("bootstrap_console", agent_host="", demo_team="")
for name, path in zip(sys.argv[1::2], sys.argv[2::2]):
    call_command("issue_host_token", name, output=path)
"""


def _fresh_redis(url: str, db: int) -> str:
    import redis

    parsed = urlparse(url)
    fresh = parsed._replace(path=f"/{db}").geturl()
    redis.Redis.from_url(fresh).flushdb()
    return fresh


@dataclass
class LiveCluster:
    base: Path
    agents: dict[str, str]  # name -> simulate spec
    port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def setup(self) -> None:
        var = self.base / "var"
        var.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "DJANGO_SETTINGS"))}
        env.update(
            DJANGO_SETTINGS_MODULE="console.settings",
            CONSOLE_VAR_DIR=str(var),
            CONSOLE_ARTIFACTS=(self.base / "artifacts").as_uri(),
            CONSOLE_SCHEDULER_INTERVAL_S="1",
            CONSOLE_REAPER_INTERVAL_S="2",
            CONSOLE_MIN_RUN_BEFORE_PREEMPT_S="0",
            CONSOLE_ADMIN_PASSWORD=ADMIN_PASSWORD,
            PYTHONUNBUFFERED="1",
            # Job cgroups of this cluster's agents apart from any other cluster's on the machine (same host names).
            GPU_AGENT_CGROUP_PARENT=f"gpu-agent-it-{os.getpid()}-{self.port}",
        )
        env.update(self.extra_env)
        if env.get("DATABASE_URL", "").startswith("postgres"):
            template = self._migrated_template(env)
            env["DATABASE_URL"] = _fresh_postgres(env["DATABASE_URL"], f"console_integration{worker_suffix()}",
                                                  template=template)
        else:
            env.pop("DATABASE_URL", None)
            _sqlite_copy(self._migrated_template(env), var / "db.sqlite3")
        if env.get("CELERY_BROKER_URL", "").startswith("redis"):
            env["CELERY_BROKER_URL"] = _fresh_redis(env["CELERY_BROKER_URL"], live_redis_dbs()[0])
        else:
            env["CELERY_BROKER_URL"] = "filesystem://"
        if env.get("REDIS_URL"):
            env["REDIS_URL"] = _fresh_redis(env["REDIS_URL"], live_redis_dbs()[1])
        self.env = env
        tokens = [str(part) for name in self.agents for part in (name, var / f"token-{name}")]
        self._python("bootstrap", ["-c", _BOOTSTRAP, *tokens], env)

    def _migrated_template(self, env: dict[str, str]) -> str:
        """The template database for this cluster's database server, migrated by the first cluster that needs it."""
        url = env.get("DATABASE_URL", "")
        key = urlparse(url)._replace(path="").geturl() if url else "sqlite"
        if key not in _TEMPLATES:
            if url:
                name = f"console_integration_template{worker_suffix()}"
                self._python("migrate", ["manage.py", "migrate", "--noinput"],
                             {**env, "DATABASE_URL": _fresh_postgres(url, name)})
                _TEMPLATES[key] = name
            else:
                import atexit
                import shutil
                import tempfile

                folder = tempfile.mkdtemp(prefix="console-live-template-")
                atexit.register(shutil.rmtree, folder, ignore_errors=True)
                self._python("migrate", ["manage.py", "migrate", "--noinput"], {**env, "CONSOLE_VAR_DIR": folder})
                _TEMPLATES[key] = str(Path(folder) / "db.sqlite3")
        return _TEMPLATES[key]

    def manage(self, *args: str) -> str:
        return self._python(f"manage.py {' '.join(args)}", ["manage.py", *args], self.env)

    @staticmethod
    def _python(what: str, args: list[str], env: dict[str, str]) -> str:
        result = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"{what} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        self.argv[name] = argv
        log = (self.base / f"{name}.log").open("ab")
        process = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.processes[name] = process
        return process

    def start(self) -> None:
        self.setup()
        var = self.base / "var"
        self._spawn("web", [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
                            "--port", str(self.port), "--log-level", "warning", "--no-proxy-headers",
                            "--timeout-keep-alive", "75"])
        self._spawn("worker", [sys.executable, "-m", "celery", "-A", "console", "worker", "--beat", "--queues",
                               "console", "--concurrency", "1", "--loglevel", "INFO", "-s",
                               str(var / "beat-schedule")])
        for name in self.agents:
            self.start_agent(name)
        self.wait_for(lambda: self._hosts_up() >= len(self.agents), timeout=90, what="agents to register")

    def start_agent(self, name: str) -> subprocess.Popen:
        var = self.base / "var"
        return self._spawn(f"agent-{name}", [
            sys.executable, "-m", "workers.agent", "--name", name, "--simulate", self.agents[name],
            "--console-url", self.url, "--broker", self.env["CELERY_BROKER_URL"], "--broker-dir",
            str(var / "broker"), "--token-file", str(var / f"token-{name}"), "--work-dir",
            str(self.base / "work" / name), "--artifacts", str(self.base / "artifacts"), "--address", "127.0.0.1",
            "--grace-s", "3", "--fault-file", str(self.fault_file(name)),
        ])

    def fault_file(self, agent: str) -> Path:
        return self.base / f"faults-{agent}.json"

    def inject(self, agent: str, faults: dict[int, str]) -> None:
        """Faults for the agent's simulated GPUs, e.g. {0: "overheat"}; {} clears them."""
        import json

        path = self.fault_file(agent)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({str(index): fault for index, fault in faults.items()}))
        tmp.replace(path)

    def user_client(self, username: str, password: str) -> httpx.Client:
        token = httpx.post(f"{self.url}/api/v1/auth/token/", json={"username": username, "password": password,
                                                                   "name": "it"}, timeout=REQUEST_TIMEOUT_S).json()["token"]
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                            timeout=REQUEST_TIMEOUT_S)

    def ws_url(self, path: str, client: httpx.Client) -> str:
        ticket = client.post("/api/v1/ws-ticket/").json()["ticket"]
        return f"ws://127.0.0.1:{self.port}{path}?ticket={ticket}"

    def _hosts_up(self) -> int:
        try:
            hosts = self.admin().get("/api/v1/hosts/").json()["results"]
        except (httpx.HTTPError, KeyError, ValueError):
            return 0
        return sum(1 for host in hosts if host["state"] == "up")

    def admin(self) -> httpx.Client:
        if not hasattr(self, "_admin"):
            self.wait_for(self._server_answers, timeout=60, what="the console to answer")
            token = httpx.post(f"{self.url}/api/v1/auth/token/", json={
                "username": "admin", "password": ADMIN_PASSWORD, "name": "it"}, timeout=REQUEST_TIMEOUT_S).json()["token"]
            self.admin_token = token
            self._admin = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                                       timeout=REQUEST_TIMEOUT_S)
        return self._admin

    def browser(self) -> httpx.Client:
        """A logged-in browser: the admin's session cookie, for the pages."""
        browser = httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S)
        browser.get("/accounts/login/")
        response = browser.post("/accounts/login/", data={
            "username": "admin", "password": ADMIN_PASSWORD, "csrfmiddlewaretoken": browser.cookies["csrftoken"]},
            headers={"Referer": f"{self.url}/accounts/login/"})
        assert response.status_code == 302, response.text[:500]
        assert browser.get("/").status_code == 200
        return browser

    def _server_answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/accounts/login/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_for(self, condition, *, timeout: float, what: str, interval: float = 0.5):
        return wait_until(condition, timeout=timeout, what=what, interval=interval, details=self.logs_tail)

    def job(self, job_id: int) -> dict:
        return self.admin().get(f"/api/v1/jobs/{job_id}/").json()

    def board(self) -> str:
        """The cluster's jobs that are not over, a line each: what holds GPUs and what waits, and why."""
        jobs = self.admin().get("/api/v1/jobs/", params={"page_size": 200}).json()["results"]
        return "\n".join(
            f"job {j['id']} {j['team']} {j['state']} gpus={j['gpus']} attempts={j['attempts']} "
            f"steps={j['steps_done']} on={[a.get('host') for a in j.get('allocations', [])]} "
            f"reason={j.get('pending_reason') or j.get('failure_reason') or ''!r}"
            for j in jobs if j["state"] not in ("succeeded", "failed", "cancelled")
        ) or "(no job active)"

    def wait_state(self, job_id: int, states: set[str], timeout: float = 120) -> dict:
        return self.wait_for(lambda: (j := self.job(job_id))["state"] in states and j, timeout=timeout,
                             what=f"job {job_id} to reach {states}")

    def log(self, job_id: int) -> str:
        """The first slice of the job's log (the API's page)."""
        return self.admin().get(f"/api/v1/jobs/{job_id}/logs/").json()["data"]

    def whole_log(self, job_id: int) -> str:
        parts, after = [], 0
        while True:
            page = self.admin().get(f"/api/v1/jobs/{job_id}/logs/", params={"after": after}).json()
            parts.append(page["data"])
            if not page["data"] or page["next"] == after:
                return "".join(parts)
            after = page["next"]

    def submit(self, **spec) -> dict:
        response = self.admin().post("/api/v1/jobs/", json={"team": "it", "name": "it-job", **spec})
        assert response.status_code == 201, response.text
        return response.json()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.processes[name].send_signal(sig)
        self.processes[name].wait(timeout=30)

    def kill_group(self, name: str) -> None:
        """kill -9 of a process and its children, as the kernel's OOM killer and then systemd would leave it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.processes[name].pid, signal.SIGKILL)
        self.processes[name].wait(timeout=30)

    def restart(self, name: str) -> subprocess.Popen:
        """Start a stopped process again with the command line it had."""
        return self._spawn(name, self.argv[name])

    def logs_tail(self, lines: int = 40) -> str:
        parts = []
        for name in self.processes:
            path = self.base / f"{name}.log"
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._remove_cgroup_folders()

    def _remove_cgroup_folders(self) -> None:
        """The agents' (empty) cgroup folders for their hosts, and the cluster's parent folder."""
        from workers.agent.cgroups import CgroupSupport, remove_stale

        support = CgroupSupport(parent=self.env.get("GPU_AGENT_CGROUP_PARENT", ""))
        if not support.enabled or not support.parent:
            return
        for name in self.agents:
            for folder in support.host_dirs(name).values():
                with contextlib.suppress(OSError):
                    remove_stale(folder)  # jobs still running when the agents were stopped
                for path in (folder, folder.parent):
                    with contextlib.suppress(OSError):
                        path.rmdir()

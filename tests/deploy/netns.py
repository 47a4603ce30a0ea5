"""A console and GPU agents on separate network hosts, built from Linux network namespaces on this machine.

    ns "…-sw"       a bridge br0 (the switch), one port per host below
    ns "…-console"  10.77.0.1   Redis (broker + channel layer), uvicorn (2 workers), Celery worker with beat
    ns "…-gpu1"     10.77.0.11  gpu-agent --name ns-gpu1 --simulate 2xH200 --address 10.77.0.11
    ns "…-gpu2"     10.77.0.12  gpu-agent --name ns-gpu2 --simulate 2xH200 --address 10.77.0.12

Each host also gets its own host name (a UTS namespace) that its /etc/hosts resolves to its address, as on real
machines: torchrun's rank-0 node advertises its host name as MASTER_ADDR to the other node's workers.

Every namespace has its own network stack, so 10.77.0.0/24 exists only in these namespaces: nothing is added to the
machine's own (root) namespace, and no traffic leaves the machine. Cutting a host's cable is `ip link set <port>
down` on its switch port: packets are dropped silently, as when a real link dies.

The database: PostgreSQL when DATABASE_URL names one (reached through its Unix socket, which crosses network
namespaces, as a fresh database `console_netns`), else SQLite under the test's folder (only the console's processes
open it, and they all run in the console namespace). Agents never touch the database.

The test itself talks to the console from a thread that entered the console namespace (setns), so the REST API is
called over the namespace's network like any other client's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx

from tests.integration.live import wait_until

ROOT = Path(__file__).resolve().parents[2]
ADMIN_PASSWORD = "netns-admin-pass-42"
CLONE_NEWNET = 0x40000000
SUBNET = "10.77.0"
CONSOLE_ADDR = f"{SUBNET}.1"
CONSOLE_PORT = 8000
REDIS_PORT = 6390
AGENTS = {"ns-gpu1": f"{SUBNET}.11", "ns-gpu2": f"{SUBNET}.12"}
PG_SOCKET_DIR = "/var/run/postgresql"
ETC_NETNS = Path("/etc/netns")  # per-namespace /etc files that `ip netns exec` bind-mounts (iproute2's convention)


def unavailable_reason() -> str | None:
    """Why this machine cannot build the namespaces, or None."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the deploy tests as root)"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is missing: apt-get install -y iproute2"
    if shutil.which("redis-server") is None:
        return "`redis-server` is missing: apt-get install -y redis-server"
    probe = f"gcprobe{os.getpid()}"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if result.returncode != 0:
        return f"`ip netns add` fails here ({result.stderr.strip()}): a container without CAP_SYS_ADMIN?"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def _enter_netns(name: str) -> None:
    """Move the calling thread (only) into the network namespace `name`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({name}): {os.strerror(errno)}")
    finally:
        os.close(fd)


class NsHttp:
    """An httpx client whose every socket is opened from a thread inside a network namespace."""

    def __init__(self, netns: str, base_url: str, headers: dict[str, str] | None = None) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, initializer=_enter_netns,
                                                           initargs=(netns,))
        self._client = self._pool.submit(httpx.Client, base_url=base_url, headers=headers or {},
                                         timeout=30).result()

    def _call(self, method: str, *args, **kwargs) -> httpx.Response:
        return self._pool.submit(getattr(self._client, method), *args, **kwargs).result()

    def get(self, *args, **kwargs) -> httpx.Response:
        return self._call("get", *args, **kwargs)

    def post(self, *args, **kwargs) -> httpx.Response:
        return self._call("post", *args, **kwargs)

    def patch(self, *args, **kwargs) -> httpx.Response:
        return self._call("patch", *args, **kwargs)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pool.submit(self._client.close).result()
        self._pool.shutdown(wait=False)


@dataclass
class Topology:
    """The switch and the three hosts. Names carry the test's pid so two runs never meet."""

    tag: str = field(default_factory=lambda: f"gc{os.getpid() % 100000}")

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host.removeprefix('ns-')}"  # ns-console → gc123-console

    def port(self, host: str) -> str:
        return f"p-{host.removeprefix('ns-')}"  # the host's port on the switch (≤ 15 characters)

    @property
    def hosts(self) -> dict[str, str]:
        return {"ns-console": CONSOLE_ADDR, **AGENTS}

    def create(self) -> None:
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{a} {h}\n" for h, a in self.hosts.items())
        for host in self.hosts:
            etc = ETC_NETNS / self.ns(host)
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
        ip("netns", "add", self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for host, address in self.hosts.items():
            ns, port = self.ns(host), self.port(host)
            ip("netns", "add", ns)
            ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", self.switch)
            ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        """Run argv on `host`: in its network namespace, under its own host name (a UTS namespace) which its
        /etc/hosts (`ip netns exec` mounts /etc/netns/<ns>/hosts over /etc/hosts) resolves to its address."""
        return ["ip", "netns", "exec", self.ns(host), "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                host, *argv]

    def cut(self, host: str) -> None:
        ip("-n", self.switch, "link", "set", self.port(host), "down")

    def restore(self, host: str) -> None:
        ip("-n", self.switch, "link", "set", self.port(host), "up")

    def namespaces(self) -> list[str]:
        return [self.ns(host) for host in self.hosts] + [self.switch]

    def destroy(self) -> None:
        """Kill whatever still runs in the namespaces, then delete them (deleting the switch frees the veths)."""
        existing = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
        for ns in self.namespaces():
            if ns not in existing:
                continue
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for host in self.hosts:
            shutil.rmtree(ETC_NETNS / self.ns(host), ignore_errors=True)
        with contextlib.suppress(OSError):
            ETC_NETNS.rmdir()  # only when empty: iproute2's folder, shared with anything else using it


def _fresh_postgres_over_socket(url: str, name: str) -> str:
    """A fresh database on the server DATABASE_URL names, addressed through its Unix socket."""
    import psycopg

    parsed = urlparse(url)
    user = parsed.username or "postgres"
    admin = f"postgresql://{user}@/postgres?host={PG_SOCKET_DIR}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgres://{user}@%2Fvar%2Frun%2Fpostgresql/{name}"


@dataclass
class NetnsCluster:
    base: Path
    topology: Topology = field(default_factory=Topology)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    database: str = "sqlite"

    @property
    def url(self) -> str:
        return f"http://{CONSOLE_ADDR}:{CONSOLE_PORT}"

    # --- processes
    def _spawn(self, name: str, host: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = (self.base / f"{name}.log").open("ab")
        process = subprocess.Popen(self.topology.exec_argv(host, argv), cwd=ROOT,
                                   env=env or self.env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.processes[name] = process
        return process

    def manage(self, *args: str) -> str:
        argv = self.topology.exec_argv("ns-console", [sys.executable, "manage.py", *args])
        result = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    def start(self) -> None:
        self.topology.destroy()  # leftovers of an interrupted run with the same pid
        self.topology.create()
        var = self.base / "var"
        var.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTEST", "DJANGO_", "CONSOLE_", "GPU_AGENT_"))
               and k not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"}}
        env.update(
            DJANGO_SETTINGS_MODULE="console.settings",
            DJANGO_ALLOWED_HOSTS=f"{CONSOLE_ADDR},127.0.0.1,localhost",
            CONSOLE_VAR_DIR=str(var),
            CONSOLE_ARTIFACTS=(self.base / "artifacts").as_uri(),
            CONSOLE_SCHEDULER_INTERVAL_S="1",
            CONSOLE_REAPER_INTERVAL_S="2",
            CONSOLE_ADMIN_PASSWORD=ADMIN_PASSWORD,
            CELERY_BROKER_URL=f"redis://{CONSOLE_ADDR}:{REDIS_PORT}/0",
            REDIS_URL=f"redis://{CONSOLE_ADDR}:{REDIS_PORT}/1",
            PYTHONUNBUFFERED="1",
        )
        if os.environ.get("DATABASE_URL", "").startswith("postgres") and Path(PG_SOCKET_DIR).is_dir():
            env["DATABASE_URL"] = _fresh_postgres_over_socket(os.environ["DATABASE_URL"], "console_netns")
            self.database = "postgresql (unix socket)"
        self.env = env
        self._spawn("redis", "ns-console", ["redis-server", "--port", str(REDIS_PORT), "--bind", CONSOLE_ADDR,
                                            "--save", "", "--appendonly", "no", "--protected-mode", "no"])
        self.manage("migrate", "--noinput")
        self.manage("bootstrap_console", "--agent-host", "", "--demo-team", "")
        for name in AGENTS:
            self.manage("issue_host_token", name, "--output", str(var / f"token-{name}"))
        self._spawn("web", "ns-console", [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host",
                                          CONSOLE_ADDR, "--port", str(CONSOLE_PORT), "--workers", "2",
                                          "--log-level", "warning", "--no-proxy-headers", "--timeout-keep-alive", "75"])
        self._spawn("worker", "ns-console", [sys.executable, "-m", "celery", "-A", "console", "worker", "--beat",
                                             "--queues", "console", "--concurrency", "1", "--loglevel", "INFO",
                                             "-s", str(var / "beat-schedule")])
        for name in AGENTS:
            self.start_agent(name)
        self.wait_for(lambda: sum(state == "up" for state in self.host_states().values()) == len(AGENTS),
                      timeout=90, what="both agents to register over the namespace network")

    def start_agent(self, name: str) -> subprocess.Popen:
        # The agent gets no console settings at all: only its flags, as on a real GPU host.
        env = {k: v for k, v in self.env.items()
               if not k.startswith(("DJANGO_", "CONSOLE_")) and k not in {"DATABASE_URL", "REDIS_URL"}}
        return self._spawn(f"agent-{name}", name, [
            sys.executable, "-m", "workers.agent", "--name", name, "--simulate", "2xH200",
            "--console-url", self.url, "--broker", self.env["CELERY_BROKER_URL"],
            "--token-file", str(self.base / "var" / f"token-{name}"), "--work-dir", str(self.base / "work" / name),
            "--artifacts", str(self.base / "artifacts"), "--address", AGENTS[name], "--grace-s", "3",
        ], env=env)

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
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if hasattr(self, "_admin"):
            self._admin.close()
        self.topology.destroy()

    # --- the API, from inside the console's namespace
    def admin(self) -> NsHttp:
        if not hasattr(self, "_admin"):
            anonymous = NsHttp(self.topology.ns("ns-console"), self.url)
            try:
                self.wait_for(lambda: self._answers(anonymous), timeout=60, what="the console to answer")
                token = anonymous.post("/api/v1/auth/token/", json={"username": "admin", "password": ADMIN_PASSWORD,
                                                                    "name": "netns"}).json()["token"]
            finally:
                anonymous.close()
            self._admin = NsHttp(self.topology.ns("ns-console"), self.url, {"Authorization": f"Bearer {token}"})
        return self._admin

    @staticmethod
    def _answers(client: NsHttp) -> bool:
        try:
            return client.get("/accounts/login/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def host_states(self) -> dict[str, str]:
        try:
            return {h["name"]: h["state"] for h in self.admin().get("/api/v1/hosts/").json()["results"]}
        except (httpx.HTTPError, KeyError, ValueError):
            return {}

    def job(self, job_id: int) -> dict:
        return self.admin().get(f"/api/v1/jobs/{job_id}/").json()

    def log(self, job_id: int) -> str:
        return self.admin().get(f"/api/v1/jobs/{job_id}/logs/").json()["data"]

    def submit(self, **spec) -> dict:
        response = self.admin().post("/api/v1/jobs/", json={"team": "netns", "name": "netns-job", **spec})
        assert response.status_code == 201, response.text
        return response.json()

    def wait_for(self, condition: Callable[[], object], *, timeout: float, what: str, interval: float = 0.5):
        return wait_until(condition, timeout=timeout, what=what, interval=interval, details=self.logs_tail)

    def wait_state(self, job_id: int, states: set[str], timeout: float = 120) -> dict:
        return self.wait_for(lambda: (j := self.job(job_id))["state"] in states and j, timeout=timeout,
                             what=f"job {job_id} to reach {states}")

    def logs_tail(self, lines: int = 30) -> str:
        parts = []
        for name in self.processes:
            path = self.base / f"{name}.log"
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(parts)

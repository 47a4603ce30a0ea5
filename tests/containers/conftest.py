"""A real JobRunner with the podman backend, talking through a real ConsoleClient to a small HTTP server that
records what an agent reports (status, log, progress) and serves code snapshots the way the job API does, and a
job's secret values the way the agent API does (to the host token, for the job's current attempt only)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.containers import images
from workers.agent.client import ConsoleClient
from workers.agent.containers import ContainerRuntime
from workers.agent.runner import JobRunner, JobUids
from workers.protocol import CONTAINER_LABEL_HOST, JOB_CODE_PATH, ContainerSpec, Dispatch, JobSecrets

# Job uids of these tests' agents: a range per xdist worker, so that one worker's check that no job process is
# left never sees another's jobs.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
JOB_UIDS = (1_610_050_000 + 1000 * _WORKER, 1_610_050_999 + 1000 * _WORKER)


def _unusable() -> str | None:
    why = images.missing_tools()
    if why:
        return why
    if os.geteuid() != 0:
        return "the container backend runs as root (podman as root, jobs under uids of their own)"
    return None


@pytest.fixture(scope="session")
def podman() -> None:
    """Skips tests that need podman where it (or mmdebstrap, to build their images) is missing."""
    why = _unusable()
    if why:
        pytest.skip(f"container backend tests: {why}")


@pytest.fixture(scope="session", params=["podman", "docker"])
def runtime_kind(request: pytest.FixtureRequest, podman: None) -> str:
    """The container CLI the agent drives: every test of the backend runs on podman, and on docker where a
    docker daemon runs (the images are built with podman and loaded into docker's store)."""
    if request.param == "docker":
        why = images.docker_unusable()
        if why:
            pytest.skip(f"docker backend tests: {why}")
    return str(request.param)


@pytest.fixture(scope="session")
def base_image(runtime_kind: str) -> str:
    images.ensure(images.BASE_IMAGE, runtime_kind)
    return images.BASE_IMAGE


@pytest.fixture(scope="session")
def torch_image(runtime_kind: str) -> str:
    images.ensure(images.TORCH_IMAGE, runtime_kind)
    return images.TORCH_IMAGE


@dataclass
class Console:
    """What the agent reported, per job id."""

    url: str = ""
    statuses: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    logs: dict[int, list[str]] = field(default_factory=dict)
    progress: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    code: dict[str, bytes] = field(default_factory=dict)  # job token -> the snapshot it may fetch
    secrets: dict[tuple[int, int], dict[str, str]] = field(default_factory=dict)  # (job, attempt) -> values
    secret_fetches: list[tuple[int, str]] = field(default_factory=list)  # (job, Authorization) of each fetch
    changed: threading.Condition = field(default_factory=threading.Condition)

    def log(self, job_id: int) -> str:
        return "".join(self.logs.get(job_id, []))

    def final(self, job_id: int) -> dict[str, Any] | None:
        ends = [s for s in self.statuses.get(job_id, []) if s["state"] != "running"]
        return ends[-1] if ends else None

    def wait(self, condition, *, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not (value := condition()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
                self.changed.wait(min(left, 1.0))
        return value

    def wait_final(self, job_id: int, timeout: float = 120) -> dict[str, Any]:
        final = self.wait(lambda: self.final(job_id), timeout=timeout, what=f"the end of job {job_id}")
        return final  # type: ignore[no-any-return]


def _handler(console: Console) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - the job API's code snapshot; the agent API's job secrets
            authorization = self.headers.get("Authorization", "")
            token = authorization.removeprefix("Job ")
            path, _, query = self.path.partition("?")
            parts = path.strip("/").split("/")  # api v1 agent jobs ID secrets
            if path == JOB_CODE_PATH and token in console.code:
                self._answer(200, console.code[token], "application/gzip")
            elif parts[2:4] == ["agent", "jobs"] and parts[5:] == ["secrets"]:
                job_id, attempt = int(parts[4]), int(query.removeprefix("attempt="))
                with console.changed:
                    console.secret_fetches.append((job_id, authorization))
                values = console.secrets.get((job_id, attempt)) if authorization == f"Host {HOST_TOKEN}" else None
                if values is None:
                    self._answer(409, json.dumps({"detail": f"job {job_id} does not run here"}).encode())
                else:
                    self._answer(200, json.dumps(JobSecrets(attempt, values).to_message()).encode())
            else:
                self._answer(404, b"{}")

        def do_POST(self) -> None:  # noqa: N802 - the agent API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            parts = self.path.strip("/").split("/")  # api v1 agent jobs ID kind
            with console.changed:
                if parts[3:4] == ["jobs"]:
                    job_id, kind = int(parts[4]), parts[5]
                    if kind == "status":
                        console.statuses.setdefault(job_id, []).append(body)
                    elif kind == "logs":
                        console.logs.setdefault(job_id, []).append(body["data"])
                    elif kind == "progress":
                        # One record ("progress"), or the training records in the order the job wrote them.
                        received = ([body["progress"]] if "progress" in body else []) + body.get("records", [])
                        console.progress.setdefault(job_id, []).extend(received)
                console.changed.notify_all()
            self._answer(200, json.dumps({"accepted": True, "queue": "q"}).encode())

    return Handler


@pytest.fixture
def console() -> Iterator[Console]:
    recorded = Console()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(recorded))
    recorded.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield recorded
    server.shutdown()
    server.server_close()


def oci_runtime() -> str:
    """runc where podman's default would be crun (which cannot run on this host's hybrid cgroups)."""
    return "runc" if subprocess.run(["which", "runc"], capture_output=True).returncode == 0 else ""


HOST_TOKEN = "host-token"


@dataclass
class Agent:
    runner: JobRunner
    host: str
    volumes: Path
    console: Console
    next_id: int = 1

    def dispatch(self, image: str, command: list[str], **extra: Any) -> Dispatch:
        """A dispatch as the console sends it. `container["secrets"]` ({name: value}): the dispatch names them,
        the console serves their values to this host for this attempt."""
        container = dict(extra.pop("container", {}))
        values = container.pop("secrets", {})
        workload = extra.pop("workload", {"command": command})
        job_id, self.next_id = self.next_id, self.next_id + 1
        options: dict[str, Any] = {"gpu_indices": (0,), "kind": "train", "preset": "", "time_limit_s": 600,
                                   "job_token": secrets.token_hex(8), **extra}
        if values:
            self.console.secrets[(job_id, options.get("attempt", 1))] = dict(values)
        return Dispatch(job_id=job_id, attempt=options.pop("attempt", 1), host=self.host, workload=workload,
                        container=ContainerSpec(image=image, secrets=tuple(values), **container), **options)

    def containers_left(self, console: Console, timeout: float = 60) -> list[str]:
        """This agent's containers once it is done with every job (the end is reported first, the container
        removed after)."""
        console.wait(lambda: not self.runner.running(), timeout=timeout, what="the agent's cleanup after its jobs")
        return self.containers()

    @property
    def cli(self) -> str:
        """The container CLI this agent drives (podman or docker)."""
        assert self.runner.containers is not None
        return self.runner.containers.kind

    def containers(self) -> list[str]:
        """This agent's containers, running or not, as its container CLI lists them."""
        listed = subprocess.run([self.cli, "ps", "-a", "--filter", f"label={CONTAINER_LABEL_HOST}={self.host}",
                                 "--format", "{{.Names}}"], capture_output=True, text=True, check=True)
        return listed.stdout.split()


@pytest.fixture
def agent(runtime_kind: str, console: Console, tmp_path: Path) -> Iterator[Agent]:
    host = f"ct-{uuid.uuid4().hex[:8]}"
    volumes = tmp_path / "volumes"
    volumes.mkdir()
    runtime = ContainerRuntime(runtime_kind, volume_roots=(volumes,),
                               oci_runtime=oci_runtime() if runtime_kind == "podman" else "", simulated=True)
    runner = JobRunner(ConsoleClient(console.url, HOST_TOKEN), work_root=tmp_path / "work",
                       artifacts_root=tmp_path / "artifacts", simulated=True, grace_s=5.0, preempt_grace_s=10.0,
                       job_uids=JobUids(*JOB_UIDS), console_url=console.url, containers=runtime)
    made = Agent(runner, host, volumes, console)
    yield made
    runner.shutdown()
    runtime.remove_leftovers(host)
    for folder in runtime.cgroups.host_dirs(host).values():
        with contextlib.suppress(OSError):
            folder.rmdir()

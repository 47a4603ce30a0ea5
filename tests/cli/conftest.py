"""Fixtures for driving gpuctl in-process against a real console (pytest-django's live_server)."""

from __future__ import annotations

import collections
import email.policy
import io
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from django.db import connections

from workers.cli import follow, main

PASSWORD = "pw-for-tests-123"  # tests/factories.py
JOB_URL = re.compile(r"/api/v1/jobs/(\d+)/$")
WAIT_LIMIT_S = 20.0


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """gpuctl's settings file for this test (not created yet); no GPUCTL_* variables leak in."""
    path = tmp_path / "gpuctl" / "config.json"
    monkeypatch.setenv("GPUCTL_CONFIG", str(path))
    for name in ("GPUCTL_URL", "GPUCTL_TOKEN", "GPUCTL_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    return path


@pytest.fixture
def gpuctl(config_file: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """`gpuctl("status", "--json")` runs `workers.cli.main` in-process and returns its exit code and output."""

    def run(*argv: object, stdin: str | None = None) -> Result:
        capsys.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = main([str(arg) for arg in argv])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


class HttpGate:
    """Serialises gpuctl's HTTP requests with the test's own database writes, and counts its polls of each job.

    With SQLite the live server shares the test's in-memory database connection, so a thread that changes a
    job must not run while a request is being served. Counting polls lets a test wait until gpuctl has seen a
    state before moving the job on, instead of sleeping and hoping.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.polls: collections.Counter[int] = collections.Counter()

    def wait_for_polls(self, job_id: int, count: int, timeout: float = 15.0) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: self.polls[job_id] >= count, timeout):
                raise TimeoutError(f"gpuctl did not poll job {job_id} {count} times")

    def first_polled_job(self, timeout: float = 15.0) -> int:
        with self.changed:
            if not self.changed.wait_for(lambda: bool(self.polls), timeout):
                raise TimeoutError("gpuctl never polled a job")
            return next(iter(self.polls))


@pytest.fixture
def http_gate(monkeypatch: pytest.MonkeyPatch) -> HttpGate:
    gate = HttpGate()
    send = httpx.Client.send

    def gated_send(self: httpx.Client, request: httpx.Request, **kwargs):
        with gate.changed:
            response = send(self, request, **kwargs)  # the body is read here: the server is done
            match = JOB_URL.search(request.url.path)
            if match and request.method == "GET":
                gate.polls[int(match[1])] += 1
                gate.changed.notify_all()
            return response

    monkeypatch.setattr(httpx.Client, "send", gated_send)
    return gate


class JobDriver:
    """Moves the job gpuctl is following through `steps` from a thread, each once gpuctl has seen the last."""

    def __init__(self, gate: HttpGate, steps: list[Callable[[int], object]]) -> None:
        self.gate = gate
        self.steps = steps
        self.job_id: int | None = None
        self.error: BaseException | None = None
        self.main_connection = connections["default"]
        self.thread = threading.Thread(target=self._run, name="job-driver", daemon=True)

    def start(self) -> JobDriver:
        self.thread.start()
        return self

    def join(self) -> None:
        self.thread.join(timeout=20)
        assert not self.thread.is_alive(), "the job driver is stuck"
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        shared = self.main_connection.vendor == "sqlite" and self.main_connection.is_in_memory_db()
        if shared:  # as the live server does: an in-memory database lives in that one connection
            self.main_connection.inc_thread_sharing()
            connections["default"] = self.main_connection
        try:
            job_id = self.job_id = self.gate.first_polled_job()
            for step in self.steps:
                with self.gate.changed:
                    seen = self.gate.polls[job_id]
                self.gate.wait_for_polls(job_id, seen + 1)  # gpuctl saw the previous state
                with self.gate.lock:
                    step(job_id)
        except BaseException as exc:  # noqa: BLE001 - re-raised in join()
            self.error = exc
        finally:
            if shared:
                self.main_connection.dec_thread_sharing()
            else:
                connections["default"].close()


@pytest.fixture
def drive(http_gate: HttpGate, monkeypatch: pytest.MonkeyPatch):
    """`drive(place, running, finish(...))` before `gpuctl("submit", ..., "--wait")`.

    If a step fails, the job would never end and gpuctl would wait forever: its sleep between polls raises the
    driver's error instead (and gives up after WAIT_LIMIT_S).
    """
    drivers: list[JobDriver] = []
    deadline = time.monotonic() + WAIT_LIMIT_S
    real_sleep = follow.sleep

    def checked_sleep(seconds: float) -> None:
        for driver in drivers:
            if driver.error is not None:
                raise RuntimeError("a step of the job driver failed") from driver.error
        if time.monotonic() > deadline:
            raise TimeoutError(f"the job did not end within {WAIT_LIMIT_S} s")
        real_sleep(seconds)

    monkeypatch.setattr(follow, "sleep", checked_sleep)

    def start(*steps: Callable[[int], object]) -> JobDriver:
        driver = JobDriver(http_gate, list(steps)).start()
        drivers.append(driver)
        return driver

    yield start
    for driver in drivers:
        driver.thread.join(timeout=WAIT_LIMIT_S)


@pytest.fixture
def console(live_server, world, gpuctl) -> str:
    """A live console with the `world` teams, and gpuctl logged in to it as mia (member of vision)."""
    result = gpuctl("login", "--url", live_server.url, "--username", "mia", "--password-stdin", stdin=PASSWORD + "\n")
    assert result.code == 0, result.err
    return live_server.url


# --- a recording console: for endpoints the console on this branch does not have yet


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)

    def form(self) -> dict[str, tuple[str | None, bytes]]:
        """A multipart/form-data body as {field: (file name or None, bytes)}."""
        message = BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {self.headers['content-type']}\r\n\r\n".encode() + self.body)
        assert message.is_multipart(), self.headers
        fields: dict[str, tuple[str | None, bytes]] = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            fields[str(name)] = (part.get_filename(), part.get_payload(decode=True))
        return fields


Answer = tuple[int, object]


class RecordingConsole:
    """A real HTTP server on 127.0.0.1 that records every request gpuctl sends and answers from `routes`:
    "METHOD /api/v1/path/" -> (status, JSON body) or a function of the request returning one. Unknown routes: 404."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.routes: dict[str, Answer | Callable[[Recorded], Answer]] = {}
        console = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                                   self.rfile.read(length))
                console.requests.append(request)
                route = console.routes.get(f"{self.command} {self.path.split('?')[0]}")
                status, body = (route(request) if callable(route) else route) if route else (404, {"detail": "Not found."})
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def sent(self, method: str, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path.split("?")[0] == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder(config_file: Path, monkeypatch: pytest.MonkeyPatch):
    """gpuctl pointed (GPUCTL_URL, GPUCTL_TOKEN) at a RecordingConsole."""
    console = RecordingConsole()
    monkeypatch.setenv("GPUCTL_URL", console.url)
    monkeypatch.setenv("GPUCTL_TOKEN", "test-token")
    yield console
    console.close()

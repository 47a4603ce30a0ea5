"""The gate in front of an inference replica that runs a user's image (docs/containers.md, "Services from your
own image"): the console's side of the replica, so the user's server needs neither the secret nor statistics.

    python -m workers.agent.replica_gate --listen ADDRESS --pidfile FILE --progress FILE [--uid U --gid G] \
        -- podman run ... --network none --pidfile FILE IMAGE COMMAND...

The agent starts it under the job's shim in place of the container's `podman run`, which the gate starts as its
child. The container has no network of its own (`--network none`): its server listens on REPLICA_SERVER_PORT in
the container's private network namespace, which nothing on the host reaches but the gate. The gate reads the
container's pid from the pidfile podman writes, and opens its connections to the server from a thread that has
entered that namespace (setns), before it gives up root for the job's uid. It listens on the host's registered
address (never every interface) and, like the built-in replica server, answers only requests that carry the
replica's secret ($CONSOLE_REPLICA_SECRET, removed from its environment once read):

    GET  /health   the server's GET /health, as {"ready": bool}
    POST /predict  forwarded to the server's POST /predict; its status and JSON body come back as they are
    GET  /stats    what the gate measured (requests, errors, latency, rps, in flight): the autoscaler's input;
                   503 while the server does not answer GET /health with 200 (the reconciler then routes nothing)

Once the server answers GET /health with 200, the gate appends {"type": "serving", "port": ...} to --progress
(a file of the agent's the job cannot write, opened before the gate drops root), so the console starts calling it.
It exits with the container's status when `podman run` ends; on SIGTERM it waits for that (the shim signals
both). Exit codes: the container's, 2 bad arguments, 126 the gate could not start.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hmac
import http.client
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from workers.protocol import (
    REPLICA_HEALTH_PATH,
    REPLICA_PREDICT_PATH,
    REPLICA_SECRET_ENV,
    REPLICA_SECRET_HEADER,
    REPLICA_SERVER_PORT,
    ReplicaWindow,
    ServingProgress,
)

log = logging.getLogger("workers.agent.replica_gate")

CLONE_NEWNET = 0x40000000
MAX_BODY_BYTES = 16 * 1024 * 1024  # as the built-in replica server
UPSTREAM_TIMEOUT_S = 30.0  # the gateway's own wait for a replica
PIDFILE_WAIT_S = 120.0
HEALTH_POLL_S = 0.2
MIN_SECRET_CHARS = 16


class GateError(Exception):
    """The gate cannot start: the message says why (in the job's log)."""


class Namespace:
    """Sockets in another network namespace: a thread that entered it makes them (a socket stays in the namespace
    it was made in, whichever thread uses it), so the rest of the gate stays in the host's."""

    def __init__(self, netns_path: str | None) -> None:
        self._requests: queue.Queue[queue.Queue[socket.socket | BaseException]] = queue.Queue()
        self._path = netns_path
        entered: queue.Queue[BaseException | None] = queue.Queue()
        threading.Thread(target=self._serve, args=(entered,), name="netns", daemon=True).start()
        problem = entered.get()
        if problem is not None:
            raise GateError(f"could not enter the container's network namespace: {problem}")

    def _serve(self, entered: queue.Queue[BaseException | None]) -> None:
        if self._path is not None:
            try:
                fd = os.open(self._path, os.O_RDONLY)
                try:
                    libc = ctypes.CDLL(None, use_errno=True)
                    if libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
                finally:
                    os.close(fd)
            except OSError as exc:
                entered.put(exc)
                return
        entered.put(None)
        while True:
            reply = self._requests.get()
            try:
                reply.put(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            except OSError as exc:
                reply.put(exc)

    def socket(self) -> socket.socket:
        reply: queue.Queue[socket.socket | BaseException] = queue.Queue(maxsize=1)
        self._requests.put(reply)
        made = reply.get()
        if isinstance(made, BaseException):
            raise made
        return made


class _Connection(http.client.HTTPConnection):
    """An HTTP connection to the user's server, over a socket of the container's namespace."""

    def __init__(self, namespace: Namespace, port: int, timeout: float) -> None:
        super().__init__("127.0.0.1", port, timeout=timeout)
        self._namespace = namespace

    def connect(self) -> None:
        sock = self._namespace.socket()
        sock.settimeout(self.timeout)
        try:
            sock.connect((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Upstream:
    """The user's server in the container."""

    def __init__(self, namespace: Namespace, port: int = REPLICA_SERVER_PORT) -> None:
        self.namespace = namespace
        self.port = port

    def request(self, method: str, path: str, body: bytes | None = None, *,
                timeout: float = UPSTREAM_TIMEOUT_S) -> tuple[int, bytes, str]:
        """(status, body, content type); OSError or http.client.HTTPException when there is no answer."""
        connection = _Connection(self.namespace, self.port, timeout)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read(MAX_BODY_BYTES + 1)
            if len(data) > MAX_BODY_BYTES:
                raise http.client.HTTPException(f"the answer is larger than {MAX_BODY_BYTES} bytes")
            return response.status, data, response.getheader("Content-Type") or "application/json"
        finally:
            connection.close()

    def healthy(self) -> bool:
        try:
            return self.request("GET", REPLICA_HEALTH_PATH, timeout=2.0)[0] == 200
        except (OSError, http.client.HTTPException):
            return False


class Stats:
    """What the autoscaler reads (the keys of the built-in replica server's /stats it uses)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.requests = 0
        self.errors = 0
        self.in_flight = 0
        self.window = ReplicaWindow(self.started)
        self._lock = threading.Lock()

    def begin(self) -> None:
        with self._lock:
            self.in_flight += 1

    def end(self, seconds: float, ok: bool) -> None:
        with self._lock:
            self.in_flight -= 1
            self.requests += 1
            if ok:
                self.window.add(time.monotonic(), seconds * 1000.0)
            else:
                self.errors += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            # No batching here: what waits is what the user's server has not answered yet.
            return {"requests": self.requests, "errors": self.errors, "in_flight": self.in_flight,
                    "queue_depth": self.in_flight, "batching": False, **self.window.figures(time.monotonic())}


def handler_class(upstream: Upstream, stats: Stats, secret: bytes) -> type[BaseHTTPRequestHandler]:
    routes = {"/health": "GET", "/stats": "GET", "/predict": "POST"}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the gateway pools its connections
        server_version = "gpu-console-replica-gate"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _answer(self, status: int, body: bytes | dict[str, Any], kind: str = "application/json",
                    headers: dict[str, str] | None = None) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:  # say so: a pooled client must not send its next request on this socket
                self.send_header("Connection", "close")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _authorized(self) -> bool:
            sent = self.headers.get_all(REPLICA_SECRET_HEADER) or []
            return len(sent) == 1 and hmac.compare_digest(sent[0].encode(), secret)

        def _route(self) -> None:
            length = self.headers.get("Content-Length")
            if not self._authorized():
                self.close_connection = True  # its body, if any, is not read
                self._answer(401, {"detail": f"send this replica's secret in {REPLICA_SECRET_HEADER}; clients go "
                                             "through the console's gateway"})
                return
            path = self.path.split("?", 1)[0].rstrip("/") or "/"
            if path not in routes:
                self.close_connection = True
                self._answer(404, {"detail": f"no such endpoint {path}; try GET /health, POST /predict, GET /stats"})
                return
            if self.command != routes[path] and not (self.command == "HEAD" and routes[path] == "GET"):
                self.close_connection = True
                self._answer(405, {"detail": f"{path} takes {routes[path]}, not {self.command}"},
                             headers={"Allow": routes[path]})
                return
            if path == "/health":
                ready = upstream.healthy()
                self._answer(200 if ready else 503, {"ready": ready})
            elif path == "/stats":  # the reconciler's poll: a server not ready (any more) gets no traffic
                self._answer(200, stats.snapshot()) if upstream.healthy() else self._answer(503, {"ready": False})
            else:
                self._predict(length)

        def _predict(self, length: str | None) -> None:
            if length is None or not length.isdigit():
                self.close_connection = True
                self._answer(411, {"detail": "send the body with a Content-Length"})
                return
            if int(length) > MAX_BODY_BYTES:
                self.close_connection = True
                self._answer(413, {"detail": f"the request body is larger than {MAX_BODY_BYTES} bytes"})
                return
            body = self.rfile.read(int(length))
            started = time.perf_counter()
            stats.begin()
            status = 502
            try:
                status, data, kind = upstream.request("POST", REPLICA_PREDICT_PATH, body)
            except (OSError, http.client.HTTPException) as exc:
                self._answer(502, {"detail": f"the service's server did not answer: {type(exc).__name__}: {exc}"})
            else:
                self._answer(status, data, kind)
            finally:
                stats.end(time.perf_counter() - started, status < 500)

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            self._route()

        do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_GET  # noqa: N815

    return Handler


def read_pidfile(path: Path, child: subprocess.Popen[bytes], timeout: float = PIDFILE_WAIT_S) -> int:
    """The container's pid, once podman wrote it; GateError if `podman run` ends first or it takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            pid = int(path.read_text().strip())
            if pid > 0:
                return pid
        if child.poll() is not None:
            raise GateError(f"the container ended before it started serving (exit status {child.returncode})")
        time.sleep(0.05)
    raise GateError(f"podman wrote no container pid to {path} within {timeout:.0f} s")


def drop_privileges(uid: int | None, gid: int | None) -> None:
    if uid is None or os.geteuid() != 0:
        return
    os.setgroups([])
    os.setresgid(gid if gid is not None else uid, gid if gid is not None else uid,
                 gid if gid is not None else uid)
    os.setresuid(uid, uid, uid)


def bind(address: str) -> socket.socket:
    family, _, _, _, where = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(where[:2] if family == socket.AF_INET else where)
    sock.listen(1024)
    return sock


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, sock: socket.socket, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(sock.getsockname()[:2], handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock


def run(*, listen: str, pidfile: Path, progress: Path, command: list[str], uid: int | None, gid: int | None,
        secret: str) -> int:
    if len(secret) < MIN_SECRET_CHARS:
        raise GateError(f"${REPLICA_SECRET_ENV} must hold the replica's secret")
    with contextlib.suppress(ValueError):
        if socket.inet_pton(socket.AF_INET6 if ":" in listen else socket.AF_INET, listen) in (bytes(4), bytes(16)):
            raise GateError(f"--listen {listen} is every interface; give the one address to serve on")
    report = open(os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600),  # noqa: SIM115
                  "a", encoding="utf-8")
    sock = bind(listen)
    stopping = threading.Event()
    # SIGTERM reaches `podman run` from the shim too: the gate waits for the container to stop, then leaves.
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stopping.set())
    # The fds the shim handed down (podman's --env-file memfd) go on to podman; the gate's own are close-on-exec.
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, close_fds=False)  # noqa: S603 - the agent's argv
    pid = read_pidfile(pidfile, child)
    namespace = Namespace(f"/proc/{pid}/ns/net")
    drop_privileges(uid, gid)
    upstream, stats = Upstream(namespace), Stats()
    server = _Server(sock, handler_class(upstream, stats, secret.encode()))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="gate", daemon=True).start()
    port = sock.getsockname()[1]
    announced = False
    while child.poll() is None:
        if not announced and not stopping.is_set() and upstream.healthy():
            report.write(json.dumps(ServingProgress(port=port, host=listen, batching=False, ts=time.time())
                                    .to_message()) + "\n")
            report.flush()
            print(f"[agent] the service's server answers {REPLICA_HEALTH_PATH}; the gate serves it on "
                  f"{listen}:{port}", flush=True)
            announced = True
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=HEALTH_POLL_S if not announced else 1.0)
    server.shutdown()
    report.close()
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-agent-replica-gate")
    parser.add_argument("--listen", required=True, help="the host's registered address (never every interface)")
    parser.add_argument("--pidfile", type=Path, required=True, help="where podman writes the container's pid")
    parser.add_argument("--progress", type=Path, required=True, help="where the serving record goes (the agent's)")
    parser.add_argument("--uid", type=int, help="the job's uid: the gate serves under it once set up")
    parser.add_argument("--gid", type=int)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    secret = os.environ.pop(REPLICA_SECRET_ENV, "")  # never passed on to podman, nor readable from here later
    try:
        return run(listen=args.listen, pidfile=args.pidfile, progress=args.progress, command=command,
                   uid=args.uid, gid=args.gid, secret=secret)
    except (GateError, OSError) as exc:
        print(f"[agent] the replica gate could not start: {exc}", file=sys.stderr, flush=True)
        return 126


if __name__ == "__main__":
    sys.exit(main())

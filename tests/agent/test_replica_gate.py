"""The replica gate's HTTP side against a real server of the contract on this host's loopback (no namespace to
enter: the podman path is tests/containers' test_a_replica_from_an_image_serves_only_through_its_gate)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from workers.agent import replica_gate
from workers.agent.replica_gate import Namespace, Stats, Upstream
from workers.protocol import REPLICA_SECRET_HEADER

SECRET = "gate-secret-0123456789"


class Server(BaseHTTPRequestHandler):
    """A user's server: ready when told, /predict doubles each input, or answers 500 when the input is 'boom'."""

    ready = True

    def log_message(self, *args: object) -> None:
        pass

    def send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self.send(200 if type(self).ready else 503, {"ready": type(self).ready})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["inputs"] == ["boom"]:
            self.send(500, {"detail": "model failed"})
        else:
            self.send(200, {"outputs": [2 * x for x in body["inputs"]], "path": self.path,
                            "secret": self.headers.get(REPLICA_SECRET_HEADER)})


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture
def gate() -> Iterator[tuple[str, ThreadingHTTPServer]]:
    Server.ready = True
    upstream = serve(Server)
    namespace = Namespace(None)  # this host's: the user's server listens on its loopback here
    stats = Stats()
    front = serve(replica_gate.handler_class(Upstream(namespace, upstream.server_address[1]), stats,
                                             SECRET.encode()))
    yield f"http://127.0.0.1:{front.server_address[1]}", upstream
    front.shutdown()
    upstream.shutdown()


def test_only_requests_with_the_secret_reach_the_server(gate) -> None:
    url, _ = gate
    for method, path in (("GET", "/health"), ("GET", "/stats"), ("POST", "/predict"), ("GET", "/nowhere")):
        answer = httpx.request(method, f"{url}{path}", json={"inputs": [1]}, timeout=10)
        assert answer.status_code == 401 and REPLICA_SECRET_HEADER in answer.json()["detail"]
    wrong = httpx.post(f"{url}/predict", json={"inputs": [1]}, headers={REPLICA_SECRET_HEADER: "x" * 22}, timeout=10)
    assert wrong.status_code == 401


def test_predict_is_forwarded_without_the_secret_and_measured(gate) -> None:
    url, _ = gate
    headers = {REPLICA_SECRET_HEADER: SECRET}
    with httpx.Client(base_url=url, headers=headers, timeout=10) as client:  # one kept-alive connection
        answers = [client.post("/predict", json={"inputs": [1, 2]}) for _ in range(3)]
        assert all(a.status_code == 200 for a in answers)
        assert answers[0].json() == {"outputs": [2, 4], "path": "/predict", "secret": None}
        failed = client.post("/predict", json={"inputs": ["boom"]})
        assert failed.status_code == 500 and failed.json() == {"detail": "model failed"}
        stats = client.get("/stats").json()
        assert stats["requests"] == 4 and stats["errors"] == 1 and stats["in_flight"] == 0
        assert stats["latency_ms"]["p95"] is not None and stats["rps"] > 0 and stats["batching"] is False
        assert client.get("/health").json() == {"ready": True}
        refused = client.get("/predict")  # its connection is closed, and the answer says so: no reuse races it
        assert refused.status_code == 405 and refused.headers["connection"] == "close"
        assert client.post("/stats", json={}).status_code == 405
        assert client.get("/other").status_code == 404


def test_a_server_not_ready_or_gone_gets_no_traffic(gate) -> None:
    url, upstream = gate
    headers = {REPLICA_SECRET_HEADER: SECRET}
    Server.ready = False
    assert httpx.get(f"{url}/stats", headers=headers, timeout=10).status_code == 503
    assert httpx.get(f"{url}/health", headers=headers, timeout=10).json() == {"ready": False}
    upstream.shutdown()
    upstream.server_close()
    gone = httpx.post(f"{url}/predict", json={"inputs": [1]}, headers=headers, timeout=10)
    assert gone.status_code == 502 and "did not answer" in gone.json()["detail"]


def test_a_body_past_the_limit_is_refused_unread(gate) -> None:
    url, _ = gate
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(f"POST /predict HTTP/1.1\r\nHost: x\r\n{REPLICA_SECRET_HEADER}: {SECRET}\r\n"
                     f"Content-Length: {replica_gate.MAX_BODY_BYTES + 1}\r\n\r\n".encode())
        assert sock.recv(200).startswith(b"HTTP/1.1 413")


def test_the_gate_refuses_to_start_without_a_secret_or_on_every_interface(tmp_path) -> None:
    common = {"pidfile": tmp_path / "pid", "progress": tmp_path / "progress", "command": ["true"], "uid": None,
              "gid": None}
    with pytest.raises(replica_gate.GateError, match="secret"):
        replica_gate.run(listen="127.0.0.1", secret="short", **common)
    with pytest.raises(replica_gate.GateError, match="every interface"):
        replica_gate.run(listen="0.0.0.0", secret=SECRET, **common)  # noqa: S104
    assert replica_gate.main(["--listen", "127.0.0.1", "--pidfile", str(tmp_path / "p"), "--progress",
                              str(tmp_path / "q"), "--", "true"]) == 126  # no $CONSOLE_REPLICA_SECRET

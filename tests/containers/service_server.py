"""A user's own inference server, as the HTTP contract of services from an image asks (docs/containers.md): the
standard library's http.server in the base test image, on $CONSOLE_SERVE_PORT, on every interface of its
container (the gate is what keeps it from the network). /predict answers the sum of each input, and whether the
replica's secret reached it (it must not)."""

SERVER = """\
import json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.send(200, {"ready": True}) if self.path == "/health" else self.send(404, {"detail": "no such path"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send(200, {"outputs": [sum(x) for x in body["inputs"]], "model": os.environ.get("MODEL"),
                        "secret_seen": any("SECRET" in name for name in os.environ)})

print("serving on port", os.environ["CONSOLE_SERVE_PORT"], flush=True)
ThreadingHTTPServer(("0.0.0.0", int(os.environ["CONSOLE_SERVE_PORT"])), Handler).serve_forever()
"""

"""Fixtures for the inference replica server (workers.runtime.serve): real subprocesses, no database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from workers.protocol import REPLICA_SECRET_ENV, REPLICA_SECRET_HEADER

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120.0  # importing torch and torchao on a busy shared CPU can take a while
# The replicas' secret, as the agent hands it over (environment); every request carries it.
SECRET = "test-replica-secret-0123456789abcdef"
HEADERS = {REPLICA_SECRET_HEADER: SECRET}


def get(url: str, **options) -> httpx.Response:
    return httpx.get(url, headers={**HEADERS, **options.pop("headers", {})}, **options)


def post(url: str, **options) -> httpx.Response:
    return httpx.post(url, headers={**HEADERS, **options.pop("headers", {})}, **options)


@dataclass
class Replica:
    """A `python -m workers.runtime.serve` process started on port 0 with a progress file."""

    args: list[str]
    workdir: Path
    preset: str = "infer-fp32"
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    port: int | None = None

    @property
    def progress(self) -> Path:
        return self.workdir / "progress.jsonl"

    @property
    def log(self) -> Path:
        return self.workdir / "server.log"

    @property
    def url(self) -> str:
        assert self.port is not None
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Replica:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONSOLE_")}
        env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
                    "CONSOLE_PRESET": self.preset, "CONSOLE_PROGRESS_FILE": str(self.progress),
                    "CONSOLE_DEVICE": "cpu", REPLICA_SECRET_ENV: SECRET, **self.extra_env})
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workers.runtime.serve", "--host", "127.0.0.1", "--port", "0", *self.args],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        return self

    def records(self) -> list[dict]:
        if not self.progress.exists():
            return []
        return [json.loads(line) for line in self.progress.read_text().splitlines() if line.strip()]

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> Replica:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            serving = [r for r in self.records() if r["type"] == "serving"]
            if serving:
                self.port = int(serving[0]["port"])
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            time.sleep(0.1)
        raise AssertionError(f"server not ready after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stats(self) -> dict:
        return get(f"{self.url}/stats", timeout=10).json()

    def terminate(self, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def train_mlp_digits(output_dir: Path) -> Path:
    """Train mlp-digits for real, in this process, through run_builtin's own training path (it writes
    model.pt the way a training job does)."""
    import torch

    from workers.runtime import run_builtin
    from workers.runtime import session as session_mod
    from workers.runtime.workloads import get

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        params = run_builtin.resolve_params("mlp-digits", json.dumps({"epochs": 3}))
        rt = session_mod.start({"CONSOLE_OUTPUT_DIR": str(output_dir)}, preset="baseline-fp32",
                               install_signal_handler=False)
        try:
            metrics = run_builtin.train(rt, get("mlp-digits"), params)
        finally:
            rt.close()
    finally:
        torch.set_num_threads(threads)
    assert metrics["accuracy"] > 0.85, metrics
    return output_dir / "model.pt"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory):
    """Three replicas started together (their start-up overlaps the training):

    - trained: mlp-digits trained here for 3 epochs, served with infer-int8 and dynamic batching
    - unbatched: fresh cnn-digits weights, --no-batching
    - lm: fresh tiny-lm weights (small), dynamic batching
    """
    root = tmp_path_factory.mktemp("serving")
    unbatched = Replica(["--workload", "cnn-digits", "--params", '{"channels": 8}', "--no-batching"],
                        root / "unbatched").start()
    # The SIGTERM test's long generations must finish however busy the machine is: a drain that waits for them.
    lm = Replica(["--workload", "tiny-lm", "--params", '{"d_model": 64, "layers": 2, "seq_len": 32}',
                  "--max-batch", "16", "--drain-s", "600"], root / "lm").start()
    started = [unbatched, lm]
    try:
        model = train_mlp_digits(root / "train-output")
        trained = Replica(["--workload", "mlp-digits", "--checkpoint", str(model), "--max-batch", "32",
                           "--max-wait-ms", "5"], root / "trained", preset="infer-int8").start()
        started.append(trained)
        for replica in started:
            replica.wait_ready()
        yield {"trained": trained, "unbatched": unbatched, "lm": lm}
    finally:
        for replica in started:
            replica.stop()

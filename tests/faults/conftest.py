"""Servers the fault tests may break: a private Redis and a private PostgreSQL, and the table of what happened.

They are this machine's own server programs (Debian's redis-server and PostgreSQL 15) started on free ports
under the test's temp folder, so stopping one never disturbs the shared servers other tests use.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import fault_table
from tests.integration.live import free_port, wait_until


def record_fault(fault: str, outcome: str, recovery_s: float | None, jobs_lost: int) -> None:
    """One row of the fault table printed at the end of the run (tests/fault_table.py)."""
    fault_table.record(fault, outcome, recovery_s, jobs_lost)


@dataclass
class PrivateRedis:
    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        # No persistence, as on this machine's Redis: a restart loses every queued message.
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder)],
            stdout=(self.folder / "redis.log").open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self.answers, timeout=20, what="redis-server to answer", interval=0.2)

    def answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


@dataclass
class PrivatePostgres:
    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    @staticmethod
    def binaries() -> Path | None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        return found[-1].parent if found else None

    def _as_postgres(self, argv: list[str]) -> list[str]:
        # PostgreSQL refuses to run as root: run it as the postgres user when we are root.
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def init(self) -> None:
        data = self.folder / "data"
        data.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
            shutil.chown(data, "postgres")
        subprocess.run(self._as_postgres([str(self.binaries() / "initdb"), "-D", str(data), "-U", "postgres",
                                          "--auth=trust", "--no-sync"]), check=True, capture_output=True)

    def start(self) -> None:
        self.process = subprocess.Popen(
            self._as_postgres([str(self.binaries() / "postgres"), "-D", str(self.folder / "data"), "-p",
                               str(self.port), "-k", str(self.folder), "-c", "listen_addresses=127.0.0.1",
                               "-c", "fsync=off", "-c", "max_connections=300"]),
            stdout=(self.folder.parent / "postgres.log").open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True)
        wait_until(self.answers, timeout=30, what="PostgreSQL to accept connections", interval=0.2)

    def answers(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url, connect_timeout=1):
                return True
        except psycopg.Error:
            return False

    def stop(self) -> None:
        """A fast shutdown, as `systemctl restart postgresql` does: every client connection is cut."""
        if self.process and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGINT)
            self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory):
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server (Debian's redis-server package)")
    server = PrivateRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def private_postgres(tmp_path_factory):
    if PrivatePostgres.binaries() is None:
        pytest.skip("needs PostgreSQL's server programs (Debian's postgresql package)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("needs runuser to start PostgreSQL as the postgres user")
    # Not under pytest's temp folder, nor TMPDIR (CI gives each pass a folder of its own): those may be private to
    # our user, and the postgres user must reach it.
    folder = Path(tempfile.mkdtemp(prefix="console-faults-pg-", dir="/tmp")) / "cluster"
    server = PrivatePostgres(folder)
    folder.parent.chmod(0o755)
    server.init()
    server.start()
    yield server
    server.stop()
    shutil.rmtree(folder.parent, ignore_errors=True)

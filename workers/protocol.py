"""Messages between the host agent and the console, versioned. Pure: no Django, no Celery, no HTTP.

The console sends a `Dispatch` to the host's own Celery queue (`host.<name>`); the agent answers over the console's
agent API (HTTP, authenticated by its host token) with registration, heartbeats, job status, logs and progress.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass, field
from typing import Any

PROTOCOL_VERSION = 1
HOST_QUEUE_PREFIX = "host."
RUN_JOB_TASK = "agent.run_job"
STOP_JOB_TASK = "agent.stop_job"
HEARTBEAT_INTERVAL_S = 5.0
# A host whose last heartbeat is older than this is marked down and its jobs failed or requeued.
HEARTBEAT_TIMEOUT_S = 30.0
# An inference replica answers only requests carrying its secret in this header; the agent hands the secret to
# the replica in this environment variable (never on the command line, which every local user can read).
REPLICA_SECRET_HEADER = "X-Replica-Secret"
REPLICA_SECRET_ENV = "CONSOLE_REPLICA_SECRET"
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


class ProtocolError(ValueError):
    """A message that does not match this version's schema."""


def host_queue(host_name: str) -> str:
    return f"{HOST_QUEUE_PREFIX}{host_name}"


def valid_address(value: str) -> bool:
    """An IPv4 or IPv6 address, or a host name by RFC 1123: nothing else (no scheme, port, path, user, zone)."""
    if not isinstance(value, str) or not value or len(value) > 253:
        return False
    try:
        ipaddress.ip_address(value)
        return "%" not in value  # a scoped IPv6 address ("fe80::1%eth0") names a local interface
    except ValueError:
        pass
    labels = value.split(".")
    # An all-numeric last label would make "1.2.3" or "999.1.1.1" look like an address it is not.
    return all(_HOST_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()


@dataclass(frozen=True)
class Rendezvous:
    """Where the processes of a multi-host job meet (torchrun's c10d rendezvous)."""

    endpoint: str  # "address:port" of node rank 0
    nnodes: int
    node_rank: int
    run_id: str


@dataclass(frozen=True)
class Dispatch:
    job_id: int
    attempt: int
    host: str
    gpu_indices: tuple[int, ...]
    kind: str
    preset: str
    workload: dict[str, Any]
    time_limit_s: int
    max_steps: int | None = None
    multi_process: bool = False
    rendezvous: Rendezvous | None = None
    # A fractional job's part of its one GPU, and the memory it asked for (the agent enforces both).
    gpu_share: float = 1.0
    gpu_memory_mb: int | None = None
    # The attempt's own credential for the console's job API (apps/jobs/attempt_tokens.py): handed to the job
    # as CONSOLE_JOB_TOKEN, in place of any secret of the agent's.
    job_token: str = field(default="", repr=False)
    # The job's CPUs and memory on this host (its cgroup's limits); None: none sent (an older console).
    cpus: float | None = None
    memory_gb: float | None = None
    # An inference replica's secret (see REPLICA_SECRET_HEADER); empty for other jobs. Not in the repr: logs.
    replica_secret: str = field(default="", repr=False)
    version: int = PROTOCOL_VERSION

    def to_message(self) -> dict[str, Any]:
        message = asdict(self)
        message["gpu_indices"] = list(self.gpu_indices)
        return message

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Dispatch:
        if not isinstance(message, dict):
            raise ProtocolError("a dispatch must be an object")
        version = message.get("version")
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"dispatch protocol version {version!r}; this agent speaks {PROTOCOL_VERSION}")
        try:
            rendezvous = message.get("rendezvous")
            return cls(
                job_id=int(message["job_id"]),
                attempt=int(message["attempt"]),
                host=str(message["host"]),
                gpu_indices=tuple(int(i) for i in message["gpu_indices"]),
                kind=str(message["kind"]),
                preset=str(message["preset"]),
                workload=dict(message["workload"]),
                time_limit_s=int(message["time_limit_s"]),
                max_steps=None if message.get("max_steps") is None else int(message["max_steps"]),
                multi_process=bool(message.get("multi_process", False)),
                rendezvous=Rendezvous(**rendezvous) if rendezvous else None,
                gpu_share=float(message.get("gpu_share", 1.0)),
                gpu_memory_mb=None if message.get("gpu_memory_mb") is None else int(message["gpu_memory_mb"]),
                job_token=str(message.get("job_token") or ""),
                cpus=_positive_or_none(message.get("cpus"), "cpus"),
                memory_gb=_positive_or_none(message.get("memory_gb"), "memory_gb"),
                replica_secret=str(message.get("replica_secret") or ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed dispatch: {exc}") from None


def _positive_or_none(value: Any, name: str) -> float | None:
    if value is None:
        return None
    number = float(value)
    if not number > 0 or number == float("inf"):
        raise ValueError(f"{name} must be a number > 0, not {value!r}")
    return number


@dataclass(frozen=True)
class GpuRecord:
    index: int
    uuid: str
    name: str
    gpu_type: str
    memory_mb: int


@dataclass(frozen=True)
class Registration:
    host: str
    agent_version: str
    simulated: bool
    gpus: list[GpuRecord]
    driver_version: str = ""
    cuda_version: str = ""
    address: str = ""
    # What the host can give jobs (the console refuses a job asking more than the largest host has); 0: unknown.
    cpus: int = 0
    memory_mb: int = 0
    protocol: int = PROTOCOL_VERSION

    def to_message(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JobIsolation:
    """How an attempt is kept apart from its host and the other jobs; the agent reports it with "running"."""

    user: str  # "own-uid" (a uid of its own), "shared-user" (the --run-as user of every job), "agent-user"
    uid: int
    private_view: bool  # a mount namespace of its own: it sees its own files, not the agent's or other jobs'

    MODES = ("own-uid", "shared-user", "agent-user")

    def summary(self) -> str:
        view = ("in a private filesystem view (its own work folder and artifacts; not the agent's state, token "
                "or other jobs' files)")
        if self.user == "own-uid":
            return f"runs under a uid of its own ({self.uid}) {view}"
        if self.user == "shared-user":
            return (f"runs as the agent's --run-as user (uid {self.uid}), shared by every job on the host, {view}; "
                    "jobs on this host can reach each other's processes")
        if self.uid == 0:
            return ("runs as root, like the agent (--job-uids off): it can read and change everything on its host, "
                    "the agent's token and other jobs included")
        return (f"shares the agent's user (uid {self.uid}): the agent cannot switch users (it does not run as "
                "root, or cannot build a job's filesystem view), so the job can read whatever the agent can, its "
                "host token included")

    def to_details(self) -> dict[str, Any]:
        return {"isolation": self.user, "isolation_uid": self.uid, "isolation_note": self.summary()}

    @classmethod
    def from_details(cls, details: dict[str, Any]) -> JobIsolation | None:
        if details.get("isolation") not in cls.MODES or not isinstance(details.get("isolation_uid"), int):
            return None
        return cls(details["isolation"], details["isolation_uid"], details["isolation"] != "agent-user")


@dataclass(frozen=True)
class JobStatus:
    """What an agent reports about its part of a job."""

    state: str  # "running" | "succeeded" | "failed" | "preempted" | "stopped"
    attempt: int
    exit_code: int | None = None
    reason: str = ""
    node_rank: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    STATES = ("running", "succeeded", "failed", "preempted", "stopped")

    def to_message(self) -> dict[str, Any]:
        return asdict(self)

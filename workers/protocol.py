"""Messages between the host agent and the console, versioned. Pure: no Django, no Celery, no HTTP.

The console sends a `Dispatch` to the host's own Celery queue (`host.<name>`); the agent answers over the console's
agent API (HTTP, authenticated by its host token) with registration, heartbeats, job status, logs and progress.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

# 2: a dispatch names the job's secrets only; the agent fetches their values (GET /api/v1/agent/jobs/<id>/secrets/).
# 3: a dispatch may carry a job array's task (ArrayTask), which an agent of protocol 2 would drop: every task would
# then run without its index, doing the same work N times. The console refuses agents of another protocol.
PROTOCOL_VERSION = 3
HOST_QUEUE_PREFIX = "host."
RUN_JOB_TASK = "agent.run_job"
STOP_JOB_TASK = "agent.stop_job"
# (job id, attempt, share of its one GPU): a running job's share changed (a shareable job got or lost a neighbour,
# apps/jobs/colocating.py); the agent's memory watch holds it to the new share from then on.
RESHARE_JOB_TASK = "agent.reshare_job"
HEARTBEAT_INTERVAL_S = 5.0
# A host whose last heartbeat is older than this is marked down and its jobs failed or requeued.
HEARTBEAT_TIMEOUT_S = 30.0
# An inference replica answers only requests carrying its secret in this header; the agent hands the secret to
# the replica in this environment variable (never on the command line, which every local user can read).
REPLICA_SECRET_HEADER = "X-Replica-Secret"
REPLICA_SECRET_ENV = "CONSOLE_REPLICA_SECRET"
# The HTTP contract of a service's own server (a service from a user's image, docs/containers.md): it listens on
# this port (given to it in ENV_SERVE_PORT) inside its container's private network namespace, answers
# GET REPLICA_HEALTH_PATH with 200 once ready and POST REPLICA_PREDICT_PATH with JSON. The agent's replica gate
# (workers/agent/replica_gate.py) stands before it with the secret and the statistics.
REPLICA_SERVER_PORT = 8080
REPLICA_HEALTH_PATH = "/health"
REPLICA_PREDICT_PATH = "/predict"
# A replica's GET /stats (the built-in server's, or the gate's for a user's server) reports latencies over the last
# REPLICA_LATENCY_WINDOW_S and requests per second over the last REPLICA_RPS_WINDOW_S: ReplicaWindow computes both.
REPLICA_LATENCY_WINDOW_S = 30.0
REPLICA_RPS_WINDOW_S = 10.0
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


class ReplicaWindow:
    """The answered requests a replica's /stats figures come from: latency percentiles (linear interpolation, as
    numpy's default), the requests in the latency window (the autoscaler wants enough of them) and the rate."""

    def __init__(self, started: float, max_kept: int = 200_000) -> None:
        self.started = started
        self._done: deque[tuple[float, float]] = deque(maxlen=max_kept)

    def add(self, at: float, latency_ms: float) -> None:
        self._done.append((at, latency_ms))

    def figures(self, now: float) -> dict[str, Any]:
        while self._done and self._done[0][0] < now - REPLICA_LATENCY_WINDOW_S:
            self._done.popleft()
        window = sorted(latency for _, latency in self._done)
        recent = sum(1 for at, _ in self._done if at >= now - REPLICA_RPS_WINDOW_S)
        uptime = now - self.started
        latency = {name: round(_percentile(window, q), 3) if window else None
                   for name, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))}
        return {"latency_ms": latency, "window_requests": len(window),
                "rps": round(recent / min(REPLICA_RPS_WINDOW_S, max(uptime, 1e-3)), 3), "uptime_s": round(uptime, 3)}


def _percentile(ordered: list[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


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


# Where a job's code (an uploaded snapshot or a git checkout) and its container's mounts appear inside the job.
CODE_PATH = "/workspace/code"
CONTAINER_RUNTIMES = ("process", "podman", "docker")
# Where the agent mounts the job runtime (workers.runtime and this module, Django-free) read-only inside a
# container, and puts it on PYTHONPATH, so presets and progress work in any image with Python and torch.
RUNTIME_MOUNT_PATH = "/opt/gpu-console-runtime"
# Inside a container: the job's own folder (HOME, progress file), its checkpoints and its outputs.
CONTAINER_HOME = "/workspace/home"
CONTAINER_CHECKPOINTS = "/workspace/checkpoints"
CONTAINER_OUTPUTS = "/workspace/outputs"
# A code snapshot's largest archive (gpuctl refuses to upload more; the console and the agent refuse it too).
CODE_SNAPSHOT_MAX_BYTES = 100 * 1024 * 1024
# Labels on every container an agent starts: what it removes when a job ends and, at start, what a previous
# run of it left behind.
CONTAINER_LABEL_HOST = "gpu-console.host"
CONTAINER_LABEL_JOB = "gpu-console.job"


@dataclass(frozen=True)
class MountSpec:
    """A named volume an admin defined (apps/cluster), resolved by the console for one job: the host path the
    agent binds at `target` inside the job. The agent refuses any source outside its own --volume-root list."""

    name: str
    source: str  # a path on the host (a local folder or a network file system mounted there)
    target: str  # an absolute path inside the job, "/mnt/<name>" unless the admin chose another
    read_only: bool = True


@dataclass(frozen=True)
class CodeSnapshot:
    """The job's code: an uploaded snapshot (a tar.gz in the artifact store, fetched over the job API) or a git
    repository at a recorded commit. The agent unpacks or checks it out at CODE_PATH and starts the job there."""

    kind: str  # "upload" | "git"
    url: str  # upload: the job-API path of the archive; git: the repository URL
    ref: str = ""  # git: the branch, tag or commit asked for
    commit: str = ""  # git: the commit recorded at submission (the agent checks out exactly this)
    sha256: str = ""  # upload: the archive's digest, checked before unpacking
    size: int = 0


@dataclass(frozen=True)
class ContainerSpec:
    """What a job asks of its environment beyond GPUs: an OCI image, plain variables, the names of team secrets
    (never their values: the agent fetches those just before the container starts, see JobSecrets), mounts, code
    and /dev/shm. Empty `image`: the job runs on the host (the process backend)."""

    image: str = ""
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    mounts: tuple[MountSpec, ...] = ()
    code: CodeSnapshot | None = None
    shm_gb: float | None = None

    @classmethod
    def from_message(cls, message: Any) -> ContainerSpec:
        if message is None:
            return cls()
        if not isinstance(message, dict):
            raise ValueError("container must be an object")
        code = message.get("code")
        return cls(
            image=str(message.get("image") or ""),
            env={str(k): str(v) for k, v in dict(message.get("env") or {}).items()},
            secrets=_secret_names(message.get("secrets")),
            mounts=tuple(MountSpec(**m) for m in message.get("mounts") or ()),
            code=CodeSnapshot(**code) if code else None,
            shm_gb=_positive_or_none(message.get("shm_gb"), "shm_gb"),
        )


def _secret_names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(name, str) for name in value):
        raise ValueError("container.secrets must be a list of names (values are fetched at start: JobSecrets)")
    return tuple(value)


# The agent API path of a job attempt's secret values (GET, with `?attempt=N`): only the host the attempt is
# placed on, with its host token, while the attempt is placed or running (apps/jobs/job_api.py).
def job_secrets_path(job_id: int) -> str:
    return f"jobs/{int(job_id)}/secrets/"


@dataclass(frozen=True)
class JobSecrets:
    """The values of a job attempt's team secrets, fetched by its agent just before the container starts: they
    travel over the agent API (TLS where the console has it), never in the broker's dispatch message."""

    attempt: int
    values: dict[str, str] = field(default_factory=dict, repr=False)

    def to_message(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "values": dict(self.values)}

    @classmethod
    def from_message(cls, message: Any) -> JobSecrets:
        if not isinstance(message, dict) or not isinstance(message.get("values"), dict):
            raise ProtocolError("job secrets must be an object with `values`")
        values = message["values"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
            raise ProtocolError("job secrets' values must map names to strings")
        try:
            return cls(attempt=int(message["attempt"]), values=dict(values))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed job secrets: {exc}") from None


@dataclass(frozen=True)
class ArrayTask:
    """A task of a job array (apps/jobs/submission.py): the array's id (its first task's job id), this task's
    index (0 to size - 1) and the array's size. The job sees them as CONSOLE_ARRAY_* (JobEnvironment)."""

    array_id: int
    index: int
    size: int

    @classmethod
    def from_message(cls, message: Any) -> ArrayTask | None:
        if message is None:
            return None
        task = cls(array_id=int(message["array_id"]), index=int(message["index"]), size=int(message["size"]))
        if task.array_id < 1 or not 0 <= task.index < task.size:
            raise ValueError(f"array task {task.index} of {task.size} (array {task.array_id}) is out of range")
        return task


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
    # Image, env, secrets, mounts, code and shm (issue 16); the default: a job on the host, as before.
    container: ContainerSpec = field(default_factory=ContainerSpec)
    # A task of a job array; None for a job submitted alone.
    array: ArrayTask | None = None
    # (job id, attempt) of jobs that held any of these GPUs until a moment ago: one the console ended (a cancel)
    # may still be stopping there, and this job starts once it has exited, even if its stop has not arrived yet.
    after: tuple[tuple[int, int], ...] = ()
    version: int = PROTOCOL_VERSION

    def to_message(self) -> dict[str, Any]:
        message = asdict(self)
        message["gpu_indices"] = list(self.gpu_indices)
        message["after"] = [list(pair) for pair in self.after]
        message["container"]["mounts"] = [asdict(m) for m in self.container.mounts]
        message["container"]["secrets"] = list(self.container.secrets)
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
                container=ContainerSpec.from_message(message.get("container")),
                array=ArrayTask.from_message(message.get("array")),
                after=tuple((int(job_id), int(attempt)) for job_id, attempt in message.get("after") or ()),
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
class ImageRecord:
    """An image in a container host's local store (the host page lists them)."""

    name: str  # repository:tag, or the id when it has no name
    id: str
    size_mb: int = 0
    created: str = ""  # ISO 8601, as the runtime reports it

    @classmethod
    def decode_list(cls, message: Any, limit: int = 500) -> list[ImageRecord]:
        """Image records from a registration or heartbeat; malformed entries are dropped, never raised."""
        if not isinstance(message, list):
            return []
        records = []
        for item in message[:limit]:
            if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("id"), str):
                records.append(cls(name=_text(item["name"], 300), id=_text(item["id"], 128),
                                   size_mb=_count(item.get("size_mb")) or 0,
                                   created=_text(item.get("created"), 40)))
        return records


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
    # How this agent runs jobs: "process" (on the host), "podman" or "docker" (OCI containers; --runtime).
    runtime: str = "process"
    # How it keeps process jobs apart (a JobIsolation mode): only "own-uid" hosts take a job given secrets or volumes
    # without an image (the values go into its processes' environment, the volumes into its filesystem view).
    # Blank: an agent that does not say.
    job_isolation: str = ""
    images: list[ImageRecord] = field(default_factory=list)  # a container host's cached images
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
            return ("runs as root, like the agent (--job-uids off, or an agent that cannot build a job's filesystem "
                    "view): it can read and change everything on its host, the agent's token and other jobs included")
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

    @classmethod
    def running(cls, attempt: int, details: RunningDetails, *, node_rank: int = 0) -> JobStatus:
        return cls("running", attempt, node_rank=node_rank, details=details.to_details())

    def running_details(self) -> RunningDetails:
        """The details of a "running" report, as far as they are usable."""
        return RunningDetails.from_details(self.details)


# --- a job's output, as an agent sends it ---------------------------------------------------------------------
# An agent sends a job attempt's output as one stream, named by a random id of the sender's (an agent restarted
# while the attempt is still placed starts a new one). A log chunk carries the stream and its `offset`: the
# characters of that stream handed on before it. A chunk sent again because its answer was lost (the console
# stored it, the agent never heard) therefore says where it starts, and the console stores each character once.


def unseen_output(received: int, offset: int, data: str) -> str:
    """The part of a chunk sent at `offset` that a receiver holding `received` characters of the stream lacks.
    A chunk starting past `received` (the sender skipped one the receiver refused) is taken whole."""
    return data[max(received - offset, 0):]


# --- the job's environment: what the agent hands a job process, and what the runtime reads back -----------

ENV_JOB_ID = "CONSOLE_JOB_ID"
ENV_ATTEMPT = "CONSOLE_ATTEMPT"
ENV_PRESET = "CONSOLE_PRESET"
ENV_MAX_STEPS = "CONSOLE_MAX_STEPS"
ENV_PROGRESS_FILE = "CONSOLE_PROGRESS_FILE"
ENV_CHECKPOINT_DIR = "CONSOLE_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY = "CONSOLE_CHECKPOINT_EVERY"
ENV_OUTPUT_DIR = "CONSOLE_OUTPUT_DIR"
ENV_MODEL_PATH = "CONSOLE_MODEL_PATH"
ENV_DEVICE = "CONSOLE_DEVICE"
# The attempt's credential and the console's job API (GET ./, POST progress/, GET/PUT artifacts/<path>).
ENV_JOB_TOKEN = "CONSOLE_JOB_TOKEN"
ENV_API_URL = "CONSOLE_API_URL"
# A fractional job's GPU memory (MiB) and its part of the GPU's memory, for PyTorch's allocator cap.
ENV_GPU_MEMORY_LIMIT_MB = "CONSOLE_GPU_MEMORY_LIMIT_MB"
ENV_GPU_MEMORY_FRACTION = "CONSOLE_GPU_MEMORY_FRACTION"
ENV_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# The port a service's own server listens on (REPLICA_SERVER_PORT), in a replica from a user's image.
ENV_SERVE_PORT = "CONSOLE_SERVE_PORT"
# A task of a job array (Slurm's SLURM_ARRAY_JOB_ID, _TASK_ID, _TASK_COUNT): the array's id, the task's index
# (0 to count - 1) and the number of tasks.
ENV_ARRAY_JOB_ID = "CONSOLE_ARRAY_JOB_ID"
ENV_ARRAY_TASK_ID = "CONSOLE_ARRAY_TASK_ID"
ENV_ARRAY_TASK_COUNT = "CONSOLE_ARRAY_TASK_COUNT"
# Every variable of a JobEnvironment: the agent drops inherited ones (--pass-env) before setting its own.
JOB_ENV_VARIABLES = (ENV_JOB_ID, ENV_ATTEMPT, ENV_PRESET, ENV_MAX_STEPS, ENV_PROGRESS_FILE, ENV_CHECKPOINT_DIR,
                     ENV_CHECKPOINT_EVERY, ENV_OUTPUT_DIR, ENV_MODEL_PATH, ENV_DEVICE, ENV_JOB_TOKEN, ENV_API_URL,
                     REPLICA_SECRET_ENV, ENV_GPU_MEMORY_LIMIT_MB, ENV_GPU_MEMORY_FRACTION, ENV_VISIBLE_DEVICES,
                     ENV_SERVE_PORT, ENV_ARRAY_JOB_ID, ENV_ARRAY_TASK_ID, ENV_ARRAY_TASK_COUNT)
# Where the agent puts the progress file, in the job's own folder.
PROGRESS_FILE_NAME = "progress.jsonl"
# The job API's path under the console's URL.
JOB_API_PATH = "/api/v1/job/"


class EnvError(ProtocolError):
    """A CONSOLE_* variable holds a value the runtime cannot use."""


def env_int(env: Mapping[str, str], name: str) -> int | None:
    """A non-negative integer variable, or None when it is unset or blank; EnvError names a bad value."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(f"{name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise EnvError(f"{name} must not be negative, got {value}")
    return value


def _env_path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name, "").strip()
    return Path(raw) if raw else None


def _env_fraction(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise EnvError(f"{name} must be a number in (0, 1], got {raw!r}") from None
    if not 0 < value <= 1:
        raise EnvError(f"{name} must be in (0, 1], got {raw!r}")
    return value


@dataclass(frozen=True)
class JobEnvironment:
    """Every variable the agent sets for a job (and a user may set for a local run): one encoding each way.

    Unset or empty variables are None (or ""); `to_env()` leaves them out, so `from_env(to_env(e)) == e`.
    """

    job_id: str = ""
    attempt: int | None = None
    preset: str = ""
    max_steps: int | None = None
    progress_file: Path | None = None
    checkpoint_dir: Path | None = None
    checkpoint_every: int | None = None
    output_dir: Path | None = None
    model_path: Path | None = None
    device: str = ""  # "cpu", "cuda", "cuda:1"...; "" picks cuda when available
    # CUDA_VISIBLE_DEVICES as given (indices, or UUIDs in a user's own run); None: unset, every GPU visible.
    visible_devices: tuple[str, ...] | None = None
    api_url: str = ""
    job_token: str = field(default="", repr=False)
    replica_secret: str = field(default="", repr=False)
    gpu_memory_limit_mb: int | None = None
    gpu_memory_fraction: float | None = None
    serve_port: int | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_task_count: int | None = None

    def to_env(self) -> dict[str, str]:
        values: dict[str, str | int | float | Path | None] = {
            ENV_JOB_ID: self.job_id, ENV_ATTEMPT: self.attempt, ENV_PRESET: self.preset,
            ENV_MAX_STEPS: self.max_steps, ENV_PROGRESS_FILE: self.progress_file,
            ENV_CHECKPOINT_DIR: self.checkpoint_dir, ENV_CHECKPOINT_EVERY: self.checkpoint_every,
            ENV_OUTPUT_DIR: self.output_dir, ENV_MODEL_PATH: self.model_path, ENV_DEVICE: self.device,
            ENV_API_URL: self.api_url, ENV_JOB_TOKEN: self.job_token, REPLICA_SECRET_ENV: self.replica_secret,
            ENV_GPU_MEMORY_LIMIT_MB: self.gpu_memory_limit_mb, ENV_GPU_MEMORY_FRACTION: self.gpu_memory_fraction,
            ENV_SERVE_PORT: self.serve_port, ENV_ARRAY_JOB_ID: self.array_job_id,
            ENV_ARRAY_TASK_ID: self.array_task_id, ENV_ARRAY_TASK_COUNT: self.array_task_count,
        }
        env = {name: str(value) for name, value in values.items() if value is not None and value != ""}
        if self.visible_devices is not None:
            env[ENV_VISIBLE_DEVICES] = ",".join(self.visible_devices)
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobEnvironment:
        """Raises EnvError for a value the runtime cannot use (a step count that is not a number...)."""
        devices = env.get(ENV_VISIBLE_DEVICES)
        return cls(
            job_id=env.get(ENV_JOB_ID, "").strip(),
            attempt=env_int(env, ENV_ATTEMPT),
            preset=env.get(ENV_PRESET, "").strip(),
            max_steps=env_int(env, ENV_MAX_STEPS),
            progress_file=_env_path(env, ENV_PROGRESS_FILE),
            checkpoint_dir=_env_path(env, ENV_CHECKPOINT_DIR),
            checkpoint_every=env_int(env, ENV_CHECKPOINT_EVERY),
            output_dir=_env_path(env, ENV_OUTPUT_DIR),
            model_path=_env_path(env, ENV_MODEL_PATH),
            device=env.get(ENV_DEVICE, "").strip(),
            visible_devices=None if devices is None else tuple(d.strip() for d in devices.split(",") if d.strip()),
            api_url=env.get(ENV_API_URL, "").strip(),
            job_token=env.get(ENV_JOB_TOKEN, "").strip(),
            replica_secret=env.get(REPLICA_SECRET_ENV, ""),
            gpu_memory_limit_mb=env_int(env, ENV_GPU_MEMORY_LIMIT_MB),
            gpu_memory_fraction=_env_fraction(env, ENV_GPU_MEMORY_FRACTION),
            serve_port=env_int(env, ENV_SERVE_PORT),
            array_job_id=env_int(env, ENV_ARRAY_JOB_ID),
            array_task_id=env_int(env, ENV_ARRAY_TASK_ID),
            array_task_count=env_int(env, ENV_ARRAY_TASK_COUNT),
        )


def job_api_url(console_url: str) -> str:
    return f"{console_url.rstrip('/')}{JOB_API_PATH}"


# The job API path that serves an attempt's uploaded code snapshot (a tar.gz), to the agent with the
# attempt's job token (CodeSnapshot.url holds it).
JOB_CODE_PATH = f"{JOB_API_PATH}code/"


# --- progress records: the JSON lines a job appends to its progress file ---------------------------------

# A number the console stores (a loss, a rate): finite and of a sane size, else dropped.
_MAX_NUMBER = 1e30
# A progress line longer than this is no record of ours (the agent skips it unread).
MAX_PROGRESS_LINE = 64 * 1024


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and abs(number) < _MAX_NUMBER else None


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _fraction(value: Any) -> float | None:
    number = _number(value)
    return number if number is not None and 0.0 <= number <= 1.0 else None


def _text(value: Any, limit: int = 300) -> str:
    return value[:limit] if isinstance(value, str) else ""


# A job's own named metrics ("val_acc", "eval/loss") ride in a progress record's "metrics" object. A name is a
# short identifier a chart legend and a query string carry as is; the built-in series' names are taken.
METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,63}")
BUILTIN_METRICS = ("loss", "steps_per_s", "samples_per_s")
MAX_METRICS_PER_RECORD = 32
# More than a 64 KiB line can hold: what a record says it dropped is capped here (the console sums them).
MAX_DROPPED = 100_000


def clean_metrics(values: Any) -> tuple[dict[str, float], int]:
    """The usable named metrics of a record, and how many were dropped: a name that is no short identifier or is
    a built-in's, a value that is no finite number of a sane size, anything past MAX_METRICS_PER_RECORD."""
    if values is None:
        return {}, 0
    if not isinstance(values, Mapping):
        return {}, 1
    kept: dict[str, float] = {}
    dropped = 0
    for name, value in values.items():
        number = _number(value)
        if (not isinstance(name, str) or not METRIC_NAME.fullmatch(name) or name in BUILTIN_METRICS
                or number is None or len(kept) >= MAX_METRICS_PER_RECORD):
            dropped += 1
            continue
        kept[name] = number
    return kept, dropped


@dataclass(frozen=True)
class TrainingProgress:
    """{"type": "progress", "step": ..., "max_steps", "loss", "steps_per_s", "samples_per_s", "avg_steps_per_s",
    "avg_samples_per_s", "wait_fraction", "ts", "metrics": {name: value}, ...}.

    `steps_per_s`/`samples_per_s` and `wait_fraction` cover the interval since the previous report; the `avg_`
    rates the attempt's run so far (after its first step), the figures a job's record shows. A runtime older than the `avg_` rates
    sends only the interval's. `dropped_metrics` counts the named metrics dropped on the way (bad names or
    values), so the console can say how many it never got.
    """

    TYPE: ClassVar[str] = "progress"
    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    epoch: int | None = None
    ts: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    dropped_metrics: int = 0
    avg_steps_per_s: float | None = None
    avg_samples_per_s: float | None = None
    # The share of the interval's time the job spent waiting on data (or communication) rather than computing,
    # in [0, 1]: what the console's packing of shareable jobs reads (apps/scheduling/colocation.py).
    wait_fraction: float | None = None

    RATES: ClassVar[tuple[str, ...]] = ("steps_per_s", "samples_per_s", "avg_steps_per_s", "avg_samples_per_s")

    def to_message(self) -> dict[str, Any]:
        message = {"type": self.TYPE, **{k: v for k, v in asdict(self).items() if v is not None}}
        if not self.metrics:
            del message["metrics"]
        if not self.dropped_metrics:
            del message["dropped_metrics"]
        return message

    def values(self) -> dict[str, float]:
        """Every value of the record by series name: the built-in ones that are present, then the job's own."""
        builtin = {"loss": self.loss, "steps_per_s": self.steps_per_s, "samples_per_s": self.samples_per_s}
        return {**{k: v for k, v in builtin.items() if v is not None}, **self.metrics}

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> TrainingProgress:
        """The usable fields of a record; a wrong-typed or out-of-range field is dropped, never trusted."""
        rates = {key: _number(message.get(key)) for key in cls.RATES}
        metrics, dropped = clean_metrics(message.get("metrics"))
        return cls(step=_count(message.get("step")), max_steps=_count(message.get("max_steps")),
                   loss=_number(message.get("loss")),
                   **{key: value if value is None or value >= 0 else None for key, value in rates.items()},
                   epoch=_count(message.get("epoch")), ts=_number(message.get("ts")), metrics=metrics,
                   wait_fraction=_fraction(message.get("wait_fraction")),
                   dropped_metrics=min((_count(message.get("dropped_metrics")) or 0) + dropped, MAX_DROPPED))


@dataclass(frozen=True)
class ServingProgress:
    """{"type": "serving", "port": ..., "host", "workload", "preset", "batching", "ts"}: a replica listens."""

    TYPE: ClassVar[str] = "serving"
    port: int
    host: str = ""
    workload: str = ""
    preset: str = ""
    batching: bool = True
    ts: float | None = None

    def to_message(self) -> dict[str, Any]:
        return {"type": self.TYPE, **{k: v for k, v in asdict(self).items() if v is not None}}

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> ServingProgress:
        port = message.get("port")
        if type(port) is not int or not 0 < port < 65536:
            raise ProtocolError(f"a serving record needs a port in 1..65535, not {port!r}")
        return cls(port=port, host=_text(message.get("host")), workload=_text(message.get("workload")),
                   preset=_text(message.get("preset")), batching=message.get("batching") is not False,
                   ts=_number(message.get("ts")))


@dataclass(frozen=True)
class CheckpointRecord:
    """{"type": "checkpoint", "path": ..., "step": ..., "ts"}: a checkpoint was saved."""

    TYPE: ClassVar[str] = "checkpoint"
    path: str
    step: int
    ts: float | None = None

    def to_message(self) -> dict[str, Any]:
        return {"type": self.TYPE, **{k: v for k, v in asdict(self).items() if v is not None}}

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> CheckpointRecord:
        step = _count(message.get("step"))
        if not isinstance(message.get("path"), str) or step is None:
            raise ProtocolError("a checkpoint record needs a path and a step")
        return cls(path=message["path"], step=step, ts=_number(message.get("ts")))


@dataclass(frozen=True)
class ResultRecord:
    """{"type": "result", ...metrics}: the job's final metrics (free-form JSON values)."""

    TYPE: ClassVar[str] = "result"
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_message(self) -> dict[str, Any]:
        return {"type": self.TYPE, **self.metrics}

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> ResultRecord:
        return cls({str(k): v for k, v in message.items() if k != "type"})

    def run_rates(self) -> tuple[float | None, float | None]:
        """(steps/s, samples/s) over the whole run, as the runtime's result states them: a training run's own
        rates; for inference, timed batches per second (1000 / mean latency) and its sample throughput."""
        metrics = self.metrics
        if metrics.get("kind") == "inference":
            mean_ms = _number(metrics.get("latency_ms_mean"))
            steps = 1000.0 / mean_ms if mean_ms else None
            samples = _number(metrics.get("throughput_samples_per_s"))
        else:
            steps, samples = _number(metrics.get("steps_per_s")), _number(metrics.get("samples_per_s"))
        return (steps if steps is None or steps >= 0 else None, samples if samples is None or samples >= 0 else None)


ProgressRecord = TrainingProgress | ServingProgress | CheckpointRecord | ResultRecord
PROGRESS_RECORDS: dict[str, type[TrainingProgress | ServingProgress | CheckpointRecord | ResultRecord]] = {
    record.TYPE: record for record in (TrainingProgress, ServingProgress, CheckpointRecord, ResultRecord)}
# The agent forwards every training record (the console keeps them as the job's metrics; at most this many a
# post, workers/agent/progress.py) and the newest serving record; the rest stay in the file.
MAX_PROGRESS_BATCH = 500


def decode_progress_message(message: Any) -> ProgressRecord | None:
    """A progress record from its JSON object; None for anything else (another type, a malformed record)."""
    if not isinstance(message, dict):
        return None
    name = message.get("type")
    kind = PROGRESS_RECORDS.get(name) if isinstance(name, str) else None
    if kind is None:
        return None
    try:
        return kind.from_message(message)
    except (ProtocolError, TypeError, ValueError):
        return None


def decode_progress(line: str | bytes) -> ProgressRecord | None:
    """One line of a progress file. The job writes the file: a garbled, oversized or hostile line is None."""
    if len(line) > MAX_PROGRESS_LINE:
        return None
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return decode_progress_message(message)


# --- what an agent reports with "running" --------------------------------------------------------------

@dataclass(frozen=True)
class RunningDetails:
    """The details of a "running" JobStatus: where the attempt runs, how it is isolated and limited.

    The console keeps them as the job's runtime_info; `from_details` takes only what it can use of a report.
    """

    host: str = ""
    isolation: JobIsolation | None = None
    gpu_share: str = ""  # how a fractional job's share is held: "mps", "allocator-cap+watch", "watch"
    gpu_memory_limit_mb: int | None = None
    limits: dict[str, Any] | None = None  # the job's cgroup limits (workers/agent/cgroups.py, describe())
    backend: str = "process"  # what ran the attempt: one of CONTAINER_RUNTIMES
    image: str = ""  # the image it ran in (a container backend), as resolved by the runtime (name@digest)

    LIMIT_KEYS: ClassVar[dict[str, type | tuple[type, ...]]] = {
        "applied": bool, "reason": str, "cgroup": str, "cpus": (int, float), "memory_gb": (int, float),
        "pids": int, "devices": str}

    def to_details(self) -> dict[str, Any]:
        details: dict[str, Any] = {"host": self.host}
        if self.isolation is not None:
            details.update(self.isolation.to_details())
        if self.gpu_share:
            details.update(gpu_share=self.gpu_share, gpu_memory_limit_mb=self.gpu_memory_limit_mb)
        if self.limits is not None:
            details["limits"] = self.limits
        details["backend"] = self.backend
        if self.image:
            details["image"] = self.image
        return details

    @classmethod
    def from_details(cls, details: Mapping[str, Any]) -> RunningDetails:
        limit = details.get("gpu_memory_limit_mb")
        return cls(host=_text(details.get("host"), 253), isolation=JobIsolation.from_details(dict(details)),
                   gpu_share=_text(details.get("gpu_share"), 40),
                   gpu_memory_limit_mb=_count(limit),
                   limits=cls._limits(details.get("limits")),
                   backend=backend if (backend := details.get("backend")) in CONTAINER_RUNTIMES else "process",
                   image=_text(details.get("image"), 300))

    @classmethod
    def _limits(cls, value: Any) -> dict[str, Any] | None:
        """The known keys of a cgroup-limits report, scalar values only (strings cut at 300 characters)."""
        if not isinstance(value, dict):
            return None
        return {key: (item[:300] if isinstance(item, str) else item) for key, item in value.items()
                if key in cls.LIMIT_KEYS and (item is None or isinstance(item, cls.LIMIT_KEYS[key]))}

    def runtime_info(self) -> dict[str, Any]:
        """What the console shows of the attempt (runtime_info): the isolation note cut to 500 characters."""
        info = self.to_details()
        info.pop("host")
        if "isolation_note" in info:
            info["isolation_note"] = info["isolation_note"][:500]
        return info

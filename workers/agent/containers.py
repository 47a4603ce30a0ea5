"""The container backend (--runtime podman|docker): a job whose dispatch names an image runs in it.

The container is started by `podman run` (or `docker run`) under the same shim as a process job
(workers/agent/shim.py), so it keeps a process job's guarantees: conmon and the container's processes are
re-parented to the shim (a child subreaper), which SIGTERMs the whole tree on cancel, time limit or preemption,
SIGKILLs it after the grace period, and does the same when the agent dies (kill -9 included). The shim then
removes the container itself if the agent is gone (`--orphan-cleanup`); otherwise the agent reads how it ended
(OOM) and removes it. At start the agent removes whatever containers labelled with its host a previous run left.

Inside: the job's own uid (--user), no capabilities, no-new-privileges, its limits (memory without swap, CPUs,
pids, /dev/shm), its GPUs by UUID only, no network unless it rendezvouses across hosts or serves, its home,
checkpoints, outputs and code at fixed paths, the admin's mounts (only below --volume-root), the job runtime
read-only on PYTHONPATH. The dispatch names the job's secrets only: their values are fetched from the console
(the agent API, host token) just before the container starts. Every variable (secrets included) goes through an
--env-file that lives in memory (a memfd passed down to podman), never on the agent's command line or disk; the
job's output is masked of secret values, and its container is removed when it ends (the agent's shutdown waits
for that), so podman's copy of its configuration does not outlive it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers.agent import codefetch, jobsecrets, volumes
from workers.agent.cgroups import GIB, CgroupSupport, JobCgroup, Limits, format_gb
from workers.agent.masking import SecretMask
from workers.agent.shim import in_memory_file, shim_environment
from workers.protocol import (
    CODE_PATH,
    CONTAINER_CHECKPOINTS,
    CONTAINER_HOME,
    CONTAINER_LABEL_HOST,
    CONTAINER_LABEL_JOB,
    CONTAINER_OUTPUTS,
    JOB_ENV_VARIABLES,
    PROGRESS_FILE_NAME,
    REPLICA_SECRET_ENV,
    REPLICA_SERVER_PORT,
    RUNTIME_MOUNT_PATH,
    Dispatch,
    ImageRecord,
    JobIsolation,
    MountSpec,
)

if TYPE_CHECKING:
    from workers.agent.runner import JobProcess, JobRunner

logger = logging.getLogger("workers.agent")

CONTAINER_PYTHON = "python3"  # the image's interpreter, for builtins and torchrun
CLI_TIMEOUT_S = 60.0
REMOVE_ATTEMPTS = 10
PULL_TIMEOUT_S = float(os.environ.get("GPU_AGENT_PULL_TIMEOUT_S") or 1800)
# The code of the job runtime (workers.runtime and workers/protocol.py, Django-free), bound read-only.
WORKERS_ROOT = Path(__file__).resolve().parents[1]
RUNTIME_FILES = ("__init__.py", "protocol.py", "runtime")
# Variables of the agent's environment a container job gets too (tuning knobs of the collective libraries).
INHERITED_PREFIXES = ("NCCL_", "GLOO_", "OMP_", "MKL_", "OPENBLAS_")
NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")
# A gated replica's files in its attempt's folder (the agent's): the container's pid, the gate's serving record.
GATE_PIDFILE = "container.pid"
GATE_PROGRESS = "replica-gate.jsonl"


def gated(dispatch: Dispatch) -> bool:
    """Whether the job is a replica of a service from a user's image: its own server behind the replica gate."""
    serve = dispatch.workload.get("serve")
    return isinstance(serve, dict) and "command" in serve


class ContainerError(Exception):
    """A container job cannot start; the message is the job's failure reason."""


@dataclass
class ContainerJob:
    """What the agent holds of one job's container."""

    name: str
    image: str
    resolved: str = ""  # name@digest (or the image id) once the image is local
    oom_killed: bool = False
    limits: Limits = field(default_factory=Limits)

    def oom_reason(self) -> str:  # the wording of the process backend (JobCgroup.oom_reason)
        limit = self.limits.memory_bytes
        what = f"its memory limit of {format_gb(limit)}" if limit is not None else "its memory limit"
        return f"out of memory: the job exceeded {what}"


class ContainerRuntime:
    """One host's container CLI (podman or docker), and what the agent does with it."""

    def __init__(self, kind: str, *, volume_roots: tuple[Path, ...] = (), oci_runtime: str = "",
                 simulated: bool = False, gpus: dict[int, tuple[str, int]] | None = None) -> None:
        if kind not in ("podman", "docker"):
            raise ValueError(f"unknown container runtime {kind!r}")
        self.kind = kind
        self.binary = shutil.which(kind) or kind
        self.volume_roots = tuple(Path(os.path.realpath(root)) for root in volume_roots)
        self.oci_runtime = oci_runtime
        self.simulated = simulated
        self.gpus = gpus or {}
        # Each container sits in a cgroup of the agent's that holds the job's limits (--cgroup-parent), so the
        # kernel's OOM kill is counted there, readable after the container is gone, in the process backend's
        # words. At the hierarchy's root: podman's cgroupfs manager takes one path for every v1 controller.
        self.cgroups = CgroupSupport(parent=CGROUP_PARENT, proc_file=Path("/nonexistent"), simulated=simulated)

    # --- the host's images and leftovers

    def _cli(self, *args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=timeout, check=False)

    def available(self) -> str | None:
        """Why this runtime cannot run jobs here, or None."""
        if shutil.which(self.kind) is None:
            return f"{self.kind} is not installed"
        try:
            result = self._cli("version", "--format", "{{.Client.Version}}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{self.kind} does not answer: {exc}"
        return None if result.returncode == 0 else f"{self.kind} version failed: {result.stderr.strip()[:300]}"

    def images(self) -> list[ImageRecord]:
        """The images in the local store (registration; the host page lists them)."""
        try:
            if self.kind == "podman":
                result = self._cli("images", "--format", "json")
                entries = json.loads(result.stdout or "[]") if result.returncode == 0 else []
            else:
                result = self._cli("images", "--format", "{{json .}}")
                entries = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            logger.warning("could not list the %s images: %s", self.kind, exc)
            return []
        return [record for entry in entries if isinstance(entry, dict) for record in _image_records(entry)]

    def remove_leftovers(self, host: str) -> list[str]:
        """Remove every container labelled with `host` (a previous run of this agent left them)."""
        try:
            listed = self._cli("ps", "-a", "--filter", f"label={CONTAINER_LABEL_HOST}={host}", "--format",
                               "{{.Names}}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            logger.warning("could not list leftover containers: %s", exc)
            return []
        names = [line.strip() for line in listed.stdout.splitlines() if line.strip()]
        for name in names:
            self.remove(name)
        if self.cgroups.enabled:  # their job cgroups, and what podman left inside (conmon's)
            for folder in self.cgroups.host_dirs(host).values():
                for job in folder.glob("job-*/"):
                    _remove_cgroup_children(job)
                    with contextlib.suppress(OSError):
                        job.rmdir()
        return names

    def remove(self, name: str) -> None:
        """Remove the container, retrying while the runtime's own cleanup of it (conmon's exit command) holds it."""
        problem = ""
        for attempt in range(REMOVE_ATTEMPTS):
            try:
                result = self._cli(*self.cleanup_argv(name)[1:])
                if result.returncode == 0 or not self.exists(name):
                    return
                problem = result.stderr.strip()[-300:]
            except (OSError, subprocess.TimeoutExpired) as exc:
                problem = str(exc)
            time.sleep(0.2 * (attempt + 1))
        logger.warning("could not remove container %s: %s", name, problem)

    def exists(self, name: str) -> bool:
        try:
            return self._cli("container", "inspect", "--format", "{{.Id}}", name).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return True

    def resolve(self, image: str) -> str:
        """`image` as stored locally (name@digest, or its id); "" when it is not here."""
        try:
            result = self._cli("image", "inspect", "--format", "json" if self.kind == "podman" else "{{json .}}",
                               image)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        if result.returncode != 0:
            return ""
        try:
            data = json.loads(result.stdout)
        except ValueError:
            return ""
        entry = data[0] if isinstance(data, list) and data else data
        if not isinstance(entry, dict):
            return ""
        repository = image.rsplit("@", 1)[0]
        repository = repository.rsplit(":", 1)[0] if ":" in repository.rsplit("/", 1)[-1] else repository
        digests = [d for d in entry.get("RepoDigests") or [] if isinstance(d, str)]
        for digest in digests:
            if digest.split("@", 1)[0] == repository:
                return digest
        return digests[0] if digests else str(entry.get("Id") or "")

    def pull(self, image: str, log: Callable[[str], None], popen: Callable[..., subprocess.Popen[bytes]],
             stopped: Callable[[], bool] = lambda: False) -> None:
        """Pull `image`, streaming the runtime's output into the job's log; ContainerError if it fails, takes
        longer than PULL_TIMEOUT_S, or the job is stopped meanwhile."""
        log(f"[agent] pulling {image} ...\n")
        process = popen([self.binary, "pull", image], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT)
        done = threading.Event()

        def watch() -> None:
            deadline = time.monotonic() + PULL_TIMEOUT_S
            while not done.wait(0.5):
                if stopped() or time.monotonic() > deadline:
                    process.kill()
                    return

        threading.Thread(target=watch, name=f"pull-{image}", daemon=True).start()
        last = ""
        try:
            assert process.stdout is not None
            for raw in process.stdout:
                line = raw.decode("utf-8", "replace").rstrip()
                if line:
                    last = line
                    log(f"[agent] pulling {image}: {line}\n")
            code = process.wait()
        finally:
            done.set()
        if code != 0:
            raise ContainerError(f"image not found: {image} ({self.kind} pull: {last or f'exit code {code}'})")

    def oom_killed(self, name: str) -> bool:
        try:
            result = self._cli("inspect", "--format", "{{.State.OOMKilled}}", name)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.stdout.strip() == "true"

    # --- one job

    def adopt(self, job: JobProcess, runner: JobRunner) -> None:
        """Make `job` a container job: its container's name, its home (bound at CONTAINER_HOME), its uid."""
        dispatch = job.dispatch
        from workers.agent.runner import RunAs  # the runner imports this module

        host = NAME_UNSAFE.sub("-", dispatch.host)
        job.container = ContainerJob(
            name=f"gpu-console-{host}-job-{dispatch.job_id}-{dispatch.attempt}", image=dispatch.container.image,
            resolved=self.resolve(dispatch.container.image),
            limits=Limits.of(dispatch.cpus, dispatch.memory_gb))
        job.home = job.workdir / "home"
        if job.user is None:  # never root inside: the --run-as user, else a uid no account uses
            job.user = runner.run_as or RunAs.job_user(CONTAINER_FALLBACK_UID, None)

    def isolation(self, job: JobProcess, own_uid: bool) -> JobIsolation:
        assert job.user is not None
        return JobIsolation("own-uid" if own_uid else "shared-user", job.user.uid, private_view=True)

    def describe_limits(self, dispatch: Dispatch) -> dict[str, Any]:
        limits = Limits.of(dispatch.cpus, dispatch.memory_gb)
        where = f"{self.cgroups.layout.version} (its parent)" if self.cgroups.enabled else f"{self.kind}'s own"
        return {"applied": True, "cgroup": where, **limits.describe(),
                "devices": "simulated GPUs: none passed" if self.simulated else "only its GPUs, passed by UUID"}

    def cgroup(self, dispatch: Dispatch) -> JobCgroup | None:
        """The job's parent cgroup with its limits (None: cgroups are off; podman's own flags hold them)."""
        return self.cgroups.job(dispatch.host, dispatch.job_id, dispatch.attempt,
                                Limits.of(dispatch.cpus, dispatch.memory_gb))

    def prepare(self, job: JobProcess, runner: JobRunner, log: Callable[[str], None]) -> list[list[str]]:
        """Everything before the container starts: mounts checked, code fetched, image pulled. Returns the
        `run` options of the job's own binds. Raises ContainerError."""
        spec = job.dispatch.container
        assert job.container is not None and job.home is not None and job.user is not None
        binds = [_bind(job.home, CONTAINER_HOME, read_only=False)]
        for folder, target in zip(runner._artifact_folders(job), (CONTAINER_CHECKPOINTS, CONTAINER_OUTPUTS),
                                  strict=True):
            folder.mkdir(parents=True, exist_ok=True)
            binds.append(_bind(folder, target, read_only=False))
        binds += [_bind(WORKERS_ROOT / name, f"{RUNTIME_MOUNT_PATH}/workers/{name}", read_only=True)
                  for name in RUNTIME_FILES]
        binds += [self._admin_mount(mount, runner.runs_jobs_as) for mount in spec.mounts]
        if spec.code is not None:
            code = job.workdir / "code"
            try:
                runner.fetch_code(job, code)
            except codefetch.CodeError as exc:
                raise ContainerError(str(exc)) from None
            binds.append(_bind(code, CODE_PATH, read_only=False))
        if not job.container.resolved:
            self.pull(spec.image, log, runner._launcher.popen, stopped=lambda: job.stop_state is not None)
            job.container.resolved = self.resolve(spec.image) or spec.image
        log(f"[agent] image {spec.image} ({job.container.resolved}), {self.kind} container {job.container.name}\n")
        return binds

    def _admin_mount(self, mount: MountSpec, runs_jobs_as: Callable[[int], bool]) -> list[str]:
        try:
            bind = volumes.resolve(mount, self.volume_roots, runs_jobs_as)
        except volumes.VolumeError as exc:
            raise ContainerError(str(exc)) from None
        return _bind(bind.source, str(bind.target), read_only=bind.read_only)

    def secrets(self, job: JobProcess, runner: JobRunner) -> dict[str, str]:
        """The values of the secrets the dispatch names, fetched now from the console; ContainerError if it
        refuses or cannot be reached, or leaves one out."""
        try:
            return jobsecrets.fetch(runner.client, job.dispatch)
        except jobsecrets.SecretsError as exc:
            raise ContainerError(str(exc)) from None

    def environment(self, job: JobProcess, runner: JobRunner, secrets: dict[str, str]) -> dict[str, str]:
        """The variables inside the container: plain env, the job's CONSOLE_* at container paths, secrets."""
        spec = job.dispatch.container
        env = {k: v for k, v in os.environ.items() if k.startswith(INHERITED_PREFIXES)}
        env.update({k: v for k, v in spec.env.items() if k not in JOB_ENV_VARIABLES})
        env.update(HOME=CONTAINER_HOME, PYTHONUNBUFFERED="1",
                   PYTHONPATH=":".join(filter(None, [spec.env.get("PYTHONPATH", ""), RUNTIME_MOUNT_PATH])))
        count = len(job.dispatch.gpu_indices)
        own = replace(runner.job_environment(job), progress_file=Path(CONTAINER_HOME) / PROGRESS_FILE_NAME,
                      checkpoint_dir=Path(CONTAINER_CHECKPOINTS), output_dir=Path(CONTAINER_OUTPUTS),
                      visible_devices=tuple(str(i) for i in range(count)))
        if gated(job.dispatch):  # the gate holds the replica's secret; the server only learns its port
            own = replace(own, replica_secret="", serve_port=REPLICA_SERVER_PORT)
        env.update(own.to_env())
        env.update({k: v for k, v in secrets.items() if k not in JOB_ENV_VARIABLES})
        return env

    def run_argv(self, job: JobProcess, binds: list[list[str]], env_path: str, command: list[str]) -> list[str]:
        dispatch, spec = job.dispatch, job.dispatch.container
        assert job.container is not None and job.user is not None
        limits = job.container.limits
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        nproc = min(limits.pids or 4096, resource.getrlimit(resource.RLIMIT_NPROC)[0])
        # A gated replica's server has no network: only its gate reaches it, inside its network namespace.
        network = ("none" if gated(dispatch) else
                   "host" if dispatch.rendezvous is not None or "serve" in dispatch.workload else "none")
        argv = [self.binary, *(["--runtime", self.oci_runtime] if self.oci_runtime else []), "run",
                "--name", job.container.name, "--label", f"{CONTAINER_LABEL_HOST}={dispatch.host}",
                "--label", f"{CONTAINER_LABEL_JOB}={dispatch.job_id}", "--init", "--pull", "never",
                "--user", f"{job.user.uid}:{job.user.gid}", "--cap-drop", "all",
                "--security-opt", "no-new-privileges", "--network", network,
                "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}",
                "--env-file", env_path, "--workdir", CODE_PATH if spec.code is not None else CONTAINER_HOME]
        if self.kind == "podman":
            argv += ["--log-driver", "passthrough"]  # the job writes straight into the agent's pipe
        elif network == "none":
            # docker leaves the container's host name out of /etc/hosts without a network (podman writes it), and
            # gloo/c10d resolve it: torchrun in such a container would hang.
            hostname = f"job-{dispatch.job_id}"
            argv += ["--hostname", hostname, "--add-host", f"{hostname}:127.0.0.1"]
        if gated(dispatch):
            argv += ["--pidfile", str(job.workdir / GATE_PIDFILE)]
        if job.cgroup is not None:
            argv += ["--cgroup-parent", "/" + str(next(iter(job.cgroup.dirs.values())).relative_to(
                self.cgroups.layout.mounts.get("memory") or self.cgroups.layout.root))]
        else:  # no cgroup of the agent's: the runtime's own flags set the same limits on the container
            if limits.pids:
                argv += ["--pids-limit", str(limits.pids)]
            if limits.memory_bytes:
                argv += ["--memory", f"{limits.memory_bytes}b", "--memory-swap", f"{limits.memory_bytes}b"]
            if limits.cpus:
                argv += ["--cpus", f"{limits.cpus:g}"]
        if spec.shm_gb:
            argv += ["--shm-size", f"{max(1, int(spec.shm_gb * GIB / 2**20))}m"]
        argv += self.gpu_options(dispatch)
        for bind in binds:
            argv += bind
        return [*argv, spec.image, *command]

    def gpu_options(self, dispatch: Dispatch) -> list[str]:
        if self.simulated:
            return []
        uuids = [self.gpus[i][0] for i in dispatch.gpu_indices if i in self.gpus]
        if self.kind == "podman":
            return [arg for uuid in uuids for arg in ("--device", f"nvidia.com/gpu={uuid}")]
        return ["--gpus", f'"device={",".join(uuids)}"'] if uuids else []

    def launch(self, job: JobProcess, runner: JobRunner, argv: list[str],
               log: Callable[[str], None]) -> tuple[list[str], dict[str, str], int]:
        """The shim's argv and environment that start `argv` in the container, and the fd of its variables (the
        shim inherits it; the caller closes it once the shim is started)."""
        assert job.container is not None
        binds = self.prepare(job, runner, log)
        job.cgroup = self.cgroup(job.dispatch)  # removed by the runner when the job ends, as a process job's
        secrets = self.secrets(job, runner)  # last, just before the start: the values live no longer than needed
        job.mask = SecretMask(secrets.values())  # before any output of the job is read
        env = self.environment(job, runner, secrets)
        for name, value in env.items():
            if "\n" in value or "\r" in value or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ContainerError(f"variable {name!r} cannot be passed to the container (a bad name, or a "
                                     "line break in its value)")
        # In memory only: a memfd podman reads through /dev/fd, inherited by the shim and podman alone.
        fd = in_memory_file("".join(f"{k}={v}\n" for k, v in env.items()).encode())
        run = self.run_argv(job, binds, f"/dev/fd/{fd}", argv)
        cleanup = json.dumps(self.cleanup_argv(job.container.name))
        shim = [runner.python, "-m", "workers.agent.shim", "--grace", str(runner.grace_s),
                "--stop-file", str(job.workdir / "stop-grace"), "--orphan-cleanup", cleanup, "--"]
        host_env = shim_environment()
        if gated(job.dispatch):
            run = self.gate_argv(job, runner) + run
            host_env[REPLICA_SECRET_ENV] = job.dispatch.replica_secret  # the gate's alone: it drops it at once
            job.progress_file = job.workdir / GATE_PROGRESS
        return [*shim, *run], host_env, fd

    def gate_argv(self, job: JobProcess, runner: JobRunner) -> list[str]:
        """The replica gate's argv before `podman run`: on the host's registered address, under the job's uid."""
        assert job.user is not None
        if self.kind != "podman":
            raise ContainerError("a service from an image runs on podman hosts only (its gate reads the "
                                 "container's pid from podman's --pidfile)")
        return [runner.python, "-m", "workers.agent.replica_gate", "--listen", runner.address or "127.0.0.1",
                "--pidfile", str(job.workdir / GATE_PIDFILE), "--progress", str(job.workdir / GATE_PROGRESS),
                "--uid", str(job.user.uid), "--gid", str(job.user.gid), "--"]

    def cleanup_argv(self, name: str) -> list[str]:
        return [self.binary, "rm", "-f", *(["-t", "0"] if self.kind == "podman" else []), name]

    def read_end(self, container: ContainerJob, cgroup: JobCgroup | None, returncode: int) -> None:
        """How the container ended (an OOM kill?): what the final report needs of it."""
        container.oom_killed = self.oom_killed(container.name) or _hit_memory_limit(cgroup, returncode)

    def clean_up(self, container: ContainerJob, cgroup: JobCgroup | None) -> None:
        """Remove the ended container (after its end is reported: podman may take seconds on a busy host)."""
        self.remove(container.name)
        if cgroup is not None:  # conmon's cgroup inside the job's, and the container's should podman leave it
            for folder in cgroup.dirs.values():
                _remove_cgroup_children(folder)


CGROUP_PARENT = "gpu-agent-containers"
# A job's uid inside its container when the agent hands out none (--job-uids off and no --run-as).
CONTAINER_FALLBACK_UID = 1_610_099_999


def _remove_cgroup_children(folder: Path) -> None:
    for child in sorted(folder.glob("**/"), key=lambda path: len(path.parts), reverse=True):
        if child != folder:
            with contextlib.suppress(OSError):
                child.rmdir()


def _hit_memory_limit(cgroup: JobCgroup | None, returncode: int) -> bool:
    """cgroup v1: the kernel counts an OOM kill in the container's own cgroup (gone with it), not in the job's
    parent whose limit it hit. Killed by SIGKILL with the parent's peak usage at its limit stands for it."""
    if cgroup is None or cgroup.version != "v1" or cgroup.limits.memory_bytes is None:
        return False
    if returncode not in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return False
    try:
        peak = int((cgroup.dirs["memory"] / "memory.max_usage_in_bytes").read_text())
    except (KeyError, OSError, ValueError):
        return False
    return peak >= cgroup.limits.memory_bytes - 64 * 1024


def _bind(source: Path, target: str, *, read_only: bool) -> list[str]:
    if "," in str(source) or "," in target:
        raise ContainerError(f"cannot bind {source} at {target}: a comma in a path")
    return ["--mount", f"type=bind,src={source},dst={target}" + (",ro=true" if read_only else "")]


_DOCKER_SIZE_UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def _docker_size_mb(text: str) -> int:
    """MiB of docker's human-readable size ("235MB", "1.2GB": decimal units); 0 when unreadable."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([kKMGT]?B)\s*", text)
    if match is None or match.group(2) not in _DOCKER_SIZE_UNITS:
        return 0
    return int(float(match.group(1)) * _DOCKER_SIZE_UNITS[match.group(2)]) // 2**20


def _image_records(entry: dict[str, Any]) -> list[ImageRecord]:
    """One listing entry of `podman images --format json` or `docker images --format '{{json .}}'`."""
    image_id = str(entry.get("Id") or entry.get("ID") or "")
    size = entry.get("Size")
    size_mb = int(size) // 2**20 if isinstance(size, int) else _docker_size_mb(str(size or ""))
    created = entry.get("Created") or entry.get("CreatedAt") or ""
    if isinstance(created, int):  # podman: seconds since the epoch
        created = datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="seconds")
    else:  # docker: "2026-12-03 11:40:36 +0000 UTC"
        with contextlib.suppress(ValueError):
            created = datetime.strptime(str(created)[:25], "%Y-%m-%d %H:%M:%S %z").astimezone(UTC).isoformat(
                timespec="seconds")
    names = entry.get("Names") or ([f"{entry['Repository']}:{entry.get('Tag', '')}"]
                                  if entry.get("Repository") not in (None, "<none>") else [])
    return [ImageRecord(name=str(name), id=image_id, size_mb=size_mb, created=str(created)[:40])
            for name in (names or [image_id])]

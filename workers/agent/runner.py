"""Runs jobs on this host: one process group per job, on exactly its GPUs, with its preset, logs streamed.

A job's life here: claim it from the console (a redelivered dispatch is refused there), launch it in its own
process group, pump its output and progress to the console, enforce its time limit, and report how it ended.
Every job process is started by one long-lived launcher thread with PR_SET_PDEATHSIG, so that if the agent
dies (even by kill -9) the kernel kills the jobs it started rather than leaving them on the GPUs.

With a run-as user (--run-as), the agent runs as root and each job's own processes run as that user: the shim
that supervises the job stays the agent's user (so a job can neither signal it nor escape it), and the job gets
a private work directory (0700, owned by the run-as user, under folders it cannot list). The agent's own files
of the job (command, pid, output log, stop request) sit one level up, owned by the agent, 0600, where the job
cannot read, replace or redirect them.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import errno
import json
import logging
import os
import pwd
import queue
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from workers.agent import codefetch, jobsecrets, volumes
from workers.agent.cgroups import CgroupSupport, JobCgroup, denied_device_nodes
from workers.agent.client import ConsoleClient, ConsoleRejected, transient
from workers.agent.containers import CONTAINER_PYTHON, ContainerError, ContainerJob, ContainerRuntime
from workers.agent.logsender import CHUNK_CHARS, LogSender
from workers.agent.masking import SecretMask
from workers.agent.progress import forwarded
from workers.agent.sandbox import FilesystemView, ViewError, plan_view
from workers.agent.sharing import MpsControl, ShareLimits, reshared_limits, share_limits
from workers.agent.shim import in_memory_file, shim_environment
from workers.protocol import (
    JOB_ENV_VARIABLES,
    PROGRESS_FILE_NAME,
    Dispatch,
    JobEnvironment,
    JobIsolation,
    JobStatus,
    ResultRecord,
    RunningDetails,
    decode_progress,
    job_api_url,
)
from workers.runtime.artifacts import LocalArtifactStore

logger = logging.getLogger("workers.agent")

PR_SET_PDEATHSIG = 1
LOG_FLUSH_INTERVAL_S = 0.5
SHUTDOWN_CLEANUP_S = 5.0  # past the grace period, what a stopped container's removal may take at shutdown
# At a job's end its output still queued for the console is sent before the end is reported; a console that takes
# nothing for this long is given up on (the log artifact keeps everything).
LOG_END_IDLE_S = 15.0
STOPPING_MARGIN_S = 15.0  # past the grace, how long a start waits for a stopping job on its GPUs (a hung shim)
PROGRESS_INTERVAL_S = 1.0
PROGRESS_READ_MAX = 1024 * 1024
PROGRESS_END_READS = 16  # reads of the progress file at a job's end, each PROGRESS_READ_MAX at most
# Output kept per job attempt (local output.log, and what is forwarded to the console); the rest is drained and
# dropped so the job keeps running. Above the console's own cap (CONSOLE_JOB_LOG_MAX_CHARS, 10M by default).
LOG_MAX_CHARS = 20_000_000
PYTHON_NAMES = {"python", "python3", "python3.11", "python3.12"}
# The code jobs run (workers.runtime): a checkout with an editable install, or site-packages.
CODE_ROOT = Path(__file__).resolve().parents[2]
# What a job inherits of the agent's environment: these names and prefixes only (an allow-list: the agent's
# environment holds secrets such as its token, the broker's URL and, under `make run`, the console's own settings).
# `--pass-env NAME` adds names.
JOB_ENV_NAMES = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "PYTHONPATH", "PYTHONHASHSEED"})
JOB_ENV_PREFIXES = ("LC_", "NCCL_", "GLOO_", "OMP_", "MKL_", "OPENBLAS_", "CUBLAS_", "NVIDIA_DRIVER_")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class RunAs:
    """The unprivileged user job processes run as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def lookup(cls, name: str) -> RunAs:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise SystemExit(f"gpu-agent: --run-as {name}: no such user on this host") from None
        if entry.pw_uid == 0:
            raise SystemExit(f"gpu-agent: --run-as {name}: must name an unprivileged user, not uid 0")
        return cls(name, entry.pw_uid, entry.pw_gid, tuple(os.getgrouplist(name, entry.pw_gid)))

    @classmethod
    def job_user(cls, uid: int, base: RunAs | None) -> RunAs:
        """A job's own uid with a private group of the same number, and the --run-as user's groups if any."""
        return cls(f"{base.name if base else 'job'}-{uid}", uid, uid, base.groups if base else ())

    def shim_options(self) -> list[str]:
        return ["--uid", str(self.uid), "--gid", str(self.gid), "--groups", ",".join(map(str, self.groups))]

    def can_search(self, folder: Path) -> bool:
        """Whether this user may traverse `folder` (the owner, group or other x bit that applies to it)."""
        info = folder.stat()
        if info.st_uid == self.uid:
            return bool(info.st_mode & stat.S_IXUSR)
        if info.st_gid == self.gid or info.st_gid in self.groups:
            return bool(info.st_mode & stat.S_IXGRP)
        return bool(info.st_mode & stat.S_IXOTH)


class JobUids:
    """A range of user ids with no account, one per running job (--job-uids), handed out round robin.

    Jobs under one shared user could read each other's files through /proc/PID/cwd and signal each other's
    processes; under uids of their own they cannot. Round robin: a uid is reused as late as possible.
    """

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self._next = first
        self._in_use: set[int] = set()
        self._lock = threading.Lock()

    @classmethod
    def parse(cls, text: str) -> JobUids:
        try:
            first, last = (int(part) for part in text.split("-"))
        except ValueError:
            raise SystemExit(f"gpu-agent: --job-uids {text}: expected FIRST-LAST, e.g. 200000-200999") from None
        if not 0 < first <= last:
            raise SystemExit(f"gpu-agent: --job-uids {text}: expected 0 < FIRST <= LAST")
        taken = sorted(entry.pw_name for entry in pwd.getpwall() if first <= entry.pw_uid <= last)
        if taken:
            raise SystemExit(f"gpu-agent: --job-uids {text}: the range holds the accounts {', '.join(taken)}; "
                             "choose uids no account uses")
        return cls(first, last)

    def take(self) -> int:
        with self._lock:
            for _ in range(self.last - self.first + 1):
                uid, self._next = self._next, self._next + 1 if self._next < self.last else self.first
                if uid not in self._in_use:
                    self._in_use.add(uid)
                    return uid
        raise OSError(errno.EAGAIN, f"all {self.last - self.first + 1} job uids are in use")

    def give_back(self, uid: int) -> None:
        with self._lock:
            self._in_use.discard(uid)


def resolve_run_as(name: str | None) -> RunAs | None:
    """The --run-as user, checked at start-up: the agent must be root to start jobs as another user."""
    if not name:
        return None
    if os.geteuid() != 0:
        raise SystemExit(f"gpu-agent: --run-as {name} (CONSOLE_AGENT_RUN_AS) needs the agent to run as root, to "
                         f"start jobs as that user; this agent runs as uid {os.geteuid()}. Start the agent as "
                         "root, or drop --run-as to run jobs as the agent's own user.")
    return RunAs.lookup(name)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode}"


def exit_code_of(returncode: int) -> int:
    """Shell convention: a process killed by signal N exits with 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Launcher:
    """One thread starts every job process, so PDEATHSIG ties them to the agent's life, not a worker thread's."""

    _requests: queue.Queue[tuple[list[str], dict[str, Any], queue.Queue[Any]]] = field(default_factory=queue.Queue)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="job-launcher", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            argv, options, reply = self._requests.get()
            try:
                reply.put(subprocess.Popen(argv, preexec_fn=_die_with_parent, **options))  # noqa: PLW1509
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                reply.put(exc)

    def popen(self, argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
        if self._thread is None:
            self.start()
        reply: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._requests.put((argv, options, reply))
        result = reply.get()
        if isinstance(result, BaseException):
            raise result
        process: subprocess.Popen[bytes] = result
        return process


@dataclass
class JobProcess:
    dispatch: Dispatch
    workdir: Path
    process: subprocess.Popen[bytes] | None = None
    # Set when the agent stops the job: the state to report and why.
    stop_state: str | None = None
    stop_reason: str = ""
    timer: threading.Timer | None = None
    limits: ShareLimits | None = None
    # The job's own folder (cwd, HOME, progress file). `workdir` itself without a run-as user; with one, a
    # private folder inside it, so the agent's files in `workdir` stay out of the job's reach.
    home: Path | None = None
    # Who the job's processes run as: the --run-as user, or a uid of its own (--job-uids); None: the agent.
    user: RunAs | None = None
    # A replica's weights (another job's artifact), staged in its home where its uid can read them.
    checkpoint: Path | None = None
    cgroup: JobCgroup | None = None  # its memory, CPU and process limits (workers/agent/cgroups.py)
    container: ContainerJob | None = None  # a job in an image (workers/agent/containers.py)
    progress_file: Path | None = None  # where its progress is read, if not its home's progress file
    log: LogSender | None = None  # its output on the way to the console (from the start of its thread)
    mask: SecretMask | None = None  # its secrets' values, masked in its output (set before its process starts)
    # Set once its process tree has exited (the shim reaps it all): the GPUs it used are free again.
    exited: threading.Event = field(default_factory=threading.Event)
    # Set once its processes are gone and its container removed (the agent's shutdown waits for it).
    ended: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if self.home is None:
            self.home = self.workdir

    @property
    def key(self) -> tuple[int, int]:
        return (self.dispatch.job_id, self.dispatch.attempt)

    @property
    def node_rank(self) -> int:
        return self.dispatch.rendezvous.node_rank if self.dispatch.rendezvous else 0


class JobRunner:
    def __init__(
        self,
        client: ConsoleClient,
        *,
        work_root: Path,
        artifacts_root: Path,
        python: str = sys.executable,
        simulated: bool = False,
        grace_s: float = 5.0,
        preempt_grace_s: float = 60.0,
        on_attach: Callable[[JobProcess], None] | None = None,
        on_detach: Callable[[JobProcess], None] | None = None,
        gpus: dict[int, tuple[str, int]] | None = None,
        mps: bool = False,
        address: str = "",
        run_as: RunAs | None = None,
        job_uids: JobUids | None = None,
        log_max_chars: int | None = None,
        private_paths: tuple[Path, ...] = (),
        mask_paths: tuple[Path, ...] = (),
        pass_env: tuple[str, ...] = (),
        console_url: str = "",
        containers: ContainerRuntime | None = None,
        volume_roots: tuple[Path, ...] = (),
    ) -> None:
        self.client = client
        self.work_root = work_root
        self.artifacts_root = artifacts_root
        self.python = python
        self.simulated = simulated
        self.grace_s = grace_s
        self.preempt_grace_s = preempt_grace_s
        self.on_attach = on_attach
        self.on_detach = on_detach
        self._jobs: dict[tuple[int, int], JobProcess] = {}
        self._lock = threading.Lock()
        self._launcher = Launcher()
        self.run_as = run_as
        self.job_uids = job_uids
        self.log_max_chars = log_max_chars or int(os.environ.get("GPU_AGENT_LOG_MAX_CHARS") or LOG_MAX_CHARS)
        # Jobs under another user get a filesystem view of their own (the agent is root: it can build one).
        self.switches_user = run_as is not None or job_uids is not None
        self.private_paths = (work_root, artifacts_root, *private_paths)
        self.mask_paths = mask_paths
        self.pass_env = frozenset(pass_env)
        self.console_url = console_url
        self.work_root.mkdir(parents=True, exist_ok=True)
        self.work_root.chmod(0o700)
        # GPU index -> (uuid, memory MiB), for fractional jobs' limits.
        self.gpus = gpus or {}
        self.mps = MpsControl(work_root, enabled=mps)
        # The address other hosts reach this one at: torchrun advertises it to the other nodes' workers.
        self.address = address
        self.cgroups = CgroupSupport(simulated=simulated)
        self.containers = containers  # --runtime podman|docker; None: every job runs as processes
        self.volume_roots = volume_roots  # where the admin's volumes may come from (--volume-root)

    # --- what the console asks for

    def running(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(self._jobs)

    def job_roots(self) -> dict[int, int]:
        """pid of each running job's shim -> job id."""
        with self._lock:
            return {job.process.pid: job.dispatch.job_id for job in self._jobs.values() if job.process}

    def start(self, dispatch: Dispatch) -> str:
        """Start a dispatched job. Returns "started", "duplicate", "refused" or "busy" (no job uid free); never
        raises for a bad job."""
        job = JobProcess(dispatch, self._workdir(dispatch))
        if self.switches_user:
            job.home = job.workdir / f"work-{secrets.token_hex(8)}"  # not guessable from the job id
            job.user = self.run_as
        index = dispatch.gpu_indices[0] if dispatch.gpu_indices else 0
        job.limits = share_limits(dispatch, self.gpus.get(index, ("", 0))[1], mps=self.mps.enabled,
                                  simulated=self.simulated)
        with self._lock:
            if job.key in self._jobs:
                return "duplicate"
            self._jobs[job.key] = job  # listed in heartbeats from now on, so the console never sees it missing
        if self.job_uids is not None:
            try:
                job.user = RunAs.job_user(self.job_uids.take(), self.run_as)
            except OSError as exc:
                # Not reported as started: the console sends the dispatch again (CONSOLE_REDISPATCH_AFTER_S).
                logger.error("job %s not started: %s", dispatch.job_id, exc)
                self._forget(job)
                return "busy"
        if dispatch.container.image and self.containers is not None:
            self.containers.adopt(job, self)
        try:
            reply = self.client.report(
                dispatch.job_id,
                JobStatus.running(dispatch.attempt, RunningDetails(
                    host=dispatch.host,
                    isolation=self.isolation(job),
                    gpu_share=job.limits.mechanism if job.limits else "",
                    gpu_memory_limit_mb=job.limits.memory_mb if job.limits else None,
                    limits=(self.containers.describe_limits(dispatch) if self.containers and job.container
                            else self.cgroups.describe(dispatch)),
                    backend=self.containers.kind if self.containers and job.container else "process",
                    image=job.container.resolved or job.container.image if job.container else "",
                ), node_rank=job.node_rank),
                attempts=5,
            )
        except ConsoleRejected as exc:
            logger.info("job %s attempt %s not started: %s", dispatch.job_id, dispatch.attempt, exc)
            self._forget(job)
            return "refused"
        except Exception:
            self._forget(job)
            raise  # the broker redelivers the message (acks_late) and the claim is tried again
        if not reply.get("accepted"):
            logger.info("job %s attempt %s: dispatch already handled (%s)", dispatch.job_id, dispatch.attempt,
                        reply.get("state"))
            self._forget(job)
            return "duplicate"
        threading.Thread(target=self._run, args=(job,), name=f"job-{dispatch.job_id}", daemon=True).start()
        return "started"

    def stop(self, job_id: int, attempt: int | None, reason: str, *, state: str = "stopped") -> bool:
        """Stop a job's whole process group: SIGTERM, then SIGKILL after the grace period."""
        with self._lock:
            matches = [job for key, job in self._jobs.items() if key[0] == job_id and attempt in (None, key[1])]
        for job in matches:
            if job.stop_state is None:
                job.stop_state, job.stop_reason = state, reason
            self._terminate(job, self._grace(state))
        return bool(matches)

    def reshare(self, job_id: int, attempt: int, share: float) -> bool:
        """A running job's share of its one GPU changed (workers.protocol.RESHARE_JOB_TASK): the memory watch holds
        it to the new share from now on."""
        with self._lock:
            job = self._jobs.get((job_id, attempt))
            if job is None or len(job.dispatch.gpu_indices) != 1:
                return False
            memory = self.gpus.get(job.dispatch.gpu_indices[0], ("", 0))[1]
            job.limits = reshared_limits(job.limits, share, memory)
        logger.info("job %s: now holds %.2f of its GPU (memory watch at %s MiB)", job_id, share,
                    job.limits.memory_mb if job.limits else "none")
        return True

    def shutdown(self, reason: str = "the agent shut down", wait_s: float | None = None) -> None:
        """Stop every job, then wait (the grace period and a few seconds, or `wait_s`) until each one's processes
        are gone and its container removed: the agent must not exit before it has removed a container it ran."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            self.stop(job.dispatch.job_id, job.dispatch.attempt, reason, state="failed")
        deadline = time.monotonic() + (self.grace_s + SHUTDOWN_CLEANUP_S if wait_s is None else wait_s)
        for job in jobs:
            if job.process is not None and not job.ended.wait(max(0.0, deadline - time.monotonic())):
                logger.warning("job %s: still ending when the agent stopped waiting", job.dispatch.job_id)

    # --- one job

    def _workdir(self, dispatch: Dispatch) -> Path:
        return self.work_root / f"job-{dispatch.job_id}" / f"attempt-{dispatch.attempt}"

    def _forget(self, job: JobProcess) -> None:
        with self._lock:
            self._jobs.pop(job.key, None)
        if self._has_own_uid(job):
            assert self.job_uids is not None and job.user is not None
            self.job_uids.give_back(job.user.uid)

    def _make_dirs(self, job: JobProcess) -> None:
        job.workdir.mkdir(parents=True, exist_ok=True)
        for folder in (job.workdir.parent, job.workdir):  # job-N/attempt-M: the agent's alone
            folder.chmod(0o700)
        user = job.user
        if user is None:
            return
        assert job.home is not None
        for folder in (job.home, job.home / "tmp"):  # its own temporary folder too (TMPDIR)
            folder.mkdir(mode=0o700)
            os.chown(folder, user.uid, user.gid)
            folder.chmod(0o700)
        # The job writes its checkpoints and outputs itself: give it those two folders of its artifacts, with
        # what earlier attempts left there (a resumed attempt may run under another uid).
        try:
            for folder in self._artifact_folders(job):
                folder.mkdir(parents=True, exist_ok=True)
                _own_by_store(folder.parent, self._store_gid())
                # The job's to write; readable by the store's group (the console serves them while it runs).
                _chown_tree(folder, user.uid, self._store_gid())
                folder.chmod(0o2750)
        except OSError as exc:
            logger.warning("job %s: could not give %s its artifact folders: %s", job.dispatch.job_id, user.name,
                           exc)
        serve = job.dispatch.workload.get("serve")
        if isinstance(serve, dict) and serve.get("checkpoint"):
            job.checkpoint = self._stage_checkpoint(str(serve["checkpoint"]), job.home / "inputs", user)

    def _stage_checkpoint(self, checkpoint: str, folder: Path, user: RunAs) -> Path:
        """Copy `<job id>/<path>` of the artifact store where the job's uid can read it (the store's files are the
        agent's, 0640), through the store's own reads: never through a link."""
        job_id, _, relpath = checkpoint.partition("/")
        folder.mkdir(mode=0o700)
        target = LocalArtifactStore(self.artifacts_root).get_to(job_id, relpath, folder / Path(relpath).name)
        for path in (folder, target):
            os.chown(path, user.uid, user.gid)
        target.chmod(0o600)
        return target

    def _artifact_folders(self, job: JobProcess) -> list[Path]:
        return [self.artifacts_root / str(job.dispatch.job_id) / name for name in ("checkpoints", "outputs")]

    def _has_own_uid(self, job: JobProcess) -> bool:
        """Whether the job runs under a uid of its own (--job-uids), not the shared --run-as user."""
        return self.job_uids is not None and job.user is not None and job.user is not self.run_as

    def runs_jobs_as(self, uid: int) -> bool:
        """Whether jobs run as user `uid` here (a --job-uids uid or the --run-as user)."""
        in_range = self.job_uids is not None and self.job_uids.first <= uid <= self.job_uids.last
        return in_range or (self.run_as is not None and uid == self.run_as.uid)

    @property
    def process_isolation(self) -> str:
        """How this agent keeps its process jobs apart (a JobIsolation mode), as it registers it."""
        if self.job_uids is not None:
            return "own-uid"
        return "shared-user" if self.run_as is not None else "agent-user"

    def isolation(self, job: JobProcess) -> JobIsolation:
        if job.container is not None and self.containers is not None:
            return self.containers.isolation(job, self._has_own_uid(job))
        if job.user is None:
            return JobIsolation("agent-user", os.geteuid(), private_view=False)
        return JobIsolation("own-uid" if self._has_own_uid(job) else "shared-user", job.user.uid, private_view=True)

    def view(self, job: JobProcess, binds: list[volumes.Bind] | None = None) -> FilesystemView:
        """What the job sees of this host's files (see workers/agent/sandbox.py), with the volumes `binds`."""
        assert job.user is not None and job.home is not None
        readable = [Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(self.python)).parent.parent,
                    CODE_ROOT, *(Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
        if job.limits is not None and job.limits.mechanism == "mps":  # the MPS daemons' pipes, under the work root
            readable += [self.mps.pipe_directory(self.gpus[index][0]) for index in job.dispatch.gpu_indices
                         if index in self.gpus]
        # Other GPUs' device nodes: the job cannot open them even if it unsets CUDA_VISIBLE_DEVICES.
        others = [node.path for node in denied_device_nodes(job.dispatch.gpu_indices)]
        try:
            # The volume roots too: a job reaches a volume only where it is bound, by name, never at its host path.
            return plan_view(writable=[job.home, *self._artifact_folders(job)], readable=readable,
                             private=[*self.private_paths, *self.volume_roots], mask=[*self.mask_paths, *others],
                             can_search=job.user.can_search, runs_jobs_as=self.runs_jobs_as,
                             binds=[(b.source, b.target, b.read_only) for b in binds or []])
        except ViewError as exc:
            raise volumes.VolumeError(f"a volume cannot be bound here: {exc}") from None

    def _reclaim(self, job: JobProcess) -> None:
        """Take back what a job under another user left behind: before its uid can go to another job, and so that
        its artifacts are the agent's (readable by the store's group) once it has ended."""
        if job.user is None or job.home is None:
            return
        for folder in [job.home, *self._artifact_folders(job)]:
            try:
                if folder.exists():
                    # Artifacts: the agent's, readable by the artifact store's group (the console reads them).
                    store = folder != job.home
                    _chown_tree(folder, os.geteuid(), self._store_gid() if store else os.getegid(),
                                modes=(0o2750, 0o640) if store else (0o700, 0o600))
            except OSError as exc:
                logger.warning("job %s: could not take back %s from uid %s: %s", job.dispatch.job_id, folder,
                               job.user.uid, exc)

    def _run(self, job: JobProcess) -> None:
        dispatch = job.dispatch
        assert job.home is not None
        job.log = LogSender(
            lambda offset, text, stream: self.client.log(dispatch.job_id, dispatch.attempt, text, offset, stream),
            name=f"job {dispatch.job_id} attempt {dispatch.attempt}")
        local_log = None
        try:
            self._wait_for_stopping_jobs(job)
            self._make_dirs(job)
            # Opened before the job starts, so the job can never swap it for a link.
            local_log = open(os.open(job.workdir / "output.log",  # noqa: SIM115 - closed by _pump
                                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600),
                             "a", encoding="utf-8")
            argv = self.command(dispatch, checkpoint=job.checkpoint)
            if job.container is not None:  # the image's interpreter, not the agent's
                argv = [CONTAINER_PYTHON if i == 0 and arg == self.python else arg for i, arg in enumerate(argv)]
            _write_private(job.workdir / "command.json", json.dumps({"argv": argv}))
            self._send_log(job, f"[agent] job {dispatch.job_id} attempt {dispatch.attempt} on {dispatch.host} "
                                f"GPUs {','.join(map(str, dispatch.gpu_indices))}: {' '.join(argv)}\n")
            if dispatch.container.image:
                if self.containers is None or job.container is None:
                    raise ContainerError(f"this host runs jobs as processes (gpu-agent --runtime process): it "
                                         f"cannot run the image {dispatch.container.image}")
                command, env, env_fd = self.containers.launch(job, self, argv, lambda text: self._send_log(job, text))
                try:
                    job.process = self._launcher.popen(
                        command, cwd=job.workdir, env=env, pass_fds=(env_fd,), stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
                finally:
                    os.close(env_fd)
            else:
                binds = self._process_volumes(job)  # (refused before anything is fetched)
                cwd = job.home
                if dispatch.container.code is not None:
                    cwd = job.home / "code"
                    self.fetch_code(job, cwd)
                command, env_fd = self._host_command(job, argv, cwd, binds)
                try:  # the shim in the agent's folder with the agent's variables; the job's reach it by the fd
                    job.process = self._launcher.popen(
                        command, cwd=job.workdir, env=shim_environment(), pass_fds=(env_fd,),
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                finally:
                    os.close(env_fd)
        except (OSError, ValueError, ContainerError, codefetch.CodeError, jobsecrets.SecretsError) as exc:
            if local_log is not None:
                local_log.close()
            told = isinstance(exc, (ContainerError, codefetch.CodeError, jobsecrets.SecretsError,
                                    volumes.VolumeError))  # (the reason)
            reason = str(exc) if told else f"could not start the job: {exc}"
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            self._send_log(job, f"[agent] {reason}\n")
            state = job.stop_state or "failed"  # stopped while it was starting (a pull): that is the end
            self._finish(job, JobStatus(state, dispatch.attempt, exit_code=code, node_rank=job.node_rank,
                                        reason=job.stop_reason if job.stop_state else reason))
            return
        try:
            _write_private(job.workdir / "job.pid", str(job.process.pid))
        except OSError as exc:
            logger.warning("job %s: could not write its pid file: %s", dispatch.job_id, exc)
        if job.stop_state is not None:  # stopped while starting
            self._terminate(job, self.grace_s)
        job.timer = threading.Timer(dispatch.time_limit_s, self._time_limit, args=(job,))
        job.timer.daemon = True
        job.timer.start()
        if self.on_attach:
            self.on_attach(job)
        try:
            self._pump(job, local_log)
            returncode = job.process.wait()
            exited_at = time.time()
            job.exited.set()
        finally:
            job.timer.cancel()
            (job.workdir / "job.pid").unlink(missing_ok=True)
            if self.on_detach:
                self.on_detach(job)
        if job.container is not None and self.containers is not None:
            self.containers.read_end(job.container, job.cgroup, returncode)  # how it ended (OOM)
        status = self._outcome(job, returncode)
        status.details["exited_at"] = exited_at  # (the console keeps it with the end's event)
        self._finish(job, status)

    def fetch_code(self, job: JobProcess, code: Path) -> None:
        """Fetch the job's code (an uploaded snapshot or a git checkout) into the new folder `code`, its user's:
        the process backend's working directory, a container's CODE_PATH. Raises CodeError with the reason."""
        assert job.dispatch.container.code is not None
        code.mkdir(mode=0o700)
        try:
            fetched = codefetch.fetch(job.dispatch.container.code, code, console_url=self.console_url,
                                      job_token=job.dispatch.job_token)
        except codefetch.CodeError as exc:
            raise codefetch.CodeError(f"could not fetch the job's code: {exc}") from None
        self._send_log(job, f"[agent] {fetched}\n")
        if job.user is not None:
            _chown_tree(code, job.user.uid, job.user.gid)

    def _process_secrets(self, job: JobProcess) -> dict[str, str]:
        """A process job's secrets for its environment, only under a uid of its own (no other job can read a
        process's environment there: the console places such jobs on hosts that register own-uid). SecretsError
        with the reason otherwise, or if they cannot be fetched."""
        if not job.dispatch.container.secrets:
            return {}
        if not self._has_own_uid(job):
            raise jobsecrets.SecretsError(
                "this host does not run each job under a uid of its own (gpu-agent run as root with --job-uids): "
                "it gives secrets only to jobs with an image")
        secrets = jobsecrets.fetch(self.client, job.dispatch)
        bad = sorted(name for name, value in secrets.items() if "\x00" in value)
        if bad:
            raise jobsecrets.SecretsError(f"secret {bad[0]} holds a NUL character, which no environment can")
        job.mask = SecretMask(secrets.values())  # before any output of the job is read
        return secrets

    def _process_volumes(self, job: JobProcess) -> list[volumes.Bind]:
        """The volumes a process job names, bound in its view: only under a uid of its own (no other job can reach
        its processes' files there, as for secrets). VolumeError with the reason otherwise."""
        mounts = job.dispatch.container.mounts
        if not mounts:
            return []
        if not self._has_own_uid(job):
            raise volumes.VolumeError(
                "this host does not run each job under a uid of its own (gpu-agent run as root with --job-uids): "
                "it binds volumes only into jobs with an image")
        binds = [volumes.resolve(mount, self.volume_roots, self.runs_jobs_as) for mount in mounts]
        for bind in binds:
            self._send_log(job, f"[agent] {volumes.described(bind)}\n")
        return binds

    def _host_command(self, job: JobProcess, argv: list[str], cwd: Path,
                      binds: list[volumes.Bind]) -> tuple[list[str], int]:
        """The shim's argv that runs `argv` in `cwd` as processes on this host (the process backend), and the fd
        of the job's environment (in memory; the shim inherits it, the caller closes it once the shim started)."""
        assert job.home is not None
        env = self.environment(job)
        view_options: list[str] = []
        if job.user is not None:
            _write_private(job.workdir / "view.json", self.view(job, binds).to_json())
            view_options = ["--view", str(job.workdir / "view.json")]
        if shutil.which(argv[0], path=env.get("PATH")) is None and not (cwd / argv[0]).is_file():
            raise FileNotFoundError(errno.ENOENT, "command not found", argv[0])
        job.cgroup = self.cgroups.for_job(job.dispatch)
        env.update(self._process_secrets(job))  # last, just before the start
        fd = in_memory_file(json.dumps(env).encode())
        shim = [self.python, "-m", "workers.agent.shim", "--grace", str(self.grace_s),
                "--stop-file", str(job.workdir / "stop-grace"),
                *(job.user.shim_options() if job.user else []), *view_options,
                *(job.cgroup.shim_options() if job.cgroup else []), "--cwd", str(cwd), "--env-fd", str(fd), "--"]
        return [*shim, *argv], fd

    def _outcome(self, job: JobProcess, returncode: int) -> JobStatus:
        attempt, rank = job.dispatch.attempt, job.node_rank
        code = exit_code_of(returncode)
        if job.stop_state == "preempted":
            return JobStatus("preempted", attempt, exit_code=code, reason=job.stop_reason, node_rank=rank)
        if job.stop_state is not None:
            return JobStatus(job.stop_state, attempt, exit_code=code,
                             reason=f"{job.stop_reason} ({describe_exit(returncode)})", node_rank=rank)
        if returncode == 0:
            return JobStatus("succeeded", attempt, exit_code=0, reason="exited with code 0", node_rank=rank)
        if job.cgroup is not None and job.cgroup.oom_killed(returncode):
            return JobStatus("failed", attempt, exit_code=code, reason=job.cgroup.oom_reason(), node_rank=rank)
        if job.container is not None and job.container.oom_killed:
            return JobStatus("failed", attempt, exit_code=code, reason=job.container.oom_reason(), node_rank=rank)
        return JobStatus("failed", attempt, exit_code=code, reason=describe_exit(returncode), node_rank=rank)

    def _finish(self, job: JobProcess, status: JobStatus) -> None:
        """Report the end at once, from the thread that saw the process exit; what may take long (removing the
        container and the cgroup, which the kernel may keep busy for a while) comes after the report."""
        if job.cgroup is not None:  # its processes are done: kill any left in the cgroup
            status.details.update(job.cgroup.end_and_report())
        self._send_log(job, f"[agent] {status.state}: {status.reason}\n")
        if job.log is not None:  # the console has its output before it hears the end (it refuses it after)
            job.log.close(LOG_END_IDLE_S)
        self._reclaim(job)  # its processes are gone: before the console hears the end, take its files back
        try:
            self._save_log_artifact(job)
        except OSError as exc:  # the local output.log keeps it; the end must still be reported
            logger.warning("job %s: could not store its log artifact: %s", job.dispatch.job_id, exc)
        try:
            self.client.report(job.dispatch.job_id, status)
        except ConsoleRejected as exc:
            logger.info("final report for job %s ignored: %s", job.dispatch.job_id, exc)
        except Exception:
            logger.exception("could not report the end of job %s; the console will notice", job.dispatch.job_id)
        finally:
            self._clean_up(job)
            job.ended.set()  # its processes are gone and its container removed: the agent's shutdown waits for it
            self._forget(job)

    def _clean_up(self, job: JobProcess) -> None:
        try:
            if job.container is not None and self.containers is not None:
                self.containers.clean_up(job.container, job.cgroup)
            if job.cgroup is not None:
                job.cgroup.remove()
        except Exception:  # noqa: BLE001 - the next start of the agent removes what is left
            logger.exception("job %s: cleanup after its end failed", job.dispatch.job_id)

    def _wait_for_stopping_jobs(self, job: JobProcess) -> None:
        """A cancelled job's GPUs are the console's to give again at once, while its processes still have their
        grace to stop (and a real GPU holds their memory until they exit): a job placed on any of those GPUs starts
        once they are gone (as Slurm's nodes stay "completing"), or once their grace and a margin are over. Such
        jobs are those this agent is stopping and those the dispatch names (`after`)."""
        gpus = set(job.dispatch.gpu_indices)
        after = set(job.dispatch.after)  # (their stops may not have reached this agent yet)
        deadline: float | None = None
        while True:
            with self._lock:
                stopping = [other for other in self._jobs.values()
                            if other is not job and (other.stop_state is not None or other.key in after)
                            and other.process is not None and not other.exited.is_set()
                            and gpus & set(other.dispatch.gpu_indices)]
            now = time.monotonic()
            if not stopping or (deadline is not None and now >= deadline):
                return
            if deadline is None:
                deadline = now + max(self._grace(other.stop_state) for other in stopping) + STOPPING_MARGIN_S
                names = ", ".join(f"job {other.dispatch.job_id}" for other in stopping)
                self._send_log(job, f"[agent] waiting for {names} to stop on GPUs "
                                    f"{','.join(map(str, sorted(gpus)))} before starting\n")
            stopping[0].exited.wait(min(1.0, deadline - now))

    def _grace(self, stop_state: str | None) -> float:
        """SIGTERM to SIGKILL: a preempted job's is longer (it writes its checkpoint)."""
        return self.preempt_grace_s if stop_state == "preempted" else self.grace_s

    def _time_limit(self, job: JobProcess) -> None:
        minutes = job.dispatch.time_limit_s / 60
        self.stop(job.dispatch.job_id, job.dispatch.attempt, f"time limit of {minutes:g} minutes exceeded",
                  state="failed")

    def _terminate(self, job: JobProcess, grace_s: float) -> None:
        """Ask the job's shim to stop its process tree: SIGTERM, then SIGKILL after `grace_s`."""
        process = job.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(OSError):
            _write_private(job.workdir / "stop-grace", str(grace_s))
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)

        def kill_later() -> None:
            # Last resort, should the shim itself hang: kill its process group.
            try:
                process.wait(timeout=grace_s + 10)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)

        threading.Thread(target=kill_later, name=f"kill-{job.dispatch.job_id}", daemon=True).start()

    # --- output and progress

    def _pump(self, job: JobProcess, local_log: TextIO) -> None:
        assert job.process is not None and job.process.stdout is not None
        fd = job.process.stdout.fileno()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending: list[str] = []
        pending_size = 0
        last_flush = time.monotonic()
        assert job.home is not None
        # A gated replica's serving record comes from its gate, in a file of the agent's the job cannot write.
        progress_file = job.progress_file or job.home / PROGRESS_FILE_NAME
        output_ended = threading.Event()
        forwarder = threading.Thread(target=self._forward_progress, args=(job, progress_file, output_ended),
                                     name=f"progress-{job.dispatch.job_id}", daemon=True)
        forwarder.start()
        room = self.log_max_chars  # characters still kept; past it the output is read and dropped
        mask = job.mask  # secret values never reach the log
        with local_log, _setting(output_ended):
            while True:
                ready, _, _ = select.select([fd], [], [], LOG_FLUSH_INTERVAL_S)
                eof = False
                if ready:
                    chunk = os.read(fd, 65536)
                    eof = not chunk
                    text = decoder.decode(chunk, final=eof)
                    if mask:
                        text = mask.feed(text) + (mask.flush() if eof else "")
                    if text and room > 0:
                        if len(text) >= room:
                            text = (text[:room] + f"\n[agent] output past {self.log_max_chars} characters is "
                                    "dropped; the job keeps running\n")
                        room -= len(text)
                        local_log.write(text)
                        pending.append(text)
                        pending_size += len(text)
                now = time.monotonic()
                if pending and (eof or pending_size >= CHUNK_CHARS or now - last_flush >= LOG_FLUSH_INTERVAL_S):
                    local_log.flush()
                    self._send_log(job, "".join(pending))
                    pending, pending_size, last_flush = [], 0, now
                if eof:
                    output_ended.set()
                    forwarder.join()  # its final metrics reach the console before its end does
                    return

    def _send_log(self, job: JobProcess, text: str) -> None:
        """Queue output for the console (sent by the job's LogSender: the job never waits for the console)."""
        assert job.log is not None
        # The console refuses NUL characters (the whole chunk would be lost): send them as U+FFFD.
        job.log.put(text.replace("\x00", "\ufffd"))

    def _forward_progress(self, job: JobProcess, path: Path, output_ended: threading.Event) -> None:
        """Each PROGRESS_INTERVAL_S while the job runs, the records it wrote since; once its output has ended, the
        rest of the file. A thread of its own: the reader of the job's output never waits on the console."""
        offset = 0
        while not output_ended.wait(PROGRESS_INTERVAL_S):
            offset = self._send_progress(job, path, offset)
        self._send_rest_of_progress(job, path, offset)

    def _send_rest_of_progress(self, job: JobProcess, path: Path, offset: int) -> int:
        """At a job's end: the rest of its progress file, not one read of it (bounded: the end report waits)."""
        for _ in range(PROGRESS_END_READS):
            sent_to = self._send_progress(job, path, offset)
            if sent_to == offset:
                break
            offset = sent_to
        return offset

    def _send_progress(self, job: JobProcess, path: Path, offset: int) -> int:
        """Send the progress records written since `offset` (only rank 0 writes the file)."""
        try:
            # The job owns the file: never follow a link it put there, never block on a FIFO, read a bounded amount.
            handle = open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb")  # noqa: SIM115
        except OSError:
            return offset
        with handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return offset
            handle.seek(offset)
            data = handle.read(PROGRESS_READ_MAX)
        complete = data[: data.rfind(b"\n") + 1]
        if not complete and len(data) == PROGRESS_READ_MAX:
            return offset + len(data)  # a line longer than any progress record: skipped
        records = [record for record in map(decode_progress, complete.splitlines()) if record is not None]
        training, serving = forwarded(records)
        dropped = sum(record.dropped_metrics for record in training)
        if dropped:
            logger.warning("job %s reported %d metric values that are no finite numbers under short names: "
                           "dropped", job.dispatch.job_id, dropped)
        results = [record for record in records if isinstance(record, ResultRecord)]
        job_id, attempt = job.dispatch.job_id, job.dispatch.attempt
        try:
            if serving is not None:
                self.client.progress(job_id, attempt, serving.to_message())
            if training:
                self.client.progress_records(job_id, attempt, [record.to_message() for record in training])
        except Exception as exc:  # noqa: BLE001 - progress never stops the job
            if transient(exc):  # nothing of this read was taken: the file keeps it for the next tick
                logger.warning("progress of job %s not sent (%s); sent again with the next", job_id, exc)
                return offset
            # Refused: the attempt moved on (the agent is stopping it), or a batch the console does not take.
            logger.log(logging.DEBUG if isinstance(exc, ConsoleRejected) else logging.WARNING,
                       "progress of job %s refused: %s", job_id, exc)
        for result in results[-1:]:  # written after the job's last training record: sent after it too
            try:
                self.client.progress(job_id, attempt, result.to_message())
            except Exception as exc:  # noqa: BLE001 - the training records above were taken: not sent twice
                logger.warning("final metrics of job %s not sent: %s", job_id, exc)
        return offset + len(complete)

    def _save_log_artifact(self, job: JobProcess) -> None:
        source = job.workdir / "output.log"
        if not source.exists():
            return
        target = (self.artifacts_root / str(job.dispatch.job_id) / "logs"
                  / f"attempt-{job.dispatch.attempt}-node-{job.node_rank}.log")
        target.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        for folder in (target.parent.parent, target.parent):
            _own_by_store(folder, self._store_gid())
        with open(source, "rb") as reader, open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                                                        0o640), "wb") as writer:
            shutil.copyfileobj(reader, writer)
        if os.geteuid() == 0:
            os.chown(target, os.geteuid(), self._store_gid())

    def _store_gid(self) -> int:
        """The artifact store's group: the console reads artifacts through it (root's own under `make run`)."""
        try:
            return self.artifacts_root.stat().st_gid
        except OSError:
            return os.getegid()

    # --- what to run

    def command(self, dispatch: Dispatch, *, checkpoint: Path | None = None) -> list[str]:
        workload = dispatch.workload
        if "serve" in workload:
            serve = workload["serve"]
            if not dispatch.replica_secret:
                # Without one the replica would answer anyone who finds its port, past the gateway's checks.
                raise ValueError("the dispatch of this inference replica carries no replica secret")
            if "command" in serve:  # a service's own server in its image, behind the replica gate (containers.py)
                if not dispatch.container.image:
                    raise ValueError("a replica with a command of its own runs only in its image")
                return [str(arg) for arg in serve["command"]]
            # Bound to this host's registered address only (the console reaches it there), never all interfaces.
            host = ["--host", self.address] if self.address else []
            argv = [self.python, "-m", "workers.runtime.serve", "--workload", str(serve["workload"]), *host,
                    "--port", "0", "--max-batch", str(int(serve.get("max_batch", 32))),
                    "--max-wait-ms", str(float(serve.get("max_wait_ms", 5.0)))]
            if not serve.get("batching", True):
                argv.append("--no-batching")
            if serve.get("checkpoint"):
                argv += ["--checkpoint", str(checkpoint or self.artifacts_root / str(serve["checkpoint"]))]
            return argv
        if "builtin" in workload:
            program = ["-m", "workers.runtime.run_builtin", "--workload", str(workload["builtin"]),
                       "--kind", dispatch.kind, "--params", json.dumps(workload.get("params") or {})]
            if dispatch.multi_process:
                return [self.python, *self._torchrun(dispatch), *program]
            return [self.python, *program]
        argv = [str(arg) for arg in workload["command"]]
        if dispatch.multi_process:
            if Path(argv[0]).name in PYTHON_NAMES:
                return [self.python, *self._torchrun(dispatch), *argv[1:]]
            if argv[0].endswith(".py"):
                return [self.python, *self._torchrun(dispatch), *argv]
        return argv

    def _torchrun(self, dispatch: Dispatch) -> list[str]:
        args = ["-m", "torch.distributed.run", "--nproc-per-node", str(len(dispatch.gpu_indices))]
        rendezvous = dispatch.rendezvous
        if rendezvous is None:
            return [*args, "--standalone"]
        local = ["--local-addr", self.address] if self.address else []
        return [
            *args, *local, "--nnodes", str(rendezvous.nnodes), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", rendezvous.endpoint, "--rdzv-id", rendezvous.run_id,
            "--rdzv-conf", f"is_host={'true' if rendezvous.node_rank == 0 else 'false'},join_timeout=120",
        ]

    def environment(self, job: JobProcess) -> dict[str, str]:
        dispatch = job.dispatch
        assert job.home is not None
        env = {k: v for k, v in os.environ.items()
               if k in JOB_ENV_NAMES or k in self.pass_env or k.startswith(JOB_ENV_PREFIXES)}
        # The spec's plain variables (checked at submission: none of the agent's own), then what the agent sets, as
        # a container gets them (containers.py).
        env.update(dispatch.container.env)
        if job.user is not None:
            env.update(HOME=str(job.home), USER=job.user.name, LOGNAME=job.user.name, TMPDIR=str(job.home / "tmp"))
        else:
            env.update(HOME=str(job.home), TMPDIR=tempfile.gettempdir())
        env["PYTHONUNBUFFERED"] = "1"
        for name in JOB_ENV_VARIABLES:  # only the agent's values of these, never inherited ones (--pass-env)
            env.pop(name, None)
        env.update(self.job_environment(job).to_env())
        if job.limits is not None and job.limits.mechanism == "mps":
            env.update(self.mps.environment(job.limits, self.gpus[dispatch.gpu_indices[0]][0]))
        return env

    def job_environment(self, job: JobProcess) -> JobEnvironment:
        """The job's CONSOLE_* variables and its GPUs (workers/protocol.py reads them back in the job)."""
        dispatch = job.dispatch
        assert job.home is not None
        job_artifacts = self.artifacts_root / str(dispatch.job_id)
        total = self.gpus.get(dispatch.gpu_indices[0], ("", 0))[1] if dispatch.gpu_indices else 0
        limit = job.limits.memory_mb if job.limits is not None else None
        return JobEnvironment(
            job_id=str(dispatch.job_id),
            attempt=dispatch.attempt,
            preset=dispatch.preset,
            max_steps=dispatch.max_steps or None,
            progress_file=job.home / PROGRESS_FILE_NAME,
            checkpoint_dir=job_artifacts / "checkpoints",
            output_dir=job_artifacts / "outputs",
            device="cpu" if self.simulated else "",  # simulated GPUs: the work runs on this host's CPUs
            visible_devices=tuple(str(i) for i in dispatch.gpu_indices),
            # The attempt's own credential for the console's job API, never the agent's.
            api_url=job_api_url(self.console_url) if dispatch.job_token else "",
            job_token=dispatch.job_token,
            replica_secret=dispatch.replica_secret,  # not argv: /proc/PID/cmdline is world-readable
            gpu_memory_limit_mb=limit,
            gpu_memory_fraction=round(min(1.0, limit / total), 4) if limit is not None and total else None,
            array_job_id=dispatch.array.array_id if dispatch.array else None,
            array_task_id=dispatch.array.index if dispatch.array else None,
            array_task_count=dispatch.array.size if dispatch.array else None,
        )

    def memory_limits(self) -> dict[int, int]:
        """job id -> GPU memory limit (MiB) of the running fractional jobs."""
        with self._lock:
            return {job.dispatch.job_id: job.limits.memory_mb for job in self._jobs.values() if job.limits}


@contextlib.contextmanager
def _setting(event: threading.Event) -> Iterator[None]:
    """Set `event` on the way out, however the block ends (a thread waiting on it never outlives its job)."""
    try:
        yield
    finally:
        event.set()


def _chown_tree(root: Path, uid: int, gid: int, *, modes: tuple[int, int] | None = None) -> None:
    """chown `root` and everything under it, never following a link (a job may plant them). With `modes`
    (folders, files), also set the mode of every folder and regular file."""
    def fix(path: str) -> None:
        os.chown(path, uid, gid, follow_symlinks=False)
        if modes is None:
            return
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            os.chmod(path, modes[0])
        elif stat.S_ISREG(info.st_mode):
            os.chmod(path, modes[1])

    fix(str(root))
    for folder, dirs, files in os.walk(root):  # does not descend into linked folders
        for name in [*dirs, *files]:
            fix(os.path.join(folder, name))


def _own_by_store(folder: Path, gid: int) -> None:
    """One of the agent's folders of the artifact store: its own, readable by the store's group."""
    if os.geteuid() == 0:  # an agent under its own user keeps the groups it has
        os.chown(folder, os.geteuid(), gid, follow_symlinks=False)
    folder.chmod(0o2750)


def _write_private(path: Path, text: str) -> None:
    """Write one of the agent's files of a job: 0600, never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with open(fd, "w") as handle:
        handle.write(text)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_leftover_jobs(work_root: Path) -> list[int]:
    """Kill the process groups of jobs a previous run of this agent left behind (pid files in work dirs)."""
    killed = []
    for pid_file in work_root.glob("job-*/attempt-*/job.pid"):
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            continue
        try:
            os.killpg(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
        pid_file.unlink(missing_ok=True)
    return killed

"""Runs jobs on this host: one process group per job, on exactly its GPUs, with its preset, logs streamed.

A job's life here: claim it from the console (a redelivered dispatch is refused there), launch it in its own
process group, pump its output and progress to the console, enforce its time limit, and report how it ended.
Every job process is started by one long-lived launcher thread with PR_SET_PDEATHSIG, so that if the agent
dies (even by kill -9) the kernel kills the jobs it started rather than leaving them on the GPUs.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import errno
import json
import logging
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.agent.client import ConsoleClient, ConsoleRejected
from workers.agent.sharing import MpsControl, ShareLimits, share_limits
from workers.protocol import Dispatch, JobStatus

logger = logging.getLogger("workers.agent")

PR_SET_PDEATHSIG = 1
LOG_FLUSH_INTERVAL_S = 0.5
LOG_FLUSH_BYTES = 256 * 1024
PROGRESS_INTERVAL_S = 1.0
PYTHON_NAMES = {"python", "python3", "python3.11", "python3.12"}
# Variables of the agent that a job must not inherit.
PRIVATE_ENV = ("GPU_AGENT_TOKEN", "CELERY_BROKER_URL", "DATABASE_URL", "DJANGO_SECRET_KEY", "REDIS_URL")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


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

    _requests: queue.Queue = field(default_factory=queue.Queue)
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

    def popen(self, argv: list[str], **options: Any) -> subprocess.Popen:
        if self._thread is None:
            self.start()
        reply: queue.Queue = queue.Queue(maxsize=1)
        self._requests.put((argv, options, reply))
        result = reply.get()
        if isinstance(result, BaseException):
            raise result
        return result


@dataclass
class JobProcess:
    dispatch: Dispatch
    workdir: Path
    process: subprocess.Popen | None = None
    # Set when the agent stops the job: the state to report and why.
    stop_state: str | None = None
    stop_reason: str = ""
    timer: threading.Timer | None = None
    limits: ShareLimits | None = None

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
        self.work_root.mkdir(parents=True, exist_ok=True)
        # GPU index -> (uuid, memory MiB), for fractional jobs' limits.
        self.gpus = gpus or {}
        self.mps = MpsControl(work_root, enabled=mps)
        # The address other hosts reach this one at: torchrun advertises it to the other nodes' workers.
        self.address = address

    # --- what the console asks for

    def running(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(self._jobs)

    def job_roots(self) -> dict[int, int]:
        """pid of each running job's shim -> job id."""
        with self._lock:
            return {job.process.pid: job.dispatch.job_id for job in self._jobs.values() if job.process}

    def start(self, dispatch: Dispatch) -> str:
        """Start a dispatched job. Returns "started", "duplicate" or "refused"; never raises for a bad job."""
        job = JobProcess(dispatch, self._workdir(dispatch))
        index = dispatch.gpu_indices[0] if dispatch.gpu_indices else 0
        job.limits = share_limits(dispatch, self.gpus.get(index, ("", 0))[1], mps=self.mps.enabled,
                                  simulated=self.simulated)
        with self._lock:
            if job.key in self._jobs:
                return "duplicate"
            self._jobs[job.key] = job  # listed in heartbeats from now on, so the console never sees it missing
        try:
            reply = self.client.report(
                dispatch.job_id,
                JobStatus("running", dispatch.attempt, node_rank=job.node_rank, details={
                    "host": dispatch.host,
                    **({"isolation": job.limits.mechanism, "gpu_memory_limit_mb": job.limits.memory_mb}
                       if job.limits else {}),
                }),
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
            grace = self.preempt_grace_s if state == "preempted" else self.grace_s
            self._terminate(job, grace)
        return bool(matches)

    def shutdown(self, reason: str = "the agent shut down") -> None:
        for job_id, attempt in self.running():
            self.stop(job_id, attempt, reason, state="failed")

    # --- one job

    def _workdir(self, dispatch: Dispatch) -> Path:
        return self.work_root / f"job-{dispatch.job_id}" / f"attempt-{dispatch.attempt}"

    def _forget(self, job: JobProcess) -> None:
        with self._lock:
            self._jobs.pop(job.key, None)

    def _run(self, job: JobProcess) -> None:
        dispatch = job.dispatch
        try:
            job.workdir.mkdir(parents=True, exist_ok=True)
            argv = self.command(dispatch)
            env = self.environment(job)
            (job.workdir / "command.json").write_text(json.dumps({"argv": argv}))
            self._send_log(job, f"[agent] job {dispatch.job_id} attempt {dispatch.attempt} on {dispatch.host} "
                                f"GPUs {','.join(map(str, dispatch.gpu_indices))}: {' '.join(argv)}\n")
            if shutil.which(argv[0], path=env.get("PATH")) is None and not (job.workdir / argv[0]).is_file():
                raise FileNotFoundError(errno.ENOENT, "command not found", argv[0])
            shim = [self.python, "-m", "workers.agent.shim", "--grace", str(self.grace_s),
                    "--stop-file", str(job.workdir / "stop-grace"), "--"]
            job.process = self._launcher.popen(
                [*shim, *argv], cwd=job.workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        except (OSError, ValueError) as exc:
            reason = f"could not start the job: {exc}"
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            self._send_log(job, f"[agent] {reason}\n")
            self._finish(job, JobStatus("failed", dispatch.attempt, exit_code=code, reason=reason,
                                        node_rank=job.node_rank))
            return
        (job.workdir / "job.pid").write_text(str(job.process.pid))
        if job.stop_state is not None:  # stopped while starting
            self._terminate(job, self.grace_s)
        job.timer = threading.Timer(dispatch.time_limit_s, self._time_limit, args=(job,))
        job.timer.daemon = True
        job.timer.start()
        if self.on_attach:
            self.on_attach(job)
        try:
            self._pump(job)
            returncode = job.process.wait()
        finally:
            job.timer.cancel()
            (job.workdir / "job.pid").unlink(missing_ok=True)
            if self.on_detach:
                self.on_detach(job)
        self._finish(job, self._outcome(job, returncode))

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
        return JobStatus("failed", attempt, exit_code=code, reason=describe_exit(returncode), node_rank=rank)

    def _finish(self, job: JobProcess, status: JobStatus) -> None:
        self._send_log(job, f"[agent] {status.state}: {status.reason}\n")
        try:
            self._save_log_artifact(job)
            self.client.report(job.dispatch.job_id, status)
        except ConsoleRejected as exc:
            logger.info("final report for job %s ignored: %s", job.dispatch.job_id, exc)
        except Exception:
            logger.exception("could not report the end of job %s; the console will notice", job.dispatch.job_id)
        finally:
            self._forget(job)

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
            (job.workdir / "stop-grace").write_text(str(grace_s))
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

    def _pump(self, job: JobProcess) -> None:
        assert job.process is not None and job.process.stdout is not None
        fd = job.process.stdout.fileno()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending: list[str] = []
        pending_size = 0
        last_flush = last_progress = time.monotonic()
        progress_file = job.workdir / "progress.jsonl"
        progress_offset = 0
        with (job.workdir / "output.log").open("a", encoding="utf-8") as local_log:
            while True:
                ready, _, _ = select.select([fd], [], [], LOG_FLUSH_INTERVAL_S)
                eof = False
                if ready:
                    chunk = os.read(fd, 65536)
                    eof = not chunk
                    text = decoder.decode(chunk, final=eof)
                    if text:
                        local_log.write(text)
                        pending.append(text)
                        pending_size += len(text)
                now = time.monotonic()
                if pending and (eof or pending_size >= LOG_FLUSH_BYTES or now - last_flush >= LOG_FLUSH_INTERVAL_S):
                    local_log.flush()
                    self._send_log(job, "".join(pending))
                    pending, pending_size, last_flush = [], 0, now
                if eof or now - last_progress >= PROGRESS_INTERVAL_S:
                    progress_offset = self._send_progress(job, progress_file, progress_offset)
                    last_progress = now
                if eof:
                    return

    def _send_log(self, job: JobProcess, text: str) -> None:
        try:
            self.client.log(job.dispatch.job_id, job.dispatch.attempt, text)
        except ConsoleRejected:
            pass  # the job moved on (cancelled or requeued): its output no longer belongs to the record
        except Exception as exc:  # noqa: BLE001 - the local log keeps everything
            logger.warning("could not send log of job %s: %s", job.dispatch.job_id, exc)

    def _send_progress(self, job: JobProcess, path: Path, offset: int) -> int:
        """Send the newest progress line written since `offset` (only rank 0 writes the file)."""
        try:
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
        except FileNotFoundError:
            return offset
        complete = data[: data.rfind(b"\n") + 1]
        latest: dict[str, dict] = {}
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("type") in {"progress", "serving"}:
                latest[record["type"]] = record  # the newest of each kind: a replica's port, training progress
        for record in latest.values():
            try:
                self.client.progress(job.dispatch.job_id, job.dispatch.attempt, record)
            except Exception as exc:  # noqa: BLE001 - progress is advisory
                logger.debug("progress of job %s not sent: %s", job.dispatch.job_id, exc)
        return offset + len(complete)

    def _save_log_artifact(self, job: JobProcess) -> None:
        source = job.workdir / "output.log"
        if not source.exists():
            return
        target = (self.artifacts_root / str(job.dispatch.job_id) / "logs"
                  / f"attempt-{job.dispatch.attempt}-node-{job.node_rank}.log")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)

    # --- what to run

    def command(self, dispatch: Dispatch) -> list[str]:
        workload = dispatch.workload
        if "serve" in workload:
            serve = workload["serve"]
            argv = [self.python, "-m", "workers.runtime.serve", "--workload", str(serve["workload"]), "--port", "0",
                    "--max-batch", str(int(serve.get("max_batch", 32))),
                    "--max-wait-ms", str(float(serve.get("max_wait_ms", 5.0)))]
            if not serve.get("batching", True):
                argv.append("--no-batching")
            if serve.get("checkpoint"):
                argv += ["--checkpoint", str(self.artifacts_root / str(serve["checkpoint"]))]
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
        env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
        job_artifacts = self.artifacts_root / str(dispatch.job_id)
        env.update(
            CUDA_VISIBLE_DEVICES=",".join(str(i) for i in dispatch.gpu_indices),
            CONSOLE_JOB_ID=str(dispatch.job_id),
            CONSOLE_ATTEMPT=str(dispatch.attempt),
            CONSOLE_PRESET=dispatch.preset,
            CONSOLE_PROGRESS_FILE=str(job.workdir / "progress.jsonl"),
            CONSOLE_CHECKPOINT_DIR=str(job_artifacts / "checkpoints"),
            CONSOLE_OUTPUT_DIR=str(job_artifacts / "outputs"),
            PYTHONUNBUFFERED="1",
        )
        if dispatch.max_steps:
            env["CONSOLE_MAX_STEPS"] = str(dispatch.max_steps)
        else:
            env.pop("CONSOLE_MAX_STEPS", None)
        if self.simulated:
            env["CONSOLE_DEVICE"] = "cpu"  # simulated GPUs: the work runs on this host's CPUs
        if job.limits is not None:
            total = self.gpus.get(dispatch.gpu_indices[0], ("", 0))[1]
            env["CONSOLE_GPU_MEMORY_LIMIT_MB"] = str(job.limits.memory_mb)
            if total:
                env["CONSOLE_GPU_MEMORY_FRACTION"] = f"{min(1.0, job.limits.memory_mb / total):.4f}"
            if job.limits.mechanism == "mps":
                env.update(self.mps.environment(job.limits, self.gpus[dispatch.gpu_indices[0]][0]))
        return env

    def memory_limits(self) -> dict[int, int]:
        """job id -> GPU memory limit (MiB) of the running fractional jobs."""
        with self._lock:
            return {job.dispatch.job_id: job.limits.memory_mb for job in self._jobs.values() if job.limits}


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

"""A job placed on GPUs whose cancelled job is still stopping (its SIGTERM grace) starts once that job is gone.

The console releases a cancelled job's GPUs at once and may place the next job there within a second, while the
cancelled job still holds the GPUs' memory until it exits: the agent holds the next start back, as Slurm's nodes
stay "completing"."""

from __future__ import annotations

import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.agent.test_log_sender import WAIT_S, appears
from workers.agent.runner import JobRunner
from workers.protocol import Dispatch, JobStatus


class Console:
    """The agent's client for several jobs: their output by job, their reports."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.logs: dict[int, str] = defaultdict(str)
        self.logged = threading.Condition(self.lock)
        self.statuses: list[tuple[int, JobStatus]] = []

    def log(self, job_id: int, attempt: int, data: str, offset: int, stream: str) -> None:
        with self.lock:
            self.logs[job_id] += data
            self.logged.notify_all()

    def wait_for_log(self, job_id: int, text: str) -> bool:
        with self.lock:
            return self.logged.wait_for(lambda: text in self.logs[job_id], timeout=WAIT_S)

    def report(self, job_id: int, status: JobStatus, *, attempts: int = 30) -> dict[str, Any]:
        with self.lock:
            self.statuses.append((job_id, status))
        return {"accepted": True}

    def progress(self, job_id: int, attempt: int, record: dict[str, Any]) -> None:
        pass

    def progress_records(self, job_id: int, attempt: int, records: list[dict[str, Any]]) -> None:
        pass


def job(job_id: int, gpu: int, script: str, after: tuple[tuple[int, int], ...] = ()) -> Dispatch:
    return Dispatch(job_id=job_id, attempt=1, host="h", gpu_indices=(gpu,), kind="train", preset="baseline-fp32",
                    workload={"command": [sys.executable, "-c", script]}, time_limit_s=600, after=after)


def saving_on_sigterm(up: Path, termed: Path, release: Path) -> str:
    """A job that, on SIGTERM, saves its work for as long as the test says (within its grace)."""
    return (f"import pathlib, signal, time\n"
            f"def save(*_):\n"
            f"    pathlib.Path({str(termed)!r}).touch()\n"
            f"    while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.05)\n"
            f"    raise SystemExit(0)\n"
            f"signal.signal(signal.SIGTERM, save)\n"
            f"pathlib.Path({str(up)!r}).touch()\n"
            f"time.sleep(600)\n")


def starter(marker: Path) -> str:
    return f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(600)"


def test_the_next_job_on_a_stopping_jobs_gpu_starts_once_it_is_gone_and_other_gpus_do_not_wait(
        tmp_path: Path) -> None:
    console = Console()
    runner = JobRunner(console, work_root=tmp_path / "work",  # type: ignore[arg-type]
                       artifacts_root=tmp_path / "artifacts", simulated=True, grace_s=WAIT_S)
    up, termed, release = tmp_path / "a-up", tmp_path / "a-term", tmp_path / "release"
    stopping = saving_on_sigterm(up, termed, release)
    assert runner.start(job(1, 0, stopping)) == "started"
    assert appears(up)
    runner.stop(1, 1, "cancelled by alice", state="cancelled")
    assert appears(termed)

    same_gpu, other_gpu = tmp_path / "b-started", tmp_path / "c-started"
    assert runner.start(job(2, 0, starter(same_gpu))) == "started"
    assert console.wait_for_log(2, "[agent] waiting for job 1 to stop on GPUs 0 before starting")
    assert runner.start(job(3, 1, starter(other_gpu))) == "started"
    assert appears(other_gpu)  # GPU 1 was never the stopping job's
    assert not same_gpu.exists()  # job 1 still saves its work on GPU 0
    release.touch()
    assert appears(same_gpu)
    runner.shutdown(wait_s=WAIT_S)
    assert [status.state for job_id, status in console.statuses if job_id == 1] == ["running", "cancelled"]


def test_a_job_waits_for_the_jobs_its_dispatch_names_even_before_their_stop_arrives(tmp_path: Path) -> None:
    """The cancel's stop and the next job's dispatch reach the agent within milliseconds, in either order."""
    console = Console()
    runner = JobRunner(console, work_root=tmp_path / "work",  # type: ignore[arg-type]
                       artifacts_root=tmp_path / "artifacts", simulated=True, grace_s=WAIT_S)
    up, termed, release = tmp_path / "a-up", tmp_path / "a-term", tmp_path / "release"
    assert runner.start(job(1, 0, saving_on_sigterm(up, termed, release))) == "started"
    assert appears(up)
    sharing, following = tmp_path / "sharing", tmp_path / "following"
    assert runner.start(job(2, 0, starter(following), after=((1, 1),))) == "started"
    assert console.wait_for_log(2, "[agent] waiting for job 1 to stop on GPUs 0 before starting")
    assert runner.start(job(3, 0, starter(sharing))) == "started"  # names nothing: a share of GPU 0 beside it
    assert appears(sharing)
    runner.stop(1, 1, "cancelled by alice", state="cancelled")  # the stop arrives after the dispatch
    assert appears(termed)
    assert not following.exists()
    release.touch()
    assert appears(following)
    runner.shutdown(wait_s=WAIT_S)

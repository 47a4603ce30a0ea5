"""The agent reports a job's end from the thread that saw its process exit, before any slow cleanup.

Removing the job's cgroup (or its container) can take seconds on a busy host; the end must not wait for it. The
cgroup removal is held here until the final report has arrived: the report comes all the same.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from workers.agent import cgroups
from workers.agent.runner import JobRunner
from workers.protocol import Dispatch, JobStatus

WAIT_S = 120  # a guard against hanging forever, never a figure the test measures


class Console:
    """Records what the agent reports; the final report sets `ended`."""

    def __init__(self) -> None:
        self.statuses: list[JobStatus] = []
        self.ended = threading.Event()

    def report(self, job_id: int, status: JobStatus, *, attempts: int = 30) -> dict[str, Any]:
        self.statuses.append(status)
        if status.state != "running":
            self.ended.set()
        return {"state": status.state, "accepted": True}

    def log(self, job_id: int, attempt: int, data: str, offset: int, stream: str) -> None:
        pass

    def progress(self, job_id: int, attempt: int, progress: dict[str, Any]) -> None:
        pass


def test_the_end_is_reported_before_the_cgroup_is_removed(tmp_path: Path, monkeypatch) -> None:
    support = cgroups.CgroupSupport(simulated=True)
    if not support.enabled:
        pytest.skip(f"no job cgroups here: {support.off_reason('h')}")
    removing, release = threading.Event(), threading.Event()
    real_remove = cgroups.JobCgroup.remove

    def held_remove(self: cgroups.JobCgroup) -> None:
        removing.set()
        release.wait(WAIT_S)
        real_remove(self)

    monkeypatch.setattr(cgroups.JobCgroup, "remove", held_remove)
    console = Console()
    runner = JobRunner(console, work_root=tmp_path / "work", artifacts_root=tmp_path / "artifacts",  # type: ignore[arg-type]
                       simulated=True)
    dispatch = Dispatch(job_id=5, attempt=1, host="h", gpu_indices=(0,), kind="train", preset="baseline-fp32",
                        workload={"command": [sys.executable, "-c", "print('done')"]}, time_limit_s=60)
    try:
        assert runner.start(dispatch) == "started"
        assert console.ended.wait(WAIT_S), "no final report while the cgroup removal was held"
        final = console.statuses[-1]
        assert (final.state, final.exit_code) == ("succeeded", 0)
        assert isinstance(final.details.get("exited_at"), float)  # when the agent saw the process exit
        assert runner.running() == [(5, 1)]  # still cleaning up: listed until its cgroup is gone
        assert removing.wait(WAIT_S)
    finally:
        release.set()
    forgotten = threading.Event()
    for _ in range(int(WAIT_S / 0.05)):
        if not runner.running():
            forgotten.set()
            break
        forgotten.wait(0.05)
    assert forgotten.is_set(), "the job stayed listed after its cleanup"

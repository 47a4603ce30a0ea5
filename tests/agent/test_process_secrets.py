"""An agent that does not run each job under a uid of its own gives no secrets to a job without an image: it fails
the job saying why (the console places such jobs only on own-uid hosts: apps/scheduling/host_needs.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.agent.test_end_report import WAIT_S
from tests.agent.test_end_report import Console as EndConsole
from workers.agent.runner import JobRunner
from workers.protocol import ContainerSpec, Dispatch


class Console(EndConsole):
    def __init__(self) -> None:
        super().__init__()
        self.logs: list[str] = []
        self.secrets_asked = 0

    def log(self, job_id: int, attempt: int, data: str, offset: int, stream: str) -> None:
        self.logs.append(data)

    def job_secrets(self, job_id: int, attempt: int, *, attempts: int = 5) -> dict[str, str]:
        self.secrets_asked += 1
        return {"API_KEY": "never-handed-out"}


def test_a_process_job_with_secrets_fails_on_an_agent_without_job_uids(tmp_path: Path) -> None:
    console = Console()
    runner = JobRunner(console, work_root=tmp_path / "work", artifacts_root=tmp_path / "artifacts",  # type: ignore[arg-type]
                       simulated=True)
    assert runner.process_isolation == "agent-user"
    dispatch = Dispatch(job_id=3, attempt=1, host="h", gpu_indices=(0,), kind="train", preset="baseline-fp32",
                        workload={"command": [sys.executable, "-c", "print('ran')"]}, time_limit_s=60,
                        container=ContainerSpec(secrets=("API_KEY",)))
    assert runner.start(dispatch) == "started"
    assert console.ended.wait(WAIT_S)
    final = console.statuses[-1]
    assert final.state == "failed" and "does not run each job under a uid of its own" in final.reason
    assert console.secrets_asked == 0 and "ran\n" not in "".join(console.logs)


def test_the_jobs_variables_reach_its_process_only_never_the_agents_shim(tmp_path: Path) -> None:
    """PYTHONPATH (or LD_PRELOAD) among a job's variables applies to the job alone: the shim, which runs as the agent,
    is started with the agent's own variables and in the agent's folder."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    marker = tmp_path / "shim-imported-the-jobs-module"
    (shadow / "argparse.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit(3)\n")
    console = Console()
    runner = JobRunner(console, work_root=tmp_path / "work", artifacts_root=tmp_path / "artifacts",  # type: ignore[arg-type]
                       simulated=True)
    dispatch = Dispatch(job_id=4, attempt=1, host="h", gpu_indices=(0,), kind="train", preset="baseline-fp32",
                        workload={"command": [sys.executable, "-c", "import os; print('path', os.environ['PYTHONPATH'])"]},
                        time_limit_s=60, container=ContainerSpec(env={"PYTHONPATH": str(shadow)}))
    assert runner.start(dispatch) == "started"
    assert console.ended.wait(WAIT_S)
    assert not marker.exists(), "the shim imported a module from the job's PYTHONPATH"
    assert console.statuses[-1].state == "succeeded", console.logs
    assert f"path {shadow}\n" in "".join(console.logs)

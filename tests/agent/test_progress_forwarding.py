"""What the agent forwards of a job's progress file: the newest typed record of each forwarded kind, nothing
garbled, nothing of a kind the console does not take."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workers.agent.runner import JobProcess, JobRunner
from workers.protocol import Dispatch, JobEnvironment


class RecordingClient:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def progress(self, job_id: int, attempt: int, record: dict[str, Any]) -> None:
        self.sent.append(record)


def dispatch(**extra: Any) -> Dispatch:
    return Dispatch(job_id=7, attempt=2, host="h", gpu_indices=(1, 3), kind="train", preset="ddp",
                    workload={"command": ["true"]}, time_limit_s=60, **extra)


def test_only_the_newest_well_formed_record_of_each_kind_is_forwarded(tmp_path: Path) -> None:
    client = RecordingClient()
    runner = JobRunner(client, work_root=tmp_path / "work", artifacts_root=tmp_path / "artifacts")  # type: ignore[arg-type]
    job = JobProcess(dispatch(), tmp_path / "work")
    path = tmp_path / "progress.jsonl"
    lines = [json.dumps({"type": "progress", "step": 1, "loss": 2.0}), "{garbled", "\x00\xff",
             json.dumps({"type": "progress", "step": 2, "loss": 1.0, "secret": "x" * 10}),
             json.dumps({"type": "checkpoint", "path": "/c", "step": 2}),
             json.dumps({"type": "serving", "port": "not a port"}), json.dumps({"type": "evil", "port": 1})]
    path.write_text("\n".join(lines) + "\n" + '{"type": "progress", "step": 3')  # the last line is unfinished
    offset = runner._send_progress(job, path, 0)
    assert client.sent == [{"type": "progress", "step": 2, "loss": 1.0}]
    assert offset == len(path.read_bytes()) - len('{"type": "progress", "step": 3')


def test_the_agent_sets_the_environment_the_runtime_reads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CONSOLE_MAX_STEPS", "999")  # inherited values never reach the job
    runner = JobRunner(None, work_root=tmp_path / "work", artifacts_root=tmp_path / "artifacts",  # type: ignore[arg-type]
                       simulated=True, pass_env=("CONSOLE_MAX_STEPS",), console_url="http://console:8000/")
    job = JobProcess(dispatch(job_token="tok", max_steps=5), tmp_path / "work")
    env = JobEnvironment.from_env(runner.environment(job))
    assert env == runner.job_environment(job)
    assert (env.job_id, env.attempt, env.preset, env.max_steps, env.device) == ("7", 2, "ddp", 5, "cpu")
    assert env.visible_devices == ("1", "3") and env.progress_file == tmp_path / "work" / "progress.jsonl"
    assert env.checkpoint_dir == tmp_path / "artifacts" / "7" / "checkpoints"
    assert (env.api_url, env.job_token) == ("http://console:8000/api/v1/job/", "tok")
    without = JobEnvironment.from_env(runner.environment(JobProcess(dispatch(), tmp_path / "work")))
    assert (without.max_steps, without.api_url, without.job_token) == (None, "", "")

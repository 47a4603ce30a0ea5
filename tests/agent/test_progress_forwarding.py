"""What the agent forwards of a job's progress file: every well-formed training record in order (thinned evenly
past a batch's bound, keeping those with the job's own metrics), the newest serving record, nothing garbled,
nothing of a kind the console does not take."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workers.agent.progress import evenly, forwarded
from workers.agent.runner import JobProcess, JobRunner
from workers.protocol import Dispatch, JobEnvironment, ServingProgress, TrainingProgress


class RecordingClient:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def progress(self, job_id: int, attempt: int, record: dict[str, Any]) -> None:
        self.sent.append(record)

    def progress_records(self, job_id: int, attempt: int, records: list[dict[str, Any]]) -> None:
        self.sent.extend(records)


def dispatch(**extra: Any) -> Dispatch:
    return Dispatch(job_id=7, attempt=2, host="h", gpu_indices=(1, 3), kind="train", preset="ddp",
                    workload={"command": ["true"]}, time_limit_s=60, **extra)


def test_every_well_formed_training_record_is_forwarded_in_order(tmp_path: Path) -> None:
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
    assert client.sent == [{"type": "progress", "step": 1, "loss": 2.0}, {"type": "progress", "step": 2, "loss": 1.0}]
    assert offset == len(path.read_bytes()) - len('{"type": "progress", "step": 3')


def test_a_long_batch_is_thinned_evenly_keeping_the_newest_and_the_jobs_own_metrics() -> None:
    records = [TrainingProgress(step=i, loss=1.0, metrics={"val_acc": 0.5} if i % 100 == 0 else {})
               for i in range(5000)]
    serving = ServingProgress(port=9000)
    sent, newest_serving = forwarded([ServingProgress(port=1), *records, serving], limit=200)
    assert newest_serving == serving and len(sent) == 200
    steps = [r.step for r in sent]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 4999
    assert [r.step for r in sent if r.metrics] == list(range(0, 5000, 100))  # all 50 evaluations
    gaps = {b - a for a, b in zip(steps, steps[1:], strict=False) if b - a > 1}
    assert max(gaps) <= 2 * 5000 // 150  # the rest spread evenly
    assert forwarded(records[:10], limit=200) == (records[:10], None)
    assert evenly([1, 2, 3], 1) == [3] and evenly(list(range(10)), 4) == [0, 3, 6, 9]


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

"""What the agent forwards of a job's progress file: every well-formed training record in order (thinned evenly
past a batch's bound, keeping those with the job's own metrics), the newest serving record, nothing garbled,
nothing of a kind the console does not take."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.test_log_sender import WAIT_S, appears
from tests.agent.test_log_sender import Console as LogConsole
from workers.agent.client import ConsoleClient, ConsoleRejected, transient
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


class FlakyClient(RecordingClient):
    """A console that fails the next `failures` posts as given (a transport error, a refusal)."""

    def __init__(self, failures: list[Exception], fail_kind: str = "records") -> None:
        super().__init__()
        self.failures = failures
        self.fail_kind = fail_kind

    def _maybe_fail(self, kind: str) -> None:
        if kind == self.fail_kind and self.failures:
            raise self.failures.pop(0)

    def progress(self, job_id: int, attempt: int, record: dict[str, Any]) -> None:
        self._maybe_fail(record.get("type", ""))
        super().progress(job_id, attempt, record)

    def progress_records(self, job_id: int, attempt: int, records: list[dict[str, Any]]) -> None:
        self._maybe_fail("records")
        super().progress_records(job_id, attempt, records)


def progress_file(tmp_path: Path, *records: dict[str, Any]) -> Path:
    path = tmp_path / "progress.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def runner_and_job(client: RecordingClient, tmp_path: Path) -> tuple[JobRunner, JobProcess]:
    runner = JobRunner(client, work_root=tmp_path / "work", artifacts_root=tmp_path / "artifacts")  # type: ignore[arg-type]
    return runner, JobProcess(dispatch(), tmp_path / "work")


def test_records_the_console_did_not_take_are_sent_again_on_the_next_tick(tmp_path: Path) -> None:
    client = FlakyClient([httpx.RemoteProtocolError("Server disconnected without sending a response.")])
    runner, job = runner_and_job(client, tmp_path)
    path = progress_file(tmp_path, {"type": "progress", "step": 1, "loss": 2.0},
                         {"type": "progress", "step": 2, "loss": 1.0})
    assert runner._send_progress(job, path, 0) == 0 and client.sent == []  # kept in the file
    assert runner._send_progress(job, path, 0) == len(path.read_bytes())
    assert [record["step"] for record in client.sent] == [1, 2]  # once each


def test_records_refused_for_good_are_not_sent_again(tmp_path: Path) -> None:
    client = FlakyClient([ConsoleRejected("the job moved on")])
    runner, job = runner_and_job(client, tmp_path)
    path = progress_file(tmp_path, {"type": "progress", "step": 1, "loss": 2.0})
    assert runner._send_progress(job, path, 0) == len(path.read_bytes()) and client.sent == []


def test_final_metrics_not_sent_do_not_send_the_training_records_twice(tmp_path: Path) -> None:
    client = FlakyClient([httpx.ConnectError("console down")], fail_kind="result")
    runner, job = runner_and_job(client, tmp_path)
    path = progress_file(tmp_path, {"type": "progress", "step": 1, "loss": 2.0}, {"type": "result", "acc": 0.9})
    assert runner._send_progress(job, path, 0) == len(path.read_bytes())
    assert client.sent == [{"type": "progress", "step": 1, "loss": 2.0}]


def test_the_client_sends_a_progress_post_again_after_a_transient_failure() -> None:
    answers: list[Exception | int] = [httpx.RemoteProtocolError("Server disconnected without sending a response."),
                                      200, 503, 503]
    seen: list[bytes] = []

    def console(request: httpx.Request) -> httpx.Response:
        seen.append(request.content)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer, json={})

    client = ConsoleClient("http://console", "token", transport=httpx.MockTransport(console))
    client.progress_records(7, 2, [{"type": "progress", "step": 1}])
    assert len(seen) == 2 and seen[0] == seen[1]
    with pytest.raises(httpx.HTTPStatusError) as failed:
        client.progress_records(7, 2, [{"type": "progress", "step": 2}])
    assert transient(failed.value) and len(seen) == 4
    assert not transient(ConsoleRejected("moved on")) and transient(httpx.ConnectError("down"))


class HeldProgressConsole(LogConsole):
    """Takes logs at once; every progress post hangs until `progress_held` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.progress_held = threading.Event()
        self.progress_tried = threading.Event()
        self.records: list[dict[str, Any]] = []

    def progress_records(self, job_id: int, attempt: int, records: list[dict[str, Any]]) -> None:
        self.progress_tried.set()
        assert self.progress_held.wait(WAIT_S)
        self.records.extend(records)
        self.events.append("progress")


def test_the_jobs_output_is_read_on_while_its_progress_posts_hang(tmp_path: Path) -> None:
    console = HeldProgressConsole()
    runner = JobRunner(console, work_root=tmp_path / "work", artifacts_root=tmp_path / "artifacts",  # type: ignore[arg-type]
                       simulated=True)
    printed = tmp_path / "printed"
    script = ("import json, os, sys, time\n"
              "with open(os.environ['CONSOLE_PROGRESS_FILE'], 'a') as f:\n"
              "    f.write(json.dumps({'type': 'progress', 'step': 1, 'loss': 0.5}) + '\\n')\n"
              "time.sleep(1.5)\n"  # past a progress tick: the record's post hangs from here on
              "sys.stdout.write('o' * 1048576 + '\\n'); sys.stdout.flush()\n"
              f"open({str(printed)!r}, 'w').close()\n")
    dispatch = Dispatch(job_id=8, attempt=1, host="h", gpu_indices=(0,), kind="train", preset="baseline-fp32",
                        workload={"command": [sys.executable, "-c", script]}, time_limit_s=600)
    assert runner.start(dispatch) == "started"
    assert console.progress_tried.wait(WAIT_S)
    assert appears(printed), "the job blocked on its output while a progress post hung"
    assert not console.ended.is_set()  # its end waits for its final metrics
    console.progress_held.set()
    assert console.ended.wait(WAIT_S)
    assert console.records == [{"type": "progress", "step": 1, "loss": 0.5}]
    assert console.events.index("progress") < console.events.index("succeeded")

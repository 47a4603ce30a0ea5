"""The contracts between the agent, the job runtime and the console (workers/protocol.py): each side encodes
and decodes through the same types, so a round trip is the identity and a hostile value never gets through."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.agent.runner import JobProcess, JobRunner
from workers.protocol import (
    JOB_ENV_VARIABLES,
    MAX_METRICS_PER_RECORD,
    ArrayTask,
    CheckpointRecord,
    ContainerSpec,
    Dispatch,
    EnvError,
    JobEnvironment,
    JobIsolation,
    JobSecrets,
    JobStatus,
    ProtocolError,
    ResultRecord,
    RunningDetails,
    ServingProgress,
    TrainingProgress,
    decode_progress,
    decode_progress_message,
)

FULL = JobEnvironment(
    job_id="42", attempt=3, preset="ddp", max_steps=100, progress_file=Path("/w/progress.jsonl"),
    checkpoint_dir=Path("/a/42/checkpoints"), checkpoint_every=10, output_dir=Path("/a/42/outputs"),
    model_path=Path("/m/model.pt"), device="cpu", visible_devices=("0", "1"), api_url="http://c/api/v1/job/",
    job_token="tok", replica_secret="s" * 32, gpu_memory_limit_mb=4096, gpu_memory_fraction=0.3333, serve_port=8080,
    array_job_id=40, array_task_id=2, array_task_count=5)


def test_the_environment_round_trips_and_names_only_its_own_variables() -> None:
    env = FULL.to_env()
    assert JobEnvironment.from_env(env) == FULL
    assert set(env) == set(JOB_ENV_VARIABLES)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["CONSOLE_GPU_MEMORY_FRACTION"] == "0.3333"
    assert JobEnvironment.from_env(JobEnvironment().to_env()) == JobEnvironment() and JobEnvironment().to_env() == {}


def test_no_gpus_is_an_empty_device_list_not_every_gpu() -> None:
    env = JobEnvironment(visible_devices=()).to_env()
    assert env == {"CUDA_VISIBLE_DEVICES": ""}
    assert JobEnvironment.from_env(env).visible_devices == ()
    assert JobEnvironment.from_env({}).visible_devices is None


def test_secrets_stay_out_of_the_repr() -> None:
    assert "tok" not in repr(FULL) and "s" * 32 not in repr(FULL)


@pytest.mark.parametrize("name, value", [("CONSOLE_MAX_STEPS", "lots"), ("CONSOLE_ATTEMPT", "-1"),
                                         ("CONSOLE_GPU_MEMORY_FRACTION", "1.5"),
                                         ("CONSOLE_GPU_MEMORY_FRACTION", "nan"),
                                         ("CONSOLE_GPU_MEMORY_LIMIT_MB", "4G")])
def test_a_value_the_runtime_cannot_use_is_refused_by_name(name: str, value: str) -> None:
    with pytest.raises(EnvError, match=name):
        JobEnvironment.from_env({name: value})


@given(st.builds(JobEnvironment, job_id=st.from_regex(r"[0-9]{1,6}", fullmatch=True),
                 attempt=st.none() | st.integers(0, 10**6), max_steps=st.none() | st.integers(1, 10**9),
                 gpu_memory_fraction=st.none() | st.floats(0.0001, 1.0),
                 visible_devices=st.none() | st.lists(st.integers(0, 15).map(str), max_size=8).map(tuple),
                 preset=st.sampled_from(["", "ddp", "baseline-fp32"]),
                 progress_file=st.none() | st.just(Path("/w/p.jsonl"))))
def test_any_environment_round_trips(environment: JobEnvironment) -> None:
    assert JobEnvironment.from_env(environment.to_env()) == environment


@pytest.mark.parametrize("record", [
    TrainingProgress(step=5, max_steps=10, loss=0.25, steps_per_s=2.0, samples_per_s=64.0, epoch=1, ts=1.5),
    TrainingProgress(step=6, metrics={"val_acc": 0.75, "eval/loss": 1.25}, dropped_metrics=2),
    ServingProgress(port=8123, host="10.0.0.2", workload="mlp-digits", preset="infer-fp32", batching=False,
                    ts=2.0),
    CheckpointRecord(path="/a/ckpt-5.pt", step=5, ts=3.0),
    ResultRecord({"accuracy": 0.9, "arch": {"hidden": 64}}),
])
def test_every_progress_record_round_trips_through_a_line(record) -> None:
    assert decode_progress(json.dumps(record.to_message())) == record
    assert decode_progress(json.dumps(record.to_message()).encode()) == record


def test_what_the_runtime_writes_is_what_the_agent_reads(tmp_path: Path) -> None:
    from workers.runtime.reporting import Reporter

    path = tmp_path / "progress.jsonl"
    reporter = Reporter(path)
    reporter.progress(step=3, max_steps=9, loss=float("nan"), steps_per_s=1.5, samples_per_s=48.0, epoch=0,
                      extra_field="kept in the file")
    reporter.checkpoint(path=tmp_path / "c.pt", step=3)
    reporter.result(accuracy=0.5)
    progress, checkpoint, result = (decode_progress(line) for line in path.read_text().splitlines())
    assert isinstance(progress, TrainingProgress)
    assert (progress.step, progress.max_steps, progress.loss, progress.steps_per_s) == (3, 9, None, 1.5)
    assert checkpoint == CheckpointRecord(path=str(tmp_path / "c.pt"), step=3, ts=checkpoint.ts)
    assert isinstance(result, ResultRecord) and result.metrics["accuracy"] == 0.5


@pytest.mark.parametrize("line", [
    b"", b"\n", b"{", b"not json", b"\xff\xfe\x00garbage", b"null", b"42", b'"progress"', b"[1, 2]",
    b'{"type": "progress", "step": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nesting past the parser
    b'{"type": "progress"' + b" " * 70_000 + b"}",  # longer than any record
    b'{"type": "launch-missiles"}', b'{"type": ["progress"]}', b'{"no": "type"}',
    b'{"type": "serving", "port": "8000"}', b'{"type": "serving", "port": 0}', b'{"type": "serving", "port": 70000}',
    b'{"type": "serving", "port": true}', b'{"type": "serving"}', b'{"type": "checkpoint", "path": 5, "step": 1}',
    b'{"type": "checkpoint", "path": "/x", "step": -1}',
])
def test_a_garbled_or_hostile_line_decodes_to_nothing(line: bytes) -> None:
    assert decode_progress(line) is None


def test_hostile_fields_of_a_training_record_are_dropped_not_trusted() -> None:
    record = decode_progress(json.dumps({"type": "progress", "step": True, "max_steps": -5, "loss": 1e308,
                                         "steps_per_s": -3.0, "samples_per_s": "fast", "epoch": 1.5,
                                         "ts": "yesterday"}).replace("1e+308", "Infinity"))
    assert record == TrainingProgress()
    assert decode_progress_message({"type": "progress", "step": 2**80}) == TrainingProgress(step=2**80)
    assert TrainingProgress().to_message() == {"type": "progress"}


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                                       max_size=4),
                    max_leaves=20))
def test_no_json_value_makes_the_decoder_raise(value) -> None:
    decode_progress_message(value)
    if isinstance(value, dict):
        for kind in ("progress", "serving", "checkpoint", "result"):
            decode_progress_message({**value, "type": kind})
        decode_progress_message({"type": "progress", "metrics": value, "dropped_metrics": value.get("")})


def test_a_jobs_own_metrics_keep_short_names_and_finite_numbers_and_count_the_rest() -> None:
    record = decode_progress(json.dumps({"type": "progress", "step": 4, "dropped_metrics": 1, "metrics": {
        "val_acc": 0.9, "eval/top-5.acc": 1, "bad name": 1.0, "9lives": 1.0, "x" * 65: 1.0, "loss": 0.1,
        "str": "0.5", "bool": True, "huge": 1e300, "none": None, "list": [1.0]}}))
    assert isinstance(record, TrainingProgress)
    assert record.metrics == {"val_acc": 0.9, "eval/top-5.acc": 1.0} and record.dropped_metrics == 1 + 9
    assert record.values() == {"val_acc": 0.9, "eval/top-5.acc": 1.0}
    many = TrainingProgress.from_message({"metrics": {f"m{i}": i for i in range(MAX_METRICS_PER_RECORD + 3)}})
    assert len(many.metrics) == MAX_METRICS_PER_RECORD and many.dropped_metrics == 3
    assert TrainingProgress.from_message({"metrics": [1, 2]}).dropped_metrics == 1


def test_running_details_round_trip_through_a_status_report() -> None:
    details = RunningDetails(host="node-a", isolation=JobIsolation("own-uid", 200001, private_view=True),
                             gpu_share="watch", gpu_memory_limit_mb=2048,
                             limits={"applied": True, "cpus": 2.0, "memory_gb": 4, "pids": 200, "devices": "0"})
    status = JobStatus.running(2, details, node_rank=1)
    assert (status.state, status.attempt, status.node_rank) == ("running", 2, 1)
    message = json.loads(json.dumps(status.to_message()))
    assert JobStatus(**message).running_details() == details
    info = details.runtime_info()
    assert "host" not in info and info["isolation"] == "own-uid" and info["gpu_memory_limit_mb"] == 2048


def test_running_details_keep_only_what_the_console_can_use() -> None:
    hostile = {"host": ["x"], "isolation": "root-please", "isolation_uid": 0, "isolation_note": "trust me",
               "gpu_share": {"a": 1}, "gpu_memory_limit_mb": "lots", "endpoint": "http://evil",
               "limits": {"applied": "yes", "cpus": 2, "reason": "r" * 1000, "extra": 1, "pids": None}}
    details = RunningDetails.from_details(hostile)
    assert details == RunningDetails(limits={"cpus": 2, "reason": "r" * 300, "pids": None})
    assert RunningDetails.from_details({"limits": "all"}).limits is None


def test_a_dispatch_names_secrets_and_their_values_travel_apart() -> None:
    spec = ContainerSpec.from_message({"image": "i", "secrets": ["WANDB_API_KEY", "HF_TOKEN"]})
    assert spec.secrets == ("WANDB_API_KEY", "HF_TOKEN")
    with pytest.raises(ValueError, match="list of names"):  # the old shape, values inside: refused
        ContainerSpec.from_message({"image": "i", "secrets": {"WANDB_API_KEY": "v"}})
    fetched = JobSecrets(attempt=2, values={"WANDB_API_KEY": "value-42"})
    assert JobSecrets.from_message(json.loads(json.dumps(fetched.to_message()))) == fetched
    assert "value-42" not in repr(fetched)
    for bad in ({"attempt": 1}, {"attempt": 1, "values": {"A": 1}}, {"attempt": "x", "values": {}}, []):
        with pytest.raises(ProtocolError):
            JobSecrets.from_message(bad)


def test_an_array_task_travels_in_its_dispatch_and_reaches_the_job_as_its_index(tmp_path: Path) -> None:
    dispatch = Dispatch(job_id=42, attempt=1, host="h", gpu_indices=(0,), kind="train", preset="baseline-fp32",
                        workload={"command": ["true"]}, time_limit_s=60, array=ArrayTask(array_id=40, index=2, size=5))
    received = Dispatch.from_message(json.loads(json.dumps(dispatch.to_message())))
    assert received == dispatch
    runner = JobRunner(None, work_root=tmp_path / "work", artifacts_root=tmp_path / "artifacts")  # type: ignore[arg-type]
    env = runner.environment(JobProcess(received, tmp_path / "work" / "job-42" / "attempt-1"))
    assert (env["CONSOLE_ARRAY_JOB_ID"], env["CONSOLE_ARRAY_TASK_ID"], env["CONSOLE_ARRAY_TASK_COUNT"]) == ("40", "2", "5")
    alone = replace(dispatch, array=None)
    assert Dispatch.from_message(json.loads(json.dumps(alone.to_message()))).array is None
    assert not {"CONSOLE_ARRAY_TASK_ID", "CONSOLE_ARRAY_JOB_ID"} & set(runner.environment(JobProcess(alone, tmp_path / "w")))


@pytest.mark.parametrize("array", [{"array_id": 40, "index": 5, "size": 5}, {"array_id": 0, "index": 0, "size": 1},
                                   {"array_id": 40, "index": -1, "size": 5}, {"array_id": 40, "index": 1},
                                   {"array_id": "x", "index": 0, "size": 1}])
def test_a_malformed_array_task_is_a_protocol_error(array: dict) -> None:
    message = Dispatch(job_id=42, attempt=1, host="h", gpu_indices=(0,), kind="train", preset="p",
                       workload={"command": ["true"]}, time_limit_s=60).to_message()
    with pytest.raises(ProtocolError, match="malformed dispatch"):
        Dispatch.from_message({**message, "array": array})


def test_the_jobs_a_dispatch_waits_for_travel_with_it() -> None:
    dispatch = Dispatch(job_id=42, attempt=1, host="h", gpu_indices=(0, 1), kind="train", preset="p",
                        workload={"command": ["true"]}, time_limit_s=60, after=((40, 1), (41, 3)))
    assert Dispatch.from_message(json.loads(json.dumps(dispatch.to_message()))) == dispatch
    older = {k: v for k, v in dispatch.to_message().items() if k != "after"}  # from a console before the field
    assert Dispatch.from_message(older).after == ()
    with pytest.raises(ProtocolError, match="malformed dispatch"):
        Dispatch.from_message({**dispatch.to_message(), "after": [[40]]})

"""Environment parsing and the JSON-lines reporter."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from workers.protocol import TrainingProgress, decode_progress
from workers.runtime.env import EnvError, RuntimeEnv
from workers.runtime.reporting import Reporter, read_records

from .helpers import run_python


def test_env_defaults_and_values(tmp_path) -> None:
    empty = RuntimeEnv.from_env({})
    assert (empty.job_id, empty.preset, empty.max_steps, empty.progress_file) == ("local", "baseline-fp32", None, None)
    assert (empty.rank, empty.world_size, empty.is_main, empty.is_distributed) == (0, 1, True, False)
    env = RuntimeEnv.from_env({"CONSOLE_JOB_ID": "42", "CONSOLE_PRESET": "ddp", "CONSOLE_MAX_STEPS": "100",
                               "CONSOLE_PROGRESS_FILE": str(tmp_path / "p.jsonl"), "RANK": "1", "WORLD_SIZE": "2",
                               "CONSOLE_MODEL_PATH": "/models/m.pt"})
    assert env.max_steps == 100 and env.progress_file == tmp_path / "p.jsonl"
    assert env.rank == 1 and not env.is_main and env.is_distributed and env.model_path == Path("/models/m.pt")
    with pytest.raises(EnvError, match="CONSOLE_MAX_STEPS"):
        RuntimeEnv.from_env({"CONSOLE_MAX_STEPS": "lots"})


def test_reporter_writes_json_lines(tmp_path) -> None:
    path = tmp_path / "sub" / "progress.jsonl"
    reporter = Reporter(path)
    reporter.progress(step=1, max_steps=None, loss=torch.tensor(0.5), steps_per_s=2.0, samples_per_s=128.0)
    reporter.checkpoint(path=tmp_path / "ck.pt", step=1)
    reporter.result(final_loss=math.nan, accuracy=0.9)
    progress, checkpoint, result = read_records(path)
    assert progress["type"] == "progress" and progress["loss"] == 0.5 and progress["max_steps"] is None
    assert {"ts", "step", "steps_per_s", "samples_per_s"} <= set(progress)
    assert checkpoint == {**checkpoint, "type": "checkpoint", "path": str(tmp_path / "ck.pt"), "step": 1}
    assert result["final_loss"] is None and result["accuracy"] == 0.9  # NaN is not JSON


def test_only_rank_zero_reports(tmp_path) -> None:
    path = tmp_path / "progress.jsonl"
    Reporter(path, enabled=False).progress(step=1, max_steps=1, loss=1.0, steps_per_s=1.0, samples_per_s=1.0)
    assert not path.exists()


def test_a_jobs_own_metrics_are_written_as_a_progress_record_bad_ones_dropped(tmp_path, caplog) -> None:
    path = tmp_path / "progress.jsonl"
    reporter = Reporter(path)
    reporter.metrics(step=10, metrics={"val_acc": torch.tensor(0.75), "eval/loss": 0.5, "bad name": 1.0,
                                       "loss": 2.0, "nan": math.nan})
    reporter.metrics(step=11, metrics={"also bad": 1.0})  # nothing usable: no record
    [record] = read_records(path)
    decoded = decode_progress(json.dumps(record))
    assert decoded == TrainingProgress(step=10, ts=record["ts"], metrics={"val_acc": 0.75, "eval/loss": 0.5})
    assert "3 of the metrics reported at step 10 are dropped" in caplog.text


def test_a_session_reports_its_jobs_own_metrics_at_its_step(tmp_path) -> None:
    from workers.runtime import session

    path = tmp_path / "progress.jsonl"
    rt = session.start({"CONSOLE_PROGRESS_FILE": str(path), "CONSOLE_DEVICE": "cpu"}, install_signal_handler=False)
    try:
        rt.report_metrics(val_acc=torch.tensor(0.25))
        rt.report_metrics(step=7, top5=0.5)
    finally:
        rt.close()
    assert [(r["step"], r["metrics"]) for r in read_records(path)] == [(0, {"val_acc": 0.25}), (7, {"top5": 0.5})]


def test_report_metrics_needs_no_session_and_writes_where_the_agent_reads(tmp_path) -> None:
    path = tmp_path / "progress.jsonl"
    script = "import sys, workers.runtime as rt; rt.report_metrics(step=3, val_acc=0.5); print('torch' in sys.modules)"
    done = run_python(["-c", script], {"CONSOLE_PROGRESS_FILE": str(path)})
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
    [record] = read_records(path)
    assert record == {**record, "type": "progress", "step": 3, "metrics": {"val_acc": 0.5}}
    run_python(["-c", script], {"CONSOLE_PROGRESS_FILE": str(path), "RANK": "1", "WORLD_SIZE": "2"})
    assert len(read_records(path)) == 1  # only rank 0 writes


def test_catalog_import_stays_cheap() -> None:
    done = run_python(["-c", "import sys, workers.runtime.catalog; print('torch' in sys.modules)"], {})
    assert done.returncode == 0 and done.stdout.strip() == "False"

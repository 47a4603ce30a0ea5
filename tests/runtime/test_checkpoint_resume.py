"""Preemption (SIGTERM -> checkpoint -> exit 143) and resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from workers.runtime import checkpoint as ckpt
from workers.runtime import session
from workers.runtime.reporting import read_records

from .helpers import REPO, TinyMLP, subprocess_env, tiny_loader


def run_training(rt: session.Session, seed: int = 0, epochs: int = 2, sigterm_after: int | None = None):
    torch.manual_seed(seed)
    model = TinyMLP()
    model, optimizer, loader = rt.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                                          tiny_loader(batch_size=8, samples=64))
    for x, y in rt.batches(loader, epochs=epochs):
        with rt.step_context():
            loss = F.cross_entropy(model(x), y)
        rt.backward(loss)
        if sigterm_after is not None and rt.step == sigterm_after:
            os.kill(os.getpid(), signal.SIGTERM)  # preemption notice mid-step
        if rt.optimizer_step():
            rt.report(loss=loss)
    return model


def test_sigterm_checkpoints_and_resume_matches_an_uninterrupted_run(job, tmp_path) -> None:
    reference = run_training(session.start(job.env(CONSOLE_CHECKPOINT_DIR=str(tmp_path / "ref"))))

    rt = session.start(job.env())
    with pytest.raises(SystemExit) as exited:
        run_training(rt, sigterm_after=5)
    assert exited.value.code == 143
    saved = ckpt.latest_checkpoint(job.checkpoints)
    assert saved is not None and ckpt.load_file(saved)["step"] == 6  # the step in flight completes first
    assert signal.getsignal(signal.SIGTERM) is not rt._on_sigterm  # handler restored on exit
    records = read_records(job.progress)
    assert {"type": "checkpoint", "path": str(saved), "step": 6}.items() <= records[-1].items()

    rt = session.start(job.env())
    resumed = run_training(rt, seed=99)  # different init: the weights must come from the checkpoint
    assert rt.resumed_from == 6 and rt.step == 16
    steps = [r["step"] for r in read_records(job.progress) if r["type"] == "progress"]
    assert steps[-10:] == list(range(7, 17))
    for a, b in zip(reference.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # same data order, RNG and optimizer state
    assert rt.finish()["resumed_from_step"] == 6


def test_periodic_checkpoints_keep_the_last_two(job) -> None:
    rt = session.start(job.env(CONSOLE_CHECKPOINT_EVERY="2"))
    run_training(rt, epochs=1)
    rt.finish()
    assert [p.name for p in ckpt.list_checkpoints(job.checkpoints)] == ["step-00000006.pt", "step-00000008.pt"]
    assert [r["step"] for r in read_records(job.progress) if r["type"] == "checkpoint"] == [2, 4, 6, 8]


def test_max_steps_is_honoured(job) -> None:
    rt = session.start(job.env(CONSOLE_MAX_STEPS="3"))
    run_training(rt, epochs=5)
    result = rt.finish()
    assert result["steps"] == 3
    progress = [r for r in read_records(job.progress) if r["type"] == "progress"]
    assert [r["step"] for r in progress] == [1, 2, 3] and {r["max_steps"] for r in progress} == {3}


def test_progress_lines_have_the_agreed_shape(job) -> None:
    rt = session.start(job.env())
    run_training(rt, epochs=1)
    rt.finish(accuracy=0.25)
    records = read_records(job.progress)
    progress = [r for r in records if r["type"] == "progress"]
    assert len(progress) == 8
    for record in progress:
        assert isinstance(record["ts"], float) and isinstance(record["step"], int)
        assert record["max_steps"] == 8
        assert isinstance(record["loss"], float)
        assert record["steps_per_s"] > 0 and record["samples_per_s"] > 0
    result = records[-1]
    assert result["type"] == "result" and result["accuracy"] == 0.25
    assert result["steps"] == 8 and result["samples"] == 64 and result["peak_memory_bytes"] > 0
    assert result["model_path"] == str(job.output / "model.pt")
    assert (job.output / "metrics.json").exists()


def test_no_progress_file_just_logs(job, caplog) -> None:
    env = job.env()
    del env["CONSOLE_PROGRESS_FILE"]
    with caplog.at_level("INFO", logger="workers.runtime"):
        rt = session.start(env)
        run_training(rt, epochs=1)
        rt.finish()
    assert not job.progress.exists()
    assert any("step 8/8" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_run_builtin_preempted_by_sigterm_then_resumed(job) -> None:
    """A real process: SIGTERM -> exit 143 with a checkpoint; a restart resumes from its step."""
    command = [sys.executable, "-m", "workers.runtime.run_builtin", "--workload", "mlp-digits", "--kind", "train",
               "--params", '{"epochs": 500, "batch_size": 16, "hidden": 64}']
    env = subprocess_env(job.env(CONSOLE_MAX_STEPS="100000"))
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    deadline = time.monotonic() + 60
    while not any(r["type"] == "progress" for r in read_records(job.progress)):
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 143, output
    checkpoints = [r for r in read_records(job.progress) if r["type"] == "checkpoint"]
    assert len(checkpoints) == 1
    saved_step = checkpoints[0]["step"]
    assert saved_step >= 1 and os.path.exists(checkpoints[0]["path"])

    env["CONSOLE_MAX_STEPS"] = str(saved_step + 10)
    finished = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert f"resumed from {checkpoints[0]['path']}" in finished.stdout
    records = read_records(job.progress)
    result = records[-1]
    assert result["type"] == "result"
    assert result["resumed_from_step"] == saved_step and result["steps"] == saved_step + 10
    after = [r["step"] for r in records[records.index(checkpoints[0]) + 1:] if r["type"] == "progress"]
    assert after and min(after) > saved_step

"""Fixtures for the in-job runtime tests: pure PyTorch on the CPU, no database."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

# One intra-op thread: on a small shared CPU, OpenMP threads spinning against other processes make
# tiny kernels orders of magnitude slower. Subprocesses get the same through OMP_NUM_THREADS.
torch.set_num_threads(1)


@dataclass
class JobDirs:
    root: Path
    progress: Path
    checkpoints: Path
    output: Path

    def env(self, preset: str = "baseline-fp32", **extra: str) -> dict[str, str]:
        return {
            "CONSOLE_JOB_ID": "job-test",
            "CONSOLE_PRESET": preset,
            "CONSOLE_PROGRESS_FILE": str(self.progress),
            "CONSOLE_CHECKPOINT_DIR": str(self.checkpoints),
            "CONSOLE_OUTPUT_DIR": str(self.output),
            **extra,
        }


@pytest.fixture
def job(tmp_path: Path) -> JobDirs:
    return JobDirs(tmp_path, tmp_path / "progress.jsonl", tmp_path / "checkpoints", tmp_path / "output")


@pytest.fixture(autouse=True)
def _clean_distributed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("CONSOLE_"):
            monkeypatch.delenv(name, raising=False)

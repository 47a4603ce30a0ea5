"""The job's environment, as set by the agent (workers/protocol.py's JobEnvironment) and by torchrun."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from workers.protocol import (
    ENV_API_URL,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY,
    ENV_DEVICE,
    ENV_JOB_ID,
    ENV_JOB_TOKEN,
    ENV_MAX_STEPS,
    ENV_MODEL_PATH,
    ENV_OUTPUT_DIR,
    ENV_PRESET,
    ENV_PROGRESS_FILE,
    EnvError,
    JobEnvironment,
    env_int,
)

DEFAULT_PRESET = "baseline-fp32"

__all__ = ["DEFAULT_PRESET", "ENV_API_URL", "ENV_CHECKPOINT_DIR", "ENV_CHECKPOINT_EVERY", "ENV_DEVICE",
           "ENV_JOB_ID", "ENV_JOB_TOKEN", "ENV_MAX_STEPS", "ENV_MODEL_PATH", "ENV_OUTPUT_DIR", "ENV_PRESET",
           "ENV_PROGRESS_FILE", "EnvError", "RuntimeEnv"]


@dataclass(frozen=True)
class RuntimeEnv:
    job_id: str
    preset: str
    max_steps: int | None
    progress_file: Path | None
    checkpoint_dir: Path | None
    checkpoint_every: int | None
    output_dir: Path | None
    model_path: Path | None
    device: str | None  # "cpu", "cuda", "cuda:1"...; None picks cuda when available
    rank: int
    local_rank: int
    world_size: int
    gpu_memory_fraction: float | None = None

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RuntimeEnv:
        env = os.environ if env is None else env
        job = JobEnvironment.from_env(env)
        return cls(
            job_id=job.job_id or "local",
            preset=job.preset or DEFAULT_PRESET,
            max_steps=job.max_steps,
            progress_file=job.progress_file,
            checkpoint_dir=job.checkpoint_dir,
            checkpoint_every=job.checkpoint_every or None,
            output_dir=job.output_dir,
            model_path=job.model_path,
            device=job.device or None,
            # Set by torchrun; a plain `python script.py` is rank 0 of 1.
            rank=env_int(env, "RANK") or 0,
            local_rank=env_int(env, "LOCAL_RANK") or 0,
            world_size=env_int(env, "WORLD_SIZE") or 1,
            gpu_memory_fraction=job.gpu_memory_fraction,
        )

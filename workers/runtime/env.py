"""The job's environment, as set by the agent (and by torchrun for multi-process jobs)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_JOB_ID = "CONSOLE_JOB_ID"
ENV_PRESET = "CONSOLE_PRESET"
ENV_MAX_STEPS = "CONSOLE_MAX_STEPS"
ENV_PROGRESS_FILE = "CONSOLE_PROGRESS_FILE"
ENV_CHECKPOINT_DIR = "CONSOLE_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY = "CONSOLE_CHECKPOINT_EVERY"
ENV_OUTPUT_DIR = "CONSOLE_OUTPUT_DIR"
ENV_MODEL_PATH = "CONSOLE_MODEL_PATH"
ENV_DEVICE = "CONSOLE_DEVICE"
# The attempt's credential and the console's job API (GET ./, POST progress/, GET/PUT artifacts/<path>).
ENV_JOB_TOKEN = "CONSOLE_JOB_TOKEN"
ENV_API_URL = "CONSOLE_API_URL"

DEFAULT_PRESET = "baseline-fp32"


class EnvError(ValueError):
    """A CONSOLE_* variable holds a value the runtime cannot use."""


def _int_or_none(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError as exc:
        raise EnvError(f"{name} must be an integer, got {raw!r}") from exc
    if value < 0:
        raise EnvError(f"{name} must not be negative, got {value}")
    return value


def _path_or_none(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name, "").strip()
    return Path(raw) if raw else None


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

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RuntimeEnv:
        env = os.environ if env is None else env
        return cls(
            job_id=env.get(ENV_JOB_ID, "").strip() or "local",
            preset=env.get(ENV_PRESET, "").strip() or DEFAULT_PRESET,
            max_steps=_int_or_none(env, ENV_MAX_STEPS),
            progress_file=_path_or_none(env, ENV_PROGRESS_FILE),
            checkpoint_dir=_path_or_none(env, ENV_CHECKPOINT_DIR),
            checkpoint_every=_int_or_none(env, ENV_CHECKPOINT_EVERY) or None,
            output_dir=_path_or_none(env, ENV_OUTPUT_DIR),
            model_path=_path_or_none(env, ENV_MODEL_PATH),
            device=env.get(ENV_DEVICE, "").strip() or None,
            # Set by torchrun; a plain `python script.py` is rank 0 of 1.
            rank=_int_or_none(env, "RANK") or 0,
            local_rank=_int_or_none(env, "LOCAL_RANK") or 0,
            world_size=_int_or_none(env, "WORLD_SIZE") or 1,
        )

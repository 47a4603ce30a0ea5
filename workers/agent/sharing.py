"""Fractional GPUs on a host: how a job's share is held, and the watch that stops a job past its memory share.

Where NVIDIA MPS is available (the NVML backend and `nvidia-cuda-mps-control` on PATH), the agent runs one MPS
control daemon per shared GPU and starts each fractional job with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT. Elsewhere the runtime caps PyTorch's allocator at the share
(CONSOLE_GPU_MEMORY_FRACTION) and the agent watches per-process GPU memory, stopping a job that goes past its
share so that its neighbours never pay for it. Child processes inherit the environment, hence the limits.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from workers.protocol import Dispatch

logger = logging.getLogger("workers.agent")
MPS_CONTROL = "nvidia-cuda-mps-control"


@dataclass(frozen=True)
class ShareLimits:
    share: float
    memory_mb: int
    mechanism: str  # "mps", "allocator-cap+watch", "watch"


def share_limits(dispatch: Dispatch, gpu_memory_mb: int, *, mps: bool, simulated: bool) -> ShareLimits | None:
    """The limits of a fractional job on its one GPU, or None for whole-GPU jobs."""
    if dispatch.gpu_share >= 1.0 and dispatch.gpu_memory_mb is None:
        return None
    share = dispatch.gpu_share
    memory = dispatch.gpu_memory_mb if dispatch.gpu_memory_mb is not None else int(share * gpu_memory_mb)
    if dispatch.gpu_memory_mb is not None and gpu_memory_mb:
        share = max(share if share < 1.0 else 0.0, memory / gpu_memory_mb)
    mechanism = "mps" if mps else ("watch" if simulated else "allocator-cap+watch")
    return ShareLimits(share=min(share, 1.0), memory_mb=memory, mechanism=mechanism)


class MpsControl:
    """One MPS control daemon per shared GPU, started on first use."""

    def __init__(self, root: Path, enabled: bool) -> None:
        self.root = root
        self.enabled = enabled and shutil.which(MPS_CONTROL) is not None
        self._started: set[str] = set()
        self._lock = threading.Lock()

    def pipe_directory(self, gpu_uuid: str) -> Path:
        return self.root / "mps" / gpu_uuid / "pipe"

    def ensure(self, gpu_uuid: str) -> Path | None:
        if not self.enabled:
            return None
        with self._lock:
            pipe = self.pipe_directory(gpu_uuid)
            if gpu_uuid not in self._started:
                log_dir = pipe.parent / "log"
                pipe.mkdir(parents=True, exist_ok=True)
                log_dir.mkdir(parents=True, exist_ok=True)
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu_uuid, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
                       "CUDA_MPS_LOG_DIRECTORY": str(log_dir)}
                result = subprocess.run([MPS_CONTROL, "-d"], env=env, capture_output=True, text=True, timeout=30)
                if result.returncode != 0:
                    logger.warning("MPS daemon for %s did not start (%s); falling back to the allocator cap",
                                   gpu_uuid, result.stderr.strip())
                    return None
                self._started.add(gpu_uuid)
                logger.info("MPS control daemon running for GPU %s", gpu_uuid)
            return pipe

    def environment(self, limits: ShareLimits, gpu_uuid: str) -> dict[str, str]:
        pipe = self.ensure(gpu_uuid)
        if pipe is None:
            return {}
        return {"CUDA_MPS_PIPE_DIRECTORY": str(pipe),
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, round(100 * limits.share))),
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limits.memory_mb}M"}


def over_share(used_mb: dict[int, int], limits: dict[int, int]) -> list[tuple[int, int, int]]:
    """(job id, used MiB, limit MiB) for each fractional job using more GPU memory than its share."""
    return [(job_id, used, limits[job_id]) for job_id, used in used_mb.items()
            if job_id in limits and used > limits[job_id]]


def reshared_limits(current: ShareLimits | None, share: float, gpu_memory_mb: int) -> ShareLimits | None:
    """The limits of a running job whose share of its GPU changed: the memory watch at the new share (what can
    change under a running process; its MPS or allocator limits stay as they were at its start). None for a job
    that holds the whole GPU again and was started without limits."""
    if share >= 1.0 and current is None:
        return None
    share = min(max(share, 0.01), 1.0)
    # Started whole, it has no allocator cap or MPS limit in its environment: only the watch holds it.
    mechanism = current.mechanism if current is not None else "watch"
    return ShareLimits(share=share, memory_mb=int(share * gpu_memory_mb), mechanism=mechanism)

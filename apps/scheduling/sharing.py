"""Fractions of one GPU, counted exactly in integer units of 1/100 GPU.

A job is fractional when it asks for one GPU (`gpus == 1`) and either `gpu_share < 1` or `gpu_memory_mb`. On a
GPU its share in units is the larger of round(gpu_share x 100) (at least 1) and ceil(100 x memory / GPU memory);
a GPU whose memory is unknown (memory_mb 0) cannot check a memory request, so there a memory-only job takes the
whole GPU. Integer units keep sums exact (four 0.25 jobs are exactly 100 units, never 1.0000000000000002), and
a GPU holds jobs whose units add up to at most 100, which also keeps their memory within the GPU's (each job's
units are at least its memory fraction). Quotas, fair-share usage and attained service count units / 100 GPUs.
A share asked for on a multi-GPU job is ignored: gangs always take whole GPUs.
"""

from __future__ import annotations

import math

from apps.scheduling.types import PendingJob, RunningJob

FULL = 100  # units in one GPU


def is_fractional(job: PendingJob | RunningJob) -> bool:
    return job.gpus == 1 and (job.gpu_share < 1.0 or job.gpu_memory_mb is not None)


def share_units(share: float) -> int:
    """A share in 1/100s, at least 1 and at most FULL (0.1 + 0.2 -> 30, 0.333 -> 33)."""
    return min(FULL, max(1, math.floor(share * FULL + 0.5)))


def units_on(job: PendingJob | RunningJob, gpu_memory_mb: int) -> int | None:
    """Units `job` takes on a GPU with that much memory (0: unknown); None if its memory does not fit there."""
    if not is_fractional(job):
        return FULL * job.gpus
    units = share_units(job.gpu_share) if job.gpu_share < 1.0 else 0
    memory = job.gpu_memory_mb
    if memory is not None:
        if gpu_memory_mb <= 0:
            return units or FULL
        if memory > gpu_memory_mb:
            return None
        units = max(units, -(-memory * FULL // gpu_memory_mb), 1)
    return units


def min_units(job: PendingJob | RunningJob) -> int:
    """The fewest units the job could take on any GPU (for pruning and for the quota check before placement)."""
    if not is_fractional(job):
        return FULL * job.gpus
    return share_units(job.gpu_share) if job.gpu_share < 1.0 else 1


def held_units(job: RunningJob) -> int:
    """Units a running job holds in all (its allocated share for a fraction, whole GPUs otherwise)."""
    return share_units(job.gpu_share) if is_fractional(job) else FULL * job.gpus


def job_share(job: PendingJob | RunningJob) -> float:
    """GPUs per GPU of the job for service accounting: its share for a fraction, else 1."""
    return share_units(job.gpu_share) / FULL if is_fractional(job) and job.gpu_share < 1.0 else 1.0


def fmt_gpus(units: int) -> str:
    """Units as GPUs for messages: '3', '1.25'."""
    whole, rest = divmod(units, FULL)
    return str(whole) if rest == 0 else f"{units / FULL:.2f}".rstrip("0")

"""GPU-seconds of usage: the one formula that fair share, budgets, reports, baselines and the simulator count by.

A run segment holds `gpus` GPUs, each with `share_units` of its FULL (100) units: a quarter-GPU job holds
1 x 25 units, so 100 seconds of it are 25 GPU-seconds, never 100. `share_units=None` means whole GPUs.
Times are epoch seconds (floats); the console converts its datetimes before calling.
"""

from __future__ import annotations

import math

from apps.scheduling.sharing import FULL, is_fractional, share_units
from apps.scheduling.types import PendingJob, RunningJob


def gpus_held(gpus: int, share_units: int | None = None) -> float:
    """GPUs a segment holds: whole GPUs, or its share of each (units / FULL)."""
    return gpus if share_units is None or share_units >= FULL else gpus * share_units / FULL


def segment_gpu_seconds(gpus: int, share_units: int | None, seconds: float) -> float:
    """GPU-seconds of `seconds` on `gpus` GPUs holding `share_units` each (a negative span counts 0)."""
    return gpus_held(gpus, share_units) * max(0.0, seconds)


def segment_seconds(start: float, end: float | None, window_start: float, window_end: float) -> float:
    """Seconds of the segment [start, end) inside the window [window_start, window_end); an open segment
    (end None) runs to the window's end."""
    finish = window_end if end is None else min(end, window_end)
    return max(0.0, finish - max(start, window_start))


def decayed_gpu_seconds(
    gpus: int, share_units: int | None, start: float, end: float, now: float, half_life_s: float
) -> float:
    """GPU-seconds of a segment, each second weighted 2^-(age / half-life) as Slurm's fair share decays usage.

    The exact integral of the weight over [start, end]; without a half-life (<= 0) no usage is remembered.
    """
    if end <= start or half_life_s <= 0:
        return 0.0
    rate = math.log(2) / half_life_s
    # exp(-r(now-end)) - exp(-r(now-start)), written with expm1 so a long half-life keeps its precision
    weighted = -math.exp(-rate * (now - end)) * math.expm1(-rate * (end - start)) / rate
    return gpus_held(gpus, share_units) * weighted


def decay(elapsed_s: float, half_life_s: float) -> float:
    """The factor by which usage recorded `elapsed_s` ago has decayed (0 without a half-life)."""
    return 0.5 ** (elapsed_s / half_life_s) if half_life_s > 0 else 0.0


def budget_spent(used_gpu_seconds: float, budget_gpu_hours: float) -> bool:
    """Whether a team has used its GPU-hour budget for the period (a budget of 0 or less is unlimited)."""
    return budget_gpu_hours > 0 and used_gpu_seconds >= budget_gpu_hours * 3600.0


def budget_reason(team: str) -> str:
    """Why a job of a team whose budget is spent waits."""
    return (f"team {team} has used its monthly GPU-hour budget: its jobs start again when the budget is raised "
            f"or the month ends")


def budget_overrun_hours(used_gpu_seconds: float, budget_gpu_hours: float) -> float:
    """GPU-hours used beyond the budget (0 within it, and always 0 without a budget)."""
    if budget_gpu_hours <= 0:
        return 0.0
    return max(0.0, used_gpu_seconds / 3600.0 - budget_gpu_hours)


def job_share_units(job: PendingJob | RunningJob) -> int:
    """Units of each GPU the job holds for accounting: its share for a fraction, else FULL (sharing.job_share)."""
    return share_units(job.gpu_share) if is_fractional(job) and job.gpu_share < 1.0 else FULL


def job_gpus_held(job: PendingJob | RunningJob) -> float:
    """GPUs the job holds (or will): whole GPUs, or its share of each for a fraction (gpus_held)."""
    return job.gpus if job.gpu_share >= 1.0 else gpus_held(job.gpus, job_share_units(job))


def attained_gpu_seconds(job: PendingJob | RunningJob, now: float) -> float:
    """Service received so far: earlier runs plus, for a running job, its current run up to `now`."""
    if isinstance(job, RunningJob):
        current = segment_gpu_seconds(job.gpus, job_share_units(job), now - job.started_at)
        return job.attained_gpu_seconds + current
    return job.attained_gpu_seconds

"""Predicting how long a job still needs, without ever knowing its true duration.

In order of trust: declared steps x step time (observed on this run, else from the user's similar jobs); else the
run time of the user's similar jobs; else the job's time limit; else a configured default. A job that outlives
its prediction is assumed to need a while longer (a fraction of what it has run), never zero.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import median

from apps.scheduling.types import PendingJob, RunningJob
from apps.scheduling.usage import gpus_held, job_share_units

# Recent finished runs kept per (user, similarity key): old behaviour stops mattering.
HISTORY_WINDOW = 20
OVERRUN_FRACTION = 0.25
MIN_REMAINING_S = 60.0


@dataclass(frozen=True, slots=True)
class FinishedRun:
    gpus: int
    runtime_s: float
    step_s: float | None = None


class RuntimeHistory:
    """Finished runs by (user, similarity key), fed by the caller (the console's job table, the simulator)."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], deque[FinishedRun]] = {}
        self._cache: dict[tuple[str, str, int, str], float | None] = {}

    def record(self, user: str, similarity_key: str, run: FinishedRun) -> None:
        self._runs.setdefault((user, similarity_key), deque(maxlen=HISTORY_WINDOW)).append(run)
        self._cache.clear()

    def step_s(self, user: str, similarity_key: str, gpus: int) -> float | None:
        return self._estimate(user, similarity_key, gpus, "step_s")

    def runtime_s(self, user: str, similarity_key: str, gpus: int) -> float | None:
        return self._estimate(user, similarity_key, gpus, "runtime_s")

    def _estimate(self, user: str, similarity_key: str, gpus: int, attribute: str) -> float | None:
        key = (user, similarity_key, gpus, attribute)
        if key in self._cache:
            return self._cache[key]
        runs = self._runs.get((user, similarity_key), ())
        # Same GPU count first: step time depends on the gang size.
        values = [getattr(r, attribute) for r in runs if r.gpus == gpus and getattr(r, attribute) is not None]
        if not values:
            values = [getattr(r, attribute) for r in runs if getattr(r, attribute) is not None]
        result = median(values) if values else None
        self._cache[key] = result
        return result


def elapsed_run_s(job: PendingJob | RunningJob, now: float) -> float:
    """Wall-clock seconds the job has run in total (earlier runs plus the current one)."""
    # Attained service is in GPU-seconds (usage.py); a fraction of a GPU earns its share per second.
    earlier = 0.0
    if job.attained_gpu_seconds and job.gpus:
        earlier = job.attained_gpu_seconds / gpus_held(job.gpus, job_share_units(job))
    if isinstance(job, RunningJob):
        return earlier + max(0.0, now - job.started_at)
    return earlier


def _steps_done(job: PendingJob | RunningJob, now: float, step_s: float) -> float:
    if isinstance(job, RunningJob):
        reported_at = job.steps_reported_at if job.steps_reported_at is not None else now
        return job.steps_done + max(0.0, now - reported_at) / step_s
    return float(job.steps_done)


def predict_total_s(job: PendingJob | RunningJob, history: RuntimeHistory | None, default_s: float) -> float:
    """Predicted wall-clock run time of the whole job (for display and reservations)."""
    step = job.observed_step_s
    if step is None and history is not None and job.similarity_key is not None:
        step = history.step_s(job.user, job.similarity_key, job.gpus)
    if job.declared_steps is not None and step:
        return job.declared_steps * step
    if history is not None and job.similarity_key is not None:
        runtime = history.runtime_s(job.user, job.similarity_key, job.gpus)
        if runtime is not None:
            return runtime
    if job.time_limit_s is not None:
        return job.time_limit_s
    return default_s


def predict_remaining_s(
    job: PendingJob | RunningJob, now: float, history: RuntimeHistory | None, default_s: float
) -> float:
    running = isinstance(job, RunningJob)
    elapsed = elapsed_run_s(job, now)
    step = job.observed_step_s
    if step is None and history is not None and job.similarity_key is not None:
        step = history.step_s(job.user, job.similarity_key, job.gpus)
    if job.declared_steps is not None and step:
        done = _steps_done(job, now, step) if running else job.steps_done
        remaining = (job.declared_steps - done) * step
    else:
        remaining = predict_total_s(job, history, default_s) - elapsed
        if job.time_limit_s is not None:
            remaining = min(remaining, job.time_limit_s - elapsed)
    if remaining <= 0:
        return max(MIN_REMAINING_S, OVERRUN_FRACTION * elapsed)
    return remaining if remaining > MIN_REMAINING_S else MIN_REMAINING_S

"""Predicting how long a job still needs, without ever knowing its true duration, and how far to trust that.

In order of trust: declared steps x step time (observed on this run, else from similar jobs); else the run time of
similar jobs, scaled by the job's own amount of work (a built-in's epochs: similarity.work_size); else the job's
time limit; else a configured default. "Similar" is the user's own runs of the same program first, else anyone's.
A job that outlives its prediction is assumed to need a fraction of what it has run more; there is no floor.

A prediction's confidence is how often the same method got similar jobs right: each past run of the group is
predicted from the runs before it, and the confidence is the share of those within PREDICTION_TOLERANCE.
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
# The pass orders, backfills and reserves with at least this remaining time (its decisions were tuned so: without
# it fifo-backfill's mean JCT on Muri trace4 went from 534 h to 588 h). Estimates use no floor.
MIN_DECISION_REMAINING_S = 60.0
# A prediction within this fraction of the truth counts as right (for confidence).
PREDICTION_TOLERANCE = 0.25
# Confidence when no similar run can vouch for the method: the job's own step time, a time limit (an upper
# bound, usually far off), the configured default.
OWN_STEP_CONFIDENCE = 0.75
TIME_LIMIT_CONFIDENCE = 0.1
DEFAULT_CONFIDENCE = 0.0


@dataclass(frozen=True, slots=True)
class FinishedRun:
    gpus: int
    runtime_s: float
    step_s: float | None = None
    # The amount of work it was asked for (similarity.work_size), when the workload says.
    work: float | None = None


_Group = deque[FinishedRun]


class RuntimeHistory:
    """Finished runs by (user, similarity key) and by key alone, fed by the caller (the console's job table, the
    simulator)."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], _Group] = {}
        self._anyone: dict[str, _Group] = {}
        self._cache: dict[tuple[object, ...], tuple[float | None, float | None]] = {}

    def record(self, user: str, similarity_key: str, run: FinishedRun) -> None:
        self._runs.setdefault((user, similarity_key), deque(maxlen=HISTORY_WINDOW)).append(run)
        self._anyone.setdefault(similarity_key, deque(maxlen=HISTORY_WINDOW)).append(run)
        self._cache.clear()

    def step_s(self, user: str, similarity_key: str, gpus: int) -> float | None:
        return self.step_estimate(user, similarity_key, gpus)[0]

    def runtime_s(self, user: str, similarity_key: str, gpus: int, work: float | None = None) -> float | None:
        return self.runtime_estimate(user, similarity_key, gpus, work)[0]

    def step_estimate(self, user: str, similarity_key: str, gpus: int) -> tuple[float | None, float | None]:
        """(median step time of similar runs, confidence of that method on them: None if none could be checked)."""
        return self._estimate(user, similarity_key, gpus, "step_s", None)

    def runtime_estimate(
        self, user: str, similarity_key: str, gpus: int, work: float | None = None
    ) -> tuple[float | None, float | None]:
        return self._estimate(user, similarity_key, gpus, "runtime_s", work)

    def _estimate(
        self, user: str, similarity_key: str, gpus: int, attribute: str, work: float | None
    ) -> tuple[float | None, float | None]:
        key = (user, similarity_key, gpus, attribute, work)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        result: tuple[float | None, float | None] = (None, None)
        for runs in (self._runs.get((user, similarity_key)), self._anyone.get(similarity_key)):
            if runs:
                result = _predict(list(runs), gpus, attribute, work)
                if result[0] is not None:
                    break
        self._cache[key] = result
        return result


def _values(runs: list[FinishedRun], gpus: int, attribute: str, work: float | None) -> list[float]:
    """What `runs` say of a job of `gpus` asking for `work`: same GPU count first (step time depends on the gang
    size); a run time scaled by work when the job and the runs say how much (only like with like)."""
    if attribute == "runtime_s" and work is not None:
        usable = [(r, r.runtime_s * work / r.work) for r in runs if r.work]
    elif attribute == "runtime_s":
        usable = [(r, r.runtime_s) for r in runs if r.work is None]
    else:
        usable = [(r, r.step_s) for r in runs if r.step_s is not None]
    same = [value for r, value in usable if r.gpus == gpus]
    return same or [value for _, value in usable]


def _predict(
    runs: list[FinishedRun], gpus: int, attribute: str, work: float | None
) -> tuple[float | None, float | None]:
    values = _values(runs, gpus, attribute, work)
    if not values:
        return None, None
    checked = hits = 0
    for i in range(1, len(runs)):
        run = runs[i]
        actual = run.step_s if attribute == "step_s" else run.runtime_s
        if not actual:
            continue
        earlier = _values(runs[:i], run.gpus, attribute, run.work if attribute == "runtime_s" else None)
        if attribute == "runtime_s" and (run.work is None) != (work is None):
            continue
        if earlier:
            checked += 1
            hits += abs(median(earlier) - actual) <= PREDICTION_TOLERANCE * actual
    return median(values), (hits / checked if checked else None)


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


@dataclass(frozen=True, slots=True)
class Prediction:
    total_s: float
    # From steps (declared x step time): the remaining time follows the steps done, not the time run.
    by_steps: bool
    step_s: float | None
    confidence: float


def predict(job: PendingJob | RunningJob, history: RuntimeHistory | None, default_s: float) -> Prediction:
    """The whole job's predicted run time, how it was made, and its confidence."""
    step, confidence = job.observed_step_s, None
    if step is not None:
        if history is not None and job.similarity_key is not None:
            confidence = history.step_estimate(job.user, job.similarity_key, job.gpus)[1]
        confidence = OWN_STEP_CONFIDENCE if confidence is None else max(confidence, OWN_STEP_CONFIDENCE)
    elif history is not None and job.similarity_key is not None:
        step, confidence = history.step_estimate(job.user, job.similarity_key, job.gpus)
    if job.declared_steps is not None and step:
        return Prediction(
            job.declared_steps * step, True, step, confidence if confidence is not None else 0.5
        )
    if history is not None and job.similarity_key is not None:
        runtime, confidence = history.runtime_estimate(job.user, job.similarity_key, job.gpus, job.work_size)
        if runtime is not None:
            if job.time_limit_s is not None:
                runtime = min(runtime, job.time_limit_s)
            return Prediction(runtime, False, None, confidence if confidence is not None else 0.5)
    if job.time_limit_s is not None:
        return Prediction(job.time_limit_s, False, None, TIME_LIMIT_CONFIDENCE)
    return Prediction(default_s, False, None, DEFAULT_CONFIDENCE)


def predict_total_s(job: PendingJob | RunningJob, history: RuntimeHistory | None, default_s: float) -> float:
    """Predicted wall-clock run time of the whole job (for display and reservations)."""
    return predict(job, history, default_s).total_s


def predict_remaining(
    job: PendingJob | RunningJob, now: float, history: RuntimeHistory | None, default_s: float
) -> tuple[float, float]:
    """(predicted remaining seconds, confidence)."""
    prediction = predict(job, history, default_s)
    elapsed = elapsed_run_s(job, now)
    if prediction.by_steps and prediction.step_s and job.declared_steps is not None:
        done = _steps_done(job, now, prediction.step_s)
        remaining = (job.declared_steps - done) * prediction.step_s
    else:
        remaining = prediction.total_s - elapsed
        if job.time_limit_s is not None:
            remaining = min(remaining, job.time_limit_s - elapsed)
    if remaining <= 0:
        # Past its prediction: the longer it has run, the longer it is likely to run on (and the less we know).
        return OVERRUN_FRACTION * elapsed, min(prediction.confidence, TIME_LIMIT_CONFIDENCE)
    return remaining, prediction.confidence


def predict_remaining_s(
    job: PendingJob | RunningJob, now: float, history: RuntimeHistory | None, default_s: float
) -> float:
    return predict_remaining(job, now, history, default_s)[0]

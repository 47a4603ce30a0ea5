"""Predicting how long a job still needs, without ever knowing its true duration, and how far to trust that.

In order of trust: declared steps x step time (observed on this run, else from similar jobs); else the run time of
similar jobs, scaled by the job's own amount of work (a built-in's epochs: similarity.work_size); else the job's
time limit; else a configured default. "Similar" has one rule (RuntimeHistory.similar_runs), which the order's
estimate of similar runs (similar_remaining) follows too: runs of the same program and GPU count, the user's own
first, else anyone's; else at least MIN_SIMILAR_RUNS of any GPU count.
A job that outlives its prediction is assumed to need a fraction of what it has run more; there is no floor.

A prediction's confidence is how often the same method got similar jobs right: each past run of the group is
predicted from the runs before it, and the confidence is the share of those within PREDICTION_TOLERANCE.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Collection, KeysView
from dataclasses import dataclass
from itertools import accumulate
from statistics import median

from apps.scheduling.types import PendingJob, RunningJob
from apps.scheduling.usage import job_gpus_held

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
    # The steps it declared (None: none) and the steps it really ran, for its user's declaration accuracy.
    declared_steps: int | None = None
    steps: int | None = None


# Finished runs whose run times the attained-service queues are learned from.
SERVICE_WINDOW = 1000
# Below this many finished runs the queues are Tiresias' published thresholds instead (GPU-seconds there; run
# seconds here).
MIN_SERVICE_HISTORY = 20
COLD_THRESHOLDS_S = (3250.0, 7200.0, 18000.0)
# Spread (standard deviation of the natural log) assumed of a queue's remaining GPU-time before there is history.
COLD_SIGMA = 2.0
# A user's declaration error (log of real / declared steps) kept, and the prior it is shrunk toward: a user with no
# record is trusted as if their declarations were off by a factor of about e^0.5 (1.6x), weighing as PRIOR_WEIGHT
# declarations.
DECLARATION_WINDOW = 50
PRIOR_DECLARATION_SIGMA = 0.5
PRIOR_DECLARATION_WEIGHT = 2.0
# Similar runs (similar_remaining) are trusted as far as they have foretold the run time of the program's later runs:
# the root mean square of log(real / foretold) over its recent finished runs, shrunk toward a prior like a user's
# declarations. A program whose similar runs have been off by more than MAX_SIMILAR_SIGMA (e^1: 2.7x) is not
# ordered by them at all (attained service alone: Muri trace4 without declarations, where a model name says
# nothing of a job's length, had its median JCT at 138 h against Tiresias' 5 h, from similar runs believed as
# sure as they agreed with each other).
SIMILAR_WINDOW = 50
# Runs of other GPU counts than the job's are similar runs only this many at least (one of the same GPU count is
# enough: Pollux's workloads without declarations, 1.07-1.11x the SRSF oracle against 1.12-1.31x with three of
# either asked for; benchmarks/traces/pollux/README.md).
MIN_SIMILAR_RUNS = 3
PRIOR_SIMILAR_SIGMA = 0.5
PRIOR_SIMILAR_WEIGHT = 2.0
MAX_SIMILAR_SIGMA = 1.0
# The least spread trusted of any estimate (an exact declaration still only says the remaining steps).
MIN_SIGMA = 0.05


@dataclass(frozen=True, slots=True)
class ServiceQueue:
    """One attained-service queue: jobs that have run at least `floor` seconds (attained GPU-seconds over the GPUs
    they hold; less than the next queue's floor). `log_remaining`: log of the run time a job there is worth ordering
    by (learn_queues: from what finished jobs past `floor` still needed; the order multiplies it by the job's GPUs);
    `sigma`: the spread of the log of those needs."""

    floor: float
    log_remaining: float
    sigma: float


def _log_spread(logs: list[float]) -> float:
    if len(logs) < 2:
        return COLD_SIGMA
    mean = sum(logs) / len(logs)
    return max(MIN_SIGMA, math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)))


def learn_queues(run_times: list[float], quantiles: tuple[float, ...]) -> tuple[ServiceQueue, ...]:
    """Queues with floors at `quantiles` of the finished jobs' run times (sorted `run_times`, seconds), each valued
    by the run time its finished jobs needed past its floor: below the median, by the Gittins index of that
    (gittins_remaining: a young job has a real chance to finish soon); from the median on, by its mean (a job that
    has run long is worth what the long ones still need, which in a heavy tail grows with the time run). Before
    MIN_SERVICE_HISTORY runs: Tiresias' thresholds, each queue expected to need up to the next one (4x the last
    for the last).

    Gittins all the way (the earlier rule) values the tail queues from a handful of very long runs, often below the
    queues before them, so that jobs that had run longest went first; the mean there: Muri trace3 without
    declarations 86.6 h against 102.5 h, trace4 346 h against 343 h (benchmarks/scheduler.py)."""
    if len(run_times) < MIN_SERVICE_HISTORY:
        cold = (0.0, *COLD_THRESHOLDS_S)
        ceilings = (*COLD_THRESHOLDS_S, 4 * COLD_THRESHOLDS_S[-1])
        return tuple(
            ServiceQueue(floor, math.log(max(ceiling - floor, 1.0)), COLD_SIGMA)
            for floor, ceiling in zip(cold, ceilings, strict=True)
        )
    n = len(run_times)
    median = run_times[n // 2]
    floors = [0.0]
    for q in quantiles:
        floor = run_times[min(n - 1, int(q * n))]
        if floor > floors[-1]:
            floors.append(floor)
    queues = []
    for floor in floors:
        left = [max(s - floor, 1.0) for s in run_times[bisect_right(run_times, floor):]]
        if len(left) < 2:
            break
        logs = [math.log(x) for x in left]
        value = gittins_remaining(left) if floor < median else sum(left) / len(left)
        queues.append(ServiceQueue(floor, math.log(value), _log_spread(logs)))
    return tuple(queues)


def gittins_remaining(left: list[float]) -> float:
    """The inverse Gittins index of a job known only to need one of `left` (sorted, ascending) more: the least,
    over a further quantum q, of the GPU-time expected to be spent in q over the chance of finishing within it.
    Ordering by it (least first) minimizes mean completion time for jobs of unknown size (Gittins, 1989)."""
    n = len(left)
    spent = 0.0
    best = math.inf
    for k, x in enumerate(left, start=1):
        spent += x
        # quantum up to the k-th residual: jobs finishing within it spend their own, the others all of x
        best = min(best, (spent + x * (n - k)) / k)
    return best


def declaration_error(steps: int, declared_steps: int) -> float:
    """What one finished run adds to its user's declaration record: log(real / declared steps)."""
    return math.log(steps / declared_steps)


def declaration_fit(errors: Collection[float]) -> tuple[float, float]:
    """(scale, spread) of a user's declarations from the errors (declaration_error) of their recent runs: e to the
    mean error and the root mean square around it, both shrunk toward the prior (no bias, PRIOR_DECLARATION_SIGMA)
    while the runs are few (RuntimeHistory.declared_scale and declaration_sigma)."""
    weight = PRIOR_DECLARATION_WEIGHT
    bias = sum(errors) / (len(errors) + weight)
    squares = sum((e - bias) ** 2 for e in errors) + weight * PRIOR_DECLARATION_SIGMA**2
    return math.exp(bias), max(MIN_SIGMA, math.sqrt(squares / (len(errors) + weight)))


_Group = deque[FinishedRun]


class RuntimeHistory:
    """Finished runs by (user, similarity key) and by key alone, fed by the caller (the console's job table, the
    simulator)."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], _Group] = {}
        self._anyone: dict[str, _Group] = {}
        self._cache: dict[tuple[object, ...], tuple[float | None, float | None]] = {}
        self._run_times: deque[float] = deque(maxlen=SERVICE_WINDOW)
        self._sorted_run_times: list[float] | None = None
        # the sorted run times' running sums (expected_hold_s), from 0: cumulative[i] is the sum of the first i
        self._cumulative_run_times: list[float] | None = None
        self._queues: dict[tuple[float, ...], tuple[ServiceQueue, ...]] = {}
        # user -> log(real steps / declared steps) of their finished runs
        self._declared: dict[str, deque[float]] = {}
        # user -> (declared_scale, declaration_sigma)
        self._declaration_fits: dict[str, tuple[float, float]] = {}
        self._residuals: dict[tuple[object, ...], tuple[float, float] | None] = {}
        # similarity key -> log(real / foretold run time) of its finished runs, foretold by similar_remaining
        self._similar_errors: dict[str, deque[float]] = {}
        self._similar_sigma: dict[str, float] = {}

    def record(self, user: str, similarity_key: str, run: FinishedRun) -> None:
        if run.work is None and run.runtime_s > 0:
            foretold = self.similar_remaining(user, similarity_key, run.gpus, 0.0)
            if foretold is not None:
                self._similar_errors.setdefault(similarity_key, deque(maxlen=SIMILAR_WINDOW)).append(
                    math.log(run.runtime_s) - foretold[0]
                )
                self._similar_sigma.pop(similarity_key, None)
        self._runs.setdefault((user, similarity_key), deque(maxlen=HISTORY_WINDOW)).append(run)
        self._anyone.setdefault(similarity_key, deque(maxlen=HISTORY_WINDOW)).append(run)
        self._cache.clear()
        self._residuals.clear()
        if run.runtime_s > 0 and run.gpus > 0:
            self._run_times.append(run.runtime_s)
            self._queues.clear()
            self._sorted_run_times = None
            self._cumulative_run_times = None
        if run.declared_steps and run.steps:
            self._declared.setdefault(user, deque(maxlen=DECLARATION_WINDOW)).append(
                declaration_error(run.steps, run.declared_steps)
            )
            self._declaration_fits.pop(user, None)

    def programs(self) -> KeysView[str]:
        """The similarity keys of the finished runs recorded (a live view): a lookup by any other key (step_estimate,
        runtime_estimate, similar_remaining) answers nothing."""
        return self._anyone.keys()

    def median_run_s(self) -> float | None:
        """The median run time of the finished runs recorded lately (the service window), None before
        MIN_SERVICE_HISTORY of them."""
        times = self.run_times()
        return statistics.median(times) if times else None

    def run_times(self) -> list[float]:
        """The run times of the finished runs recorded lately (the service window), ascending (cached until the next
        record: do not change it); empty before MIN_SERVICE_HISTORY of them."""
        if len(self._run_times) < MIN_SERVICE_HISTORY:
            return []
        if self._sorted_run_times is None:
            self._sorted_run_times = sorted(self._run_times)
        return self._sorted_run_times

    def expected_hold_s(self, elapsed: float, stopped_at: float) -> float | None:
        """The run time still to go, on average, of a job that has run `elapsed` seconds and is stopped once it has
        run `stopped_at` (math.inf: never), as the cluster's finished runs that outlasted `elapsed` say (each
        counted up to `stopped_at`): how long it holds its GPUs in expectation. A median-like prediction of its run
        says far less where run times are heavy-tailed (most runs minutes, a few days: Muri trace4). None before
        MIN_SERVICE_HISTORY runs, or when none outlasted `elapsed`."""
        run_times = self.run_times()
        if not run_times:
            return None
        if self._cumulative_run_times is None:
            self._cumulative_run_times = [0.0, *accumulate(run_times)]
        cumulative = self._cumulative_run_times
        first = bisect_right(run_times, elapsed)
        outlasted = len(run_times) - first
        if outlasted == 0:
            return None
        capped = bisect_right(run_times, stopped_at, lo=first)
        total = cumulative[capped] - cumulative[first]
        if capped < len(run_times):  # (the runs past stopped_at count as stopped_at)
            total += (len(run_times) - capped) * stopped_at
        return total / outlasted - elapsed

    def service_queues(self, quantiles: tuple[float, ...]) -> tuple[ServiceQueue, ...]:
        """The attained-service queues learned from finished runs (learn_queues), cached until the next record."""
        queues = self._queues.get(quantiles)
        if queues is None:
            queues = self._queues[quantiles] = learn_queues(self.run_times(), quantiles)
        return queues

    def similar_sigma(self, similarity_key: str) -> float:
        """How far off similar runs (similar_remaining at submission) have been about the run time of the program's
        later runs: the root mean square of log(real / foretold), shrunk toward PRIOR_SIMILAR_SIGMA while few."""
        sigma = self._similar_sigma.get(similarity_key)
        if sigma is None:
            errors = self._similar_errors.get(similarity_key, ())
            squares = sum(e * e for e in errors) + PRIOR_SIMILAR_WEIGHT * PRIOR_SIMILAR_SIGMA**2
            sigma = self._similar_sigma[similarity_key] = max(
                MIN_SIGMA, math.sqrt(squares / (len(errors) + PRIOR_SIMILAR_WEIGHT))
            )
        return sigma

    def declaration_sigma(self, user: str) -> float:
        """How far off `user`'s declared steps have been once scaled by declared_scale: the root mean square of
        log(real / declared) less their bias over their recent finished runs, shrunk toward
        PRIOR_DECLARATION_SIGMA while they are few."""
        return self._declaration_fit(user)[1]

    def declaration_runs(self, user: str) -> int:
        """How many of `user`'s recent finished runs declared their steps (what declared_scale learns from)."""
        return len(self._declared.get(user, ()))

    def declared_scale(self, user: str) -> float:
        """What `user`'s declared steps are to be multiplied by: e to the mean of log(real / declared) over their
        recent finished runs, shrunk toward 1 (no bias) while they are few. Users who always ask for three times
        what they run (HPC users do, of their time limits) are believed a third; iid noise averages out."""
        return self._declaration_fit(user)[0]

    def _declaration_fit(self, user: str) -> tuple[float, float]:
        fit = self._declaration_fits.get(user)
        if fit is None:
            fit = self._declaration_fits[user] = declaration_fit(self._declared.get(user, ()))
        return fit

    def similar_runs(
        self, user: str, similarity_key: str, gpus: int, usable: Callable[[FinishedRun], bool],
        least_of_any_count: int = MIN_SIMILAR_RUNS,
    ) -> tuple[list[FinishedRun], list[FinishedRun]]:
        """Which finished runs speak for a job of `user`, program `similarity_key` and `gpus` (the one rule; of the
        runs `usable` keeps): those of the same GPU count (a program's step and run time change with its GPUs),
        the user's own before anyone's, one being enough; else runs of any GPU count, at least
        `least_of_any_count` of them, the user's own first. (chosen runs, the group they were chosen from: the
        user's runs of the program or anyone's), both empty when none."""
        groups = [
            [r for r in runs if usable(r)]
            for runs in (self._runs.get((user, similarity_key)), self._anyone.get(similarity_key))
            if runs
        ]
        for runs in groups:
            same = [r for r in runs if r.gpus == gpus]
            if same:
                return same, runs
        for runs in groups:
            if runs and len(runs) >= least_of_any_count:
                return runs, runs
        return [], []

    def similar_remaining(
        self, user: str, similarity_key: str, gpus: int, elapsed_s: float
    ) -> tuple[float, float] | None:
        """(log of the median remaining run time, its spread) of the similar runs (similar_runs) that outlasted
        `elapsed_s`, or None. One run's spread is MIN_SIGMA: how far to believe it is the program's record
        (similar_sigma, which the caller weighs by). Runs that say their work size are left out (their run time
        scales with it; predict() handles them)."""
        if similarity_key not in self._anyone:  # (no run of the program at all: nothing to look up)
            return None
        # (elapsed rounded down to 10 minutes, so that one answer serves many jobs and passes)
        elapsed_s = 600.0 * (elapsed_s // 600) if elapsed_s > 0 else 0.0
        key = (user, similarity_key, gpus, elapsed_s)
        if key in self._residuals:
            return self._residuals[key]
        runs, _ = self.similar_runs(
            user, similarity_key, gpus, lambda r: r.work is None and r.runtime_s > elapsed_s + 1.0
        )
        logs = [math.log(r.runtime_s - elapsed_s) for r in runs]
        result = (median(logs), _log_spread(logs) if len(logs) > 1 else MIN_SIGMA) if logs else None
        self._residuals[key] = result
        return result

    def step_s(self, user: str, similarity_key: str, gpus: int) -> float | None:
        if similarity_key not in self._anyone:  # (as _estimate says, without its two calls: every waiting job asks)
            return None
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
        """(median of what the similar runs (similar_runs) say of the job's `attribute`, how often that has been
        right of the program's runs: each predicted so from the earlier runs of the group, the share within
        PREDICTION_TOLERANCE; None where none could be checked)."""
        if similarity_key not in self._anyone:  # (no run of the program at all: nothing to look up)
            return None, None
        key = (user, similarity_key, gpus, attribute, work)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        # (a step time of another GPU count still weighs a declaration roughly, where none would leave it out:
        # Muri trace3 with exact declarations 55.3 h with three such runs asked for, 54.1 h with one)
        least = 1 if attribute == "step_s" else MIN_SIMILAR_RUNS
        runs, group = self.similar_runs(user, similarity_key, gpus, _usable(attribute, work), least)
        result: tuple[float | None, float | None] = (None, None)
        if runs:
            checked = hits = 0
            for i in range(1, len(group)):
                run = group[i]
                actual = run.step_s if attribute == "step_s" else run.runtime_s
                earlier = _pick(group[:i], run.gpus, least)
                if actual and earlier:
                    checked += 1
                    foretold = median(_value(r, attribute, run.work) for r in earlier)
                    hits += abs(foretold - actual) <= PREDICTION_TOLERANCE * actual
            result = median(_value(r, attribute, work) for r in runs), (hits / checked if checked else None)
        self._cache[key] = result
        return result


def _usable(attribute: str, work: float | None) -> Callable[[FinishedRun], bool]:
    """The runs that say something of `attribute` for a job asking for `work`: a run time scaled by work only when
    the job and the run both say how much (like with like); a step time whenever the run reported one."""
    if attribute == "step_s":
        return lambda r: r.step_s is not None
    if work is not None:
        return lambda r: bool(r.work)
    return lambda r: r.work is None


def _value(run: FinishedRun, attribute: str, work: float | None) -> float:
    if attribute == "step_s":
        return run.step_s or 0.0
    return run.runtime_s * work / run.work if work is not None and run.work else run.runtime_s


def _pick(runs: list[FinishedRun], gpus: int, least_of_any_count: int) -> list[FinishedRun]:
    """similar_runs' rule within one group of runs."""
    same = [r for r in runs if r.gpus == gpus]
    return same or (runs if len(runs) >= least_of_any_count else [])


def elapsed_run_s(job: PendingJob | RunningJob, now: float) -> float:
    """Wall-clock seconds the job has run in total (earlier runs plus the current one)."""
    # Attained service is in GPU-seconds (usage.py); a fraction of a GPU earns its share per second.
    earlier = 0.0
    if job.attained_gpu_seconds and job.gpus:
        earlier = job.attained_gpu_seconds / job_gpus_held(job)
    if isinstance(job, RunningJob):
        return earlier + max(0.0, now - job.started_at)
    return earlier


def steps_done(job: PendingJob | RunningJob, now: float, step_s: float) -> float:
    if isinstance(job, RunningJob):
        reported_at = job.steps_reported_at if job.steps_reported_at is not None else now
        return job.steps_done + max(0.0, now - reported_at) / step_s
    return float(job.steps_done)


@dataclass(slots=True)  # (not frozen: made for every job of every pass, and five times cheaper so)
class Prediction:
    total_s: float
    # From steps (declared x step time): the remaining time follows the steps done, not the time run.
    by_steps: bool
    step_s: float | None
    confidence: float


# (total seconds, by steps, step seconds, confidence): Prediction's fields, as the pass makes them (a tuple costs
# less to make than the dataclass, ten thousand times a pass).
_Predicted = tuple[float, bool, float | None, float]


def believed_steps(job: PendingJob | RunningJob, history: RuntimeHistory | None) -> float | None:
    """The steps the job declared as its user's record says to believe them (RuntimeHistory.declared_scale), or
    None where it declared none: the one reading of a declaration that predictions and the order make."""
    declared = job.declared_steps
    if declared is None:
        return None
    return declared * history.declared_scale(job.user) if history is not None else float(declared)


def _predicted(job: PendingJob | RunningJob, history: RuntimeHistory | None, default_s: float) -> _Predicted:
    step, confidence = job.observed_step_s, None
    if step is not None:
        if history is not None and job.similarity_key is not None:
            confidence = history.step_estimate(job.user, job.similarity_key, job.gpus)[1]
        confidence = OWN_STEP_CONFIDENCE if confidence is None else max(confidence, OWN_STEP_CONFIDENCE)
    elif history is not None and job.similarity_key is not None:
        step, confidence = history.step_estimate(job.user, job.similarity_key, job.gpus)
    declared = believed_steps(job, history)
    if declared is not None and step:
        return declared * step, True, step, confidence if confidence is not None else 0.5
    if history is not None and job.similarity_key is not None:
        runtime, confidence = history.runtime_estimate(job.user, job.similarity_key, job.gpus, job.work_size)
        if runtime is not None:
            if job.time_limit_s is not None:
                runtime = min(runtime, job.time_limit_s)
            return runtime, False, None, confidence if confidence is not None else 0.5
    if job.time_limit_s is not None:
        return job.time_limit_s, False, None, TIME_LIMIT_CONFIDENCE
    return default_s, False, None, DEFAULT_CONFIDENCE


def predict(job: PendingJob | RunningJob, history: RuntimeHistory | None, default_s: float) -> Prediction:
    """The whole job's predicted run time, how it was made, and its confidence."""
    return Prediction(*_predicted(job, history, default_s))


def predict_total_s(job: PendingJob | RunningJob, history: RuntimeHistory | None, default_s: float) -> float:
    """Predicted wall-clock run time of the whole job (for display and reservations)."""
    return _predicted(job, history, default_s)[0]


def predict_remaining(
    job: PendingJob | RunningJob, now: float, history: RuntimeHistory | None, default_s: float
) -> tuple[float, float]:
    """(predicted remaining seconds, confidence)."""
    running = isinstance(job, RunningJob)
    # (a waiting job that never ran, most of a long queue: it has run 0 s)
    elapsed = elapsed_run_s(job, now) if running or job.attained_gpu_seconds else 0.0
    declared = believed_steps(job, history)
    return _remaining(job, _predicted(job, history, default_s), now, elapsed, running, declared)


def _remaining(
    job: PendingJob | RunningJob, predicted: _Predicted, now: float, elapsed: float, running: bool,
    declared: float | None,
) -> tuple[float, float]:
    total_s, by_steps, step_s, confidence = predicted
    if by_steps and step_s and declared is not None:
        done = steps_done(job, now, step_s) if running else float(job.steps_done)
        remaining = (declared - done) * step_s
    else:
        remaining = total_s - elapsed
        if job.time_limit_s is not None:
            remaining = min(remaining, job.time_limit_s - elapsed)
    if remaining <= 0:
        # Past its prediction: the longer it has run, the longer it is likely to run on (and the less we know),
        # but never past its time limit, where it is stopped.
        remaining = OVERRUN_FRACTION * elapsed
        if job.time_limit_s is not None:
            remaining = min(remaining, max(0.0, job.time_limit_s - elapsed))
        return remaining, min(confidence, TIME_LIMIT_CONFIDENCE)
    return remaining, confidence


def predict_remaining_s(
    job: PendingJob | RunningJob, now: float, history: RuntimeHistory | None, default_s: float
) -> float:
    return predict_remaining(job, now, history, default_s)[0]

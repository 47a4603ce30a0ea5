"""The order of jobs within a priority class: predicted remaining GPU-time, fair share, aging.

score = remaining GPU-seconds x team penalty x user penalty / (1 + waited / aging_s); lower goes first. A job that
declares its steps and has run counts its whole declared size until 40 % of it is left (DECLARED_SIZE_FRACTION),
and ages slower (job_aging_s).
The fair-share penalty follows Slurm's classic factor 2^(-usage/shares), turned into a multiplier:
2 ** (weight x usage fraction / share fraction), so a team that used exactly its share pays 2x, an idle team 1x.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace

from apps.scheduling.config import PolicyConfig
from apps.scheduling.prediction import (
    DEFAULT_CONFIDENCE,
    MAX_SIMILAR_SIGMA,
    MIN_SIGMA,
    OVERRUN_FRACTION,
    OWN_STEP_CONFIDENCE,
    TIME_LIMIT_CONFIDENCE,
    RuntimeHistory,
    ServiceQueue,
    believed_steps,
    elapsed_run_s,
    steps_done,
)
from apps.scheduling.types import PendingJob, RunningJob, Snapshot
from apps.scheduling.usage import job_gpus_held

MAX_EXPONENT = 30.0


def _penalty(usage: float, total_usage: float, share: float, total_share: float, weight: float) -> float:
    if weight <= 0 or total_usage <= 0 or share <= 0 or total_share <= 0:
        return 1.0
    exponent = weight * (usage / total_usage) / (share / total_share)
    return float(2.0 ** min(exponent, MAX_EXPONENT))


class FairShare:
    def __init__(self, snapshot: Snapshot, weight: float) -> None:
        quotas = snapshot.quotas
        total_usage = sum(q.recent_usage_gpu_seconds for q in quotas.values())
        total_share = sum(q.share for q in quotas.values())
        self._team = {
            team: _penalty(q.recent_usage_gpu_seconds, total_usage, q.share, total_share, weight)
            for team, q in quotas.items()
        }
        users: dict[str, set[str]] = defaultdict(set)
        jobs: tuple[PendingJob | RunningJob, ...] = (*snapshot.pending, *snapshot.running)
        for job in jobs:
            users[job.team].add(job.user)
        self._user: dict[tuple[str, str], float] = {}
        for team, q in quotas.items():
            members = users[team] | set(q.user_shares) | set(q.user_recent_usage_gpu_seconds)
            usage = q.user_recent_usage_gpu_seconds
            team_usage = sum(usage.values())
            team_shares = sum(q.user_shares.get(u, 1.0) for u in members)
            for user in members:
                self._user[(team, user)] = _penalty(
                    usage.get(user, 0.0), team_usage, q.user_shares.get(user, 1.0), team_shares, weight
                )

    def penalty(self, team: str, user: str) -> float:
        return self._team.get(team, 1.0) * self._user.get((team, user), 1.0)


# The share of the cluster's runs that a "long run" outlasts (with_learned_aging).
LONG_RUN_QUANTILE = 0.9


def with_learned_aging(config: PolicyConfig, snapshot: Snapshot) -> PolicyConfig:
    """The config a pass runs with: its aging time no longer than `aging_long_run_multiple` times the 90th
    percentile of the cluster's run times, once enough jobs have finished (RuntimeHistory.run_times), nor shorter
    than `aging_floor_s` (unless the configured aging itself is). The running jobs count with the time they have
    run so far: early on, the long runs have not finished yet, and the finished ones alone would say the cluster's
    runs are short (Muri trace3 at loads 0.9, 1.0 and 1.1 in three declaration modes: mean JCT 0.4 % lower
    than with the fixed ten days this way, 0.15 % higher with the finished runs alone)."""
    history = snapshot.history
    finished = history.run_times() if history is not None and config.aging_long_run_multiple > 0 else []
    if not finished:
        return config
    runs = sorted([*finished, *(elapsed_run_s(job, snapshot.now) for job in snapshot.running)])
    long_run = runs[int(LONG_RUN_QUANTILE * (len(runs) - 1))]
    learned = max(config.aging_long_run_multiple * long_run, config.aging_floor_s)
    if learned >= config.aging_s:
        return config
    return replace(config, aging_s=learned)


def aging_boost(submitted_at: float, now: float, aging_s: float) -> float:
    if aging_s <= 0:
        return 1.0
    return 1.0 + max(0.0, now - submitted_at) / aging_s


def job_aging_s(job: PendingJob | RunningJob, config: PolicyConfig) -> float:
    """The aging time of the job's boost: the pass's (config.aging_s, learned: with_learned_aging), times
    `declared_aging_multiple` for a job that declares its steps when the order is by size. Such a job is ordered by
    its whole declared size (DECLARED_SIZE_FRACTION), and long ones wait behind short ones by design; aged as fast as
    a job ordered by its attained service alone, the 18-hour gangs of 32 GPUs went ahead of the 8-GPU jobs of 48
    hours they outweigh (Muri trace3, exact declarations, this order at a fraction of a third: aging x1 55.4 h, x3
    50.2 h, x10 50.7 h). With wide gangs' lower bar to preempt (preemption.shorter_ratio) and the fraction 0.4:
    x4 49.1 h, x6 48.6 h, x10 48.5 h (p99 786 / 835 / 848 h; Tiresias 1,389 h); x20 at a half 49.6 / 1,037 h.
    """
    return config.aging_s if job.declared_steps is None else declared_aging_s(config)


def declared_aging_s(config: PolicyConfig) -> float:
    """job_aging_s of a job that declares its steps."""
    if config.ordering in ("fifo", "fair-share"):
        return config.aging_s
    return config.aging_s * config.declared_aging_multiple


# A job that declares its steps and has run counts its whole declared size (steps x step time x GPUs) until its
# remaining time is within this fraction of it, then remaining / fraction (service_estimate): shortest job first by
# size, so that a long job preempted early does not go ahead of a shorter one, and a job near its end is not
# stopped. Muri trace3, exact declarations (SRSF oracle 51.1 h): shortest remaining first 54.1 h; this order at a
# half with aging x3 for jobs that declare (job_aging_s) 50.8 h; at 0.4 with aging x6 and wide gangs' lower bar to
# preempt (preemption.shorter_ratio) 48.6 h, partial 60.3 -> 57.4 h; fractions 0.2 / 0.33 gain a little more on
# trace3 but the Pollux workloads at 1.5x load with noisy declarations pay for a smaller one (0.33: 0.839 h, p99
# 14.7 h; 0.5: 0.799 / 13.7 h; Tiresias 0.951 / 13.9 h; benchmarks/traces/muri/README.md).
DECLARED_SIZE_FRACTION = 0.4

# The attained-service queues' floors, as quantiles of the run times of the cluster's finished jobs.
SERVICE_QUANTILES = (0.25, 0.5, 0.75, 0.9)
# A queue speaks of the whole cluster's jobs, never so surely of one job (the spread weighed is at least this):
# a user with a good record who declares a job far larger than usual is believed.
MIN_QUEUE_SIGMA = 1.0


@dataclass(slots=True)  # (not frozen: made for every job of every pass, and five times cheaper so)
class ServiceEstimate:
    """What the order knows of a job's remaining GPU-time: the blend (GPU-seconds) and the attained-service queue
    the job is in (its floor was crossed; `next_floor`: the GPU-seconds at which it moves on, None in the last)."""

    remaining_gpu_s: float
    queue: int
    next_floor: float | None


def _queue_of(queues: tuple[ServiceQueue, ...], attained: float) -> int:
    if attained <= 0.0:  # (a job never run, most of a long queue: the floors rise from 0)
        return 0
    index = 0
    for i, queue in enumerate(queues):
        if attained >= queue.floor:
            index = i
    return index


def estimate_service(
    job: PendingJob | RunningJob,
    now: float,
    history: RuntimeHistory | None,
    quantiles: tuple[float, ...] = SERVICE_QUANTILES,
) -> ServiceEstimate:
    """Remaining GPU-time as the pass orders by it: the estimates at hand, each as a log-normal guess, combined
    by their precision (1 / spread^2):

    - attained service (2D-LAS): the job's queue says what run time finished jobs that had run this long still
      needed (a Gittins index for young jobs, the mean for older ones: prediction.learn_queues), times its GPUs;
      always there, learned from the cluster's history (floors at quantiles of finished jobs' run times);
    - declared steps left x step time (observed, else of similar runs), as sure as the user's past declarations
      were right (RuntimeHistory.declaration_sigma); once the job has run past what it declared, a fraction of
      what it has run (prediction.py's overrun rule: trace3 noisy 61 h against 64 h with attained service alone);
    - similar finished runs (RuntimeHistory.similar_runs) that outlasted the job's run so far, as sure as they
      agree with each other and as they have foretold the program's finished runs (RuntimeHistory.similar_sigma);
      not at all once they have been off by more than MAX_SIMILAR_SIGMA. Beside a declaration too, each weighed
      by its own record: Pollux's workloads with noisy declarations (sigma 1), where a program's runs are alike,
      1.06 / 1.18 / 1.19x the SRSF oracle at load 1.0 / 1.5 / 2.0 with the declaration alone, 1.03 / 1.06 / 1.06x
      with both; Muri trace3, whose model names say nothing of a run's length, within 1 % either way.

    With exact declarations the declaration dominates (shortest remaining first); with none the order is 2D-LAS
    over queues learned from history; noisy or partial declarations weigh in as far as they have been right.
    """
    remaining, index, next_floor = service_estimate(job, now, history or EMPTY_HISTORY, quantiles)
    return ServiceEstimate(remaining, index, next_floor)


def service_estimate(
    job: PendingJob | RunningJob,
    now: float,
    history: RuntimeHistory,
    quantiles: tuple[float, ...] = SERVICE_QUANTILES,
) -> tuple[float, int, float | None]:
    """estimate_service's (remaining GPU-seconds, queue, next floor), without making the ServiceEstimate: the
    pass asks it of every waiting job. The shortcuts for a job that never ran give the same figures."""
    queues = history.service_queues(quantiles)
    running = isinstance(job, RunningJob)
    held = job_gpus_held(job)
    # (elapsed_run_s is 0 for a job that never ran)
    elapsed = elapsed_run_s(job, now) if running or job.attained_gpu_seconds else 0.0
    # The queues are by run time, and the queue's remaining run time counts times the GPUs held (a gang goes by
    # its age, as a single-GPU job does, and weighs as its GPUs); its next floor in GPU-seconds, as attained.
    index = _queue_of(queues, elapsed)
    queue = queues[index]
    next_floor = queues[index + 1].floor * held if index + 1 < len(queues) else None
    weight = 1.0 / max(queue.sigma, MIN_QUEUE_SIGMA) ** 2
    total = (queue.log_remaining + math.log(held)) * weight
    declared = believed_steps(job, history)
    step = job.observed_step_s
    if step is None and job.similarity_key is not None and declared is not None:
        step = history.step_s(job.user, job.similarity_key, job.gpus)
    left_s = 0.0
    if declared is not None and step:
        left = declared - (steps_done(job, now, step) if running else float(job.steps_done))
        # past its declaration: it needs a fraction of what it has run more (prediction.py's rule)
        left_s = left * step if left > 0 else OVERRUN_FRACTION * elapsed
    remaining = _blended(job, history, total, weight, held, elapsed, left_s)
    if declared is not None and step and elapsed > 0.0:
        # (one that never ran keeps the blend, its whole size as far as it is known: NeverRun.figures' figures)
        remaining = min(remaining / DECLARED_SIZE_FRACTION, declared * step * held)
    return remaining, index, next_floor


class NeverRun:
    """The pass's figures of waiting jobs that never ran (no attained service: most of a long queue), with what is
    the same for all of them worked out once per pass: their queue (the first) and its weight. The same arithmetic
    in the same order as prediction.predict_remaining and service_estimate, which own the rules: the same figures
    (tests/scheduling/test_ordering_properties.py checks them against each other)."""

    __slots__ = ("history", "log_remaining", "programs", "weight")

    def __init__(self, history: RuntimeHistory, quantiles: tuple[float, ...] = SERVICE_QUANTILES) -> None:
        queue = history.service_queues(quantiles)[0]
        self.history = history
        self.weight = 1.0 / max(queue.sigma, MIN_QUEUE_SIGMA) ** 2
        self.log_remaining = queue.log_remaining
        self.programs = history.programs()

    def figures(self, job: PendingJob, default_s: float) -> tuple[float, float, float]:
        """(remaining seconds, confidence) as prediction.predict_remaining(job, now, history, default_s) gives them,
        and service_estimate(job, now, history)[0], for a waiting job that never ran: the pass asks all three of nearly every job of a long
        queue, and they read the same fields of it and the same step time of similar runs, here once (and the
        history not at all for a program it has no runs of: it would answer nothing). prediction._predicted,
        _remaining and _blended written out: the same arithmetic in the same order, the same figures (and min() and
        max() of two as the expressions they are: min(a, b) is `b if b < a else a`, max(a, b) `b if b > a else a`,
        at a seventh of the cost)."""
        history = self.history
        declared = believed_steps(job, history)
        step = job.observed_step_s
        time_limit = job.time_limit_s
        program = job.similarity_key
        if program is not None and program not in self.programs:
            program = None
        # -- predict_remaining: the whole run's prediction (_predicted), less the 0 s run (_remaining)
        confidence: float | None = None
        if step is not None:
            if program is not None:
                confidence = history.step_estimate(job.user, program, job.gpus)[1]
            if confidence is None or confidence < OWN_STEP_CONFIDENCE:
                confidence = OWN_STEP_CONFIDENCE
        elif program is not None:
            step, confidence = history.step_estimate(job.user, program, job.gpus)
        # (the declared steps left x step time: the prediction by steps, and the declaration the order weighs)
        left_s = (declared - float(job.steps_done)) * step if declared is not None and step else 0.0
        if declared is not None and step:
            remaining = left_s
            sure = confidence if confidence is not None else 0.5
        else:
            runtime, estimated = (
                history.runtime_estimate(job.user, program, job.gpus, job.work_size) if program is not None
                else (None, None)
            )
            if runtime is not None:
                if time_limit is not None and time_limit < runtime:
                    runtime = time_limit
                total_s, sure = runtime, estimated if estimated is not None else 0.5
            elif time_limit is not None:
                total_s, sure = time_limit, TIME_LIMIT_CONFIDENCE
            else:
                total_s, sure = default_s, DEFAULT_CONFIDENCE
            remaining = total_s - 0.0
            if time_limit is not None and (limit_left := time_limit - 0.0) < remaining:
                remaining = limit_left
        if remaining <= 0:
            remaining, sure = OVERRUN_FRACTION * 0.0, min(sure, TIME_LIMIT_CONFIDENCE)
        # -- service_estimate: the first queue's log remaining, the declaration and similar runs (_blended)
        held = job.gpus if job.gpu_share >= 1.0 else job_gpus_held(job)
        weight = self.weight
        total = (self.log_remaining + math.log(held)) * weight
        if left_s > 0:
            w = 1.0 / history.declaration_sigma(job.user) ** 2
            left_gpu_s = left_s * held
            total += math.log(1.0 if left_gpu_s < 1.0 else left_gpu_s) * w  # (max(left_gpu_s, 1.0))
            weight += w
        if program is not None:
            similar = history.similar_remaining(job.user, program, job.gpus, 0.0)
            trust = history.similar_sigma(program) if similar is not None else 0.0
            if similar is not None and trust <= MAX_SIMILAR_SIGMA:
                w = 1.0 / max(similar[1], trust, MIN_SIGMA) ** 2
                total += (similar[0] + math.log(held)) * w
                weight += w
        gpu_s = math.exp(total / weight)
        if time_limit is not None:
            limit_gpu_s = (time_limit - 0.0) * held
            limit_gpu_s = limit_gpu_s if limit_gpu_s > 1.0 else 1.0
            if limit_gpu_s < gpu_s:
                gpu_s = limit_gpu_s
        return remaining, sure, gpu_s


def _blended(
    job: PendingJob | RunningJob, history: RuntimeHistory, total: float, weight: float, held: float,
    elapsed: float, left_s: float,
) -> float:
    """The remaining GPU-seconds that the job's queue (`total` / `weight`: its log, weighed) and, where there are,
    its declared `left_s` seconds and similar runs say together, each weighed by its precision; no more than its
    time limit leaves."""
    if left_s > 0:
        w = 1.0 / history.declaration_sigma(job.user) ** 2
        total += math.log(max(left_s * held, 1.0)) * w
        weight += w
    if job.similarity_key is not None:
        similar = history.similar_remaining(job.user, job.similarity_key, job.gpus, elapsed)
        # (as sure as they agree with each other, and no surer than they have foretold the program's runs)
        trust = history.similar_sigma(job.similarity_key) if similar is not None else 0.0
        if similar is not None and trust <= MAX_SIMILAR_SIGMA:
            w = 1.0 / max(similar[1], trust, MIN_SIGMA) ** 2
            total += (similar[0] + math.log(held)) * w
            weight += w
    remaining = math.exp(total / weight)
    if job.time_limit_s is not None:
        remaining = min(remaining, max(1.0, (job.time_limit_s - elapsed) * held))
    return remaining


# (the history of a snapshot without one)
EMPTY_HISTORY = RuntimeHistory()

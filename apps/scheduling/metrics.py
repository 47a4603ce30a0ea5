"""Summary figures of a simulation, computed as the published simulators do where they define them."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from apps.scheduling.simulation import JobState, SimResult

HOUR = 3600.0


def quantile_as_published(values: list[float], q: float) -> float:
    """The sorted values at index int(q x n), as in the Muri simulator's p99."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class TeamFigures:
    gpu_share: float
    # Finish-time fairness (Themis): mean over the team's jobs of JCT / the JCT it would have with its share
    # of the cluster to itself (run time, stretched when the job is wider than that share).
    finish_time_fairness: float


@dataclass(frozen=True)
class EstimateFigures:
    """How good the start estimates given at submission were, over the jobs that had to wait.

    A waiting job with no estimate counts as missed (an infinite error): a blank is no answer to "when?".
    """

    waited: int
    # Share of waiting jobs that were given an estimate at all.
    coverage: float
    median_abs_error_h: float
    p90_abs_error_h: float
    median_wait_h: float
    # Median over waiting jobs of |estimate - actual start| / actual wait (the target: under 0.25).
    median_relative_error: float
    # Share of waiting jobs whose start fell within +-25 % of their wait from the estimate.
    within_25pct: float


@dataclass(frozen=True)
class Summary:
    policy: str
    jobs: int
    avg_jct_h: float
    p50_jct_h: float
    p99_jct_h: float
    makespan_h: float
    mean_queueing_delay_h: float
    gpu_utilization: float
    preemptions: int
    migrations: int
    passes: int
    teams: dict[str, TeamFigures] = field(default_factory=dict)
    worst_finish_time_fairness: float | None = None
    estimates: EstimateFigures | None = None
    # Every finished job's JCT in hours (to pool several runs' jobs: benchmarks/scheduler.py's Pollux sets); not in
    # as_dict.
    jcts_h: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def as_dict(self) -> dict[str, object]:
        figures = asdict(self)
        del figures["jcts_h"]
        return figures


def summarize(result: SimResult) -> Summary:
    # (job, finish, first start) of the jobs that finished (a finished job has started)
    runs = [
        (s, s.finish, s.first_start)
        for s in result.jobs
        if s.finish is not None and s.first_start is not None
    ]
    done = [s for s, _, _ in runs]
    jcts = [finish - s.trace.submit_s for s, finish, _ in runs]
    first_submit = min(s.trace.submit_s for s in result.jobs)
    makespan = max(finish for _, finish, _ in runs) - first_submit
    delays = [start - s.trace.submit_s for s, _, start in runs]
    teams = _team_figures(result, done)
    return Summary(
        policy=result.policy,
        jobs=len(done),
        avg_jct_h=sum(jcts) / len(jcts) / HOUR,
        p50_jct_h=quantile_as_published(jcts, 0.5) / HOUR,
        p99_jct_h=quantile_as_published(jcts, 0.99) / HOUR,
        makespan_h=makespan / HOUR,
        mean_queueing_delay_h=sum(delays) / len(delays) / HOUR,
        gpu_utilization=result.busy_gpu_s / (result.gpus * makespan) if makespan > 0 else 0.0,
        preemptions=result.preemptions,
        migrations=result.migrations,
        passes=result.passes,
        teams=teams,
        worst_finish_time_fairness=max((t.finish_time_fairness for t in teams.values()), default=None),
        estimates=estimate_figures(result.jobs),
        jcts_h=tuple(jct / HOUR for jct in jcts),
    )


def estimate_figures(jobs: list[JobState]) -> EstimateFigures | None:
    """Error of the estimated starts given at submission against the real first starts; None if no job waited,
    or no job got an estimate (a policy that gives none, like the oracles)."""
    waits: list[float] = []
    errors: list[float] = []
    relative: list[float] = []
    for s in jobs:
        if not s.waited_at_submit or s.first_start is None or s.first_start <= s.trace.submit_s:
            continue
        wait = s.first_start - s.trace.submit_s
        waits.append(wait)
        if s.estimate_at_submit is None:
            errors.append(math.inf)
            relative.append(math.inf)
            continue
        error = abs(s.estimate_at_submit - s.first_start)
        errors.append(error)
        relative.append(error / wait)
    if not waits or all(math.isinf(e) for e in errors):
        return None
    return EstimateFigures(
        waited=len(waits),
        coverage=sum(1 for e in errors if not math.isinf(e)) / len(errors),
        median_abs_error_h=statistics.median(errors) / HOUR,
        p90_abs_error_h=quantile_as_published(errors, 0.9) / HOUR,
        median_wait_h=statistics.median(waits) / HOUR,
        median_relative_error=statistics.median(relative),
        within_25pct=sum(1 for r in relative if r <= 0.25) / len(relative),
    )


def _team_figures(result: SimResult, done: list[JobState]) -> dict[str, TeamFigures]:
    names = sorted({s.trace.team for s in result.jobs})
    if len(names) < 2:
        return {}
    total_share = sum(result.teams[t].share for t in names if t in result.teams) or 1.0
    total_gpu_s = sum(s.attained_gpu_s for s in result.jobs) or 1.0
    figures = {}
    for team in names:
        share = (result.teams[team].share if team in result.teams else 0.0) / total_share
        own_gpus = max(1.0, share * result.gpus)
        ratios = []
        for s in done:
            if s.trace.team != team or s.finish is None:
                continue
            ideal = s.trace.duration_s * max(1.0, s.trace.gpus / own_gpus)
            if ideal > 0:
                ratios.append((s.finish - s.trace.submit_s) / ideal)
        figures[team] = TeamFigures(
            gpu_share=sum(s.attained_gpu_s for s in result.jobs if s.trace.team == team) / total_gpu_s,
            finish_time_fairness=sum(ratios) / len(ratios) if ratios else 0.0,
        )
    return figures

"""A job's kept metrics: every training progress record's values (loss, steps/s, samples/s and the job's own
named metrics), stored per series and thinned evenly past settings.JOBS_METRIC_POINTS; read back for the API and
the job's page; its progress percent and ETA.

Thinning: the series' n-th value received has seq n. A value is kept when seq is a multiple of the series' stride,
and the newest value is always kept (a point off the stride lives until the next one arrives). When more than
JOBS_METRIC_POINTS - 1 values on the stride would be kept, the stride doubles and the points off it are deleted:
a series holds at most JOBS_METRIC_POINTS points, at least half that once thinned, evenly spread over the run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F
from django.db.models.functions import Mod
from django.utils import timezone

from apps.jobs.models import Job, JobMetric, JobMetricSeries
from workers.protocol import BUILTIN_METRICS, TrainingProgress

logger = logging.getLogger("apps.jobs")

# A job may name at most this many series (the built-in three included); values of further names are dropped.
MAX_SERIES_PER_JOB = 64


# The largest step a database column keeps (a signed 64-bit integer); a job that says more has no step.
MAX_STEP = 2**63 - 1


def db_step(step: int | None) -> int | None:
    return step if step is not None and step <= MAX_STEP else None


@dataclass(frozen=True)
class Point:
    step: int | None
    time: datetime
    value: float


def _point_time(record: TrainingProgress, job: Job, now: datetime) -> datetime:
    """When the job says it measured the value, if that is between the job's creation and now; else now."""
    if record.ts is None:
        return now
    try:
        said = datetime.fromtimestamp(record.ts, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return now
    return said if job.created_at - timedelta(seconds=5) <= said <= now else now


def record_metrics(job: Job, attempt: int, records: Sequence[TrainingProgress]) -> None:
    """Keep the values of `records` (in the order the job wrote them). The caller holds the job's row lock."""
    now = timezone.now()
    values: dict[str, list[Point]] = {}
    dropped = sum(record.dropped_metrics for record in records)
    for record in records:
        at = _point_time(record, job, now)
        for name, value in record.values().items():
            values.setdefault(name, []).append(Point(db_step(record.step), at, value))
    if not values:
        if dropped:
            Job.objects.filter(pk=job.pk).update(metrics_dropped=F("metrics_dropped") + dropped)
        return
    series = {s.name: s for s in JobMetricSeries.objects.filter(job=job)}
    room = MAX_SERIES_PER_JOB - len(series)
    for name in values:
        if name not in series:
            if room <= 0:
                dropped += len(values[name])
                continue
            series[name] = JobMetricSeries.objects.create(job=job, name=name)
            room -= 1
    for name, points in values.items():
        if name in series:
            _append(series[name], attempt, points)
    if dropped:
        logger.warning("job %s: %d reported metric values dropped (bad names or values, or past %d series)",
                       job.pk, dropped, MAX_SERIES_PER_JOB)
        Job.objects.filter(pk=job.pk).update(metrics_dropped=F("metrics_dropped") + dropped)


def _append(series: JobMetricSeries, attempt: int, points: Sequence[Point]) -> None:
    limit = settings.JOBS_METRIC_POINTS
    first, seen = series.seen, series.seen + len(points)
    stride = series.stride
    while -(-seen // stride) > limit - 1:  # values on the stride, kept: ceil(seen / stride)
        stride *= 2
    newest = seen - 1
    JobMetric.objects.bulk_create([
        JobMetric(series=series, seq=seq, attempt=attempt, step=p.step, time=p.time, value=p.value)
        for seq, p in enumerate(points, start=first) if seq % stride == 0 or seq == newest])
    stale = JobMetric.objects.filter(series=series, seq__lt=first)
    if stride != series.stride:
        stale.annotate(r=Mod("seq", stride)).exclude(r=0).delete()
    elif first and (first - 1) % stride:
        stale.filter(seq=first - 1).delete()  # the previous newest, off the stride
    JobMetricSeries.objects.filter(pk=series.pk).update(seen=seen, stride=stride)
    series.seen, series.stride = seen, stride


def job_metrics(job: Job, names: Iterable[str] = (), since_step: int | None = None) -> list[dict[str, Any]]:
    """The job's series (those named, or all), each with its kept points as columns (steps, times in epoch
    seconds, values), in the order received; with `since_step`, only the points at later steps."""
    series = JobMetricSeries.objects.filter(job=job)
    wanted = list(names)
    if wanted:
        series = series.filter(name__in=wanted)
    points = JobMetric.objects.filter(series__in=series).order_by("series_id", "seq")
    if since_step is not None:
        points = points.filter(step__gt=since_step)
    columns: dict[int, dict[str, list[Any]]] = {}
    for series_id, step, at, value in points.values_list("series_id", "step", "time", "value"):
        column = columns.setdefault(series_id, {"steps": [], "times": [], "values": []})
        column["steps"].append(step)
        column["times"].append(round(at.timestamp(), 3))
        column["values"].append(value)
    empty: dict[str, list[Any]] = {"steps": [], "times": [], "values": []}
    return [{"name": s.name, "builtin": s.name in BUILTIN_METRICS, "seen": s.seen, "stride": s.stride,
             **columns.get(s.pk, empty)} for s in series.order_by("name")]


def job_progress(job: Job) -> dict[str, Any]:
    """How far a training job is: steps done of max_steps, the percent, and the seconds left at the last rate."""
    percent = eta_s = None
    if job.max_steps:
        percent = round(min(100.0, 100.0 * job.steps_done / job.max_steps), 1)
        rate = job.steps_per_second
        if job.state == Job.State.RUNNING and rate and rate > 0 and job.steps_done < job.max_steps:
            eta_s = round((job.max_steps - job.steps_done) / rate, 1)
    return {"step": job.steps_done, "max_steps": job.max_steps, "percent": percent, "eta_s": eta_s,
            "steps_per_s": job.steps_per_second, "loss": job.last_loss}

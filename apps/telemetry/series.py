"""Time series from the stored history, for the metrics API and the pages' charts.

A window is a time range and the resolution it is read at: 10-second buckets while the range starts within the
10-second retention (a day), 1-minute buckets beyond. Every series is columnar ({"t": [...], name: [...]}, the
shape uPlot and the pages' chart functions take), one entry per bucket, null where nothing was recorded.
Who may see which hosts and teams is apps/accounts/access.py's; callers pass what it allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Avg, Count, Max, Q, Sum
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from apps.accounts.access import Viewer
from apps.core.errors import InvalidInput
from apps.telemetry.models import ClusterSample, GpuSampleBucket

RANGES = {"1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
RESOLUTIONS = (10, 60)

Series = dict[str, list[Any]]


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime
    resolution_s: int

    def head(self) -> dict[str, Any]:
        return {"from": self.start.timestamp(), "to": self.end.timestamp(), "resolution_s": self.resolution_s}


def _instant(name: str, raw: str) -> datetime:
    """A UNIX time in seconds or an ISO 8601 time (UTC when it names no zone)."""
    try:
        return datetime.fromtimestamp(float(raw), tz=UTC)
    except (ValueError, OverflowError, OSError):
        pass
    try:
        parsed = parse_datetime(raw)
    except ValueError:
        parsed = None
    if parsed is None:
        raise InvalidInput({name: [f"{raw!r} is neither a UNIX time nor an ISO 8601 time."]})
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_window(params: Mapping[str, str], now: datetime | None = None) -> Window:
    """`range` (1h, 24h, 7d, 30d: the last hour…) or `from` (and `to`, default now); `resolution` (10 or 60)
    to pin the buckets, e.g. when a page appends to a chart it drew at that resolution."""
    now = now or timezone.now()
    keep_fine = now - timedelta(hours=settings.TELEMETRY_KEEP_10S_HOURS)
    keep_coarse = now - timedelta(days=settings.TELEMETRY_KEEP_1M_DAYS)
    if params.get("from"):
        if params.get("range"):
            raise InvalidInput({"range": ["Give either range or from/to, not both."]})
        start = _instant("from", params["from"])
        # Without `to`, a `from` at or after now is an empty window (a page asking what came since its last point).
        end = _instant("to", params["to"]) if params.get("to") else max(now, start)
        if params.get("to") and end <= start:
            raise InvalidInput({"to": ["to must be later than from."]})
    else:
        name = params.get("range") or "1h"
        if name not in RANGES:
            raise InvalidInput({"range": [f"Choose one of {', '.join(RANGES)} (or give from and to)."]})
        start, end = now - timedelta(seconds=RANGES[name]), now
    if start < keep_coarse - timedelta(minutes=1):
        raise InvalidInput({"from": [f"History is kept {settings.TELEMETRY_KEEP_1M_DAYS} days: from must be later "
                                     f"than {keep_coarse.isoformat(timespec='seconds')}."]})
    end = max(min(end, now), start)
    resolution = 10 if start >= keep_fine else 60
    if params.get("resolution"):
        try:
            resolution = int(params["resolution"])
        except ValueError:
            resolution = 0
        if resolution not in RESOLUTIONS:
            raise InvalidInput({"resolution": ["Choose 10 or 60 (seconds)."]})
        if resolution == 10 and start < keep_fine:
            raise InvalidInput({"resolution": [f"10-second buckets are kept {settings.TELEMETRY_KEEP_10S_HOURS} h: "
                                               "use 60 for this range."]})
    return Window(start, end, resolution)


def _columns(rows: dict[int, dict[str, Any]], names: Iterable[str]) -> Series:
    stamps = sorted(rows)
    series: Series = {"t": stamps}
    for name in names:
        series[name] = [rows[t].get(name) for t in stamps]
    return series


GPU_FIELDS = ("utilization_pct", "utilization_max_pct", "memory_used_mb", "memory_total_mb", "temperature_c",
              "power_w", "gpus_reporting")


def _gpu_rows(gpus: Q, window: Window) -> dict[int, dict[str, Any]]:
    """Per bucket, over the GPUs `gpus` selects: mean and peak utilization, memory and power summed, the hottest
    temperature. Several rows of one GPU and bucket (ingest in several processes) weigh as one: sums are scaled
    by GPUs / rows."""
    rows = (
        GpuSampleBucket.objects.filter(gpus, resolution_s=window.resolution_s, bucket_start__gte=window.start,
                                       bucket_start__lt=window.end)
        .order_by().values("bucket_start")
        .annotate(util=Avg("utilization_avg"), util_max=Max("utilization_max"), mem=Sum("memory_used_max_mb"),
                  total=Sum("memory_total_mb"), temp=Max("temperature_max"), power=Sum("power_avg_w"),
                  rows=Count("id"), gpus=Count("gpu_id", distinct=True))
    )
    out: dict[int, dict[str, Any]] = {}
    for r in rows:
        scale = r["gpus"] / r["rows"]
        out[round(r["bucket_start"].timestamp())] = {
            "utilization_pct": _round(r["util"]), "utilization_max_pct": _round(r["util_max"]),
            "memory_used_mb": _round(r["mem"] * scale if r["mem"] is not None else None),
            "memory_total_mb": _round(r["total"] * scale if r["total"] is not None else None),
            "temperature_c": r["temp"], "power_w": _round(r["power"] * scale if r["power"] is not None else None),
            "gpus_reporting": r["gpus"],
        }
    return out


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def gpu_series(gpus: Q, window: Window) -> dict[str, Any]:
    """A host's or one GPU's history (`gpus`: a filter on GpuSampleBucket, e.g. Q(gpu__host=host))."""
    return {**window.head(), **_columns(_gpu_rows(gpus, window), GPU_FIELDS)}


def _samples(window: Window) -> list[ClusterSample]:
    return list(ClusterSample.objects.filter(resolution_s=window.resolution_s, bucket_start__gte=window.start,
                                             bucket_start__lt=window.end).order_by("bucket_start"))


CLUSTER_FIELDS = GPU_FIELDS + ("gpus_allocated", "gpus_idle", "gpus_stale", "gpus_down", "queued", "wait_max_s",
                               "wait_avg_s")


def cluster_series(viewer: Viewer, gpus: Q, window: Window) -> dict[str, Any]:
    """The GPUs `gpus` selects (those of the hosts the viewer sees) over time, the cluster's GPU counts, and the
    queue of the teams the viewer sees (nothing for a viewer who sees no cluster: a user without a team)."""
    if not viewer.sees_cluster:
        return {**window.head(), **_columns({}, CLUSTER_FIELDS)}
    rows = _gpu_rows(gpus, window)
    for sample in _samples(window):
        teams = [v for slug, v in sample.teams.items() if viewer.sees_team(slug)]
        queued = sum(t.get("queued", 0.0) for t in teams)
        waited = sum(t.get("wait_sum_s", 0.0) for t in teams)
        rows.setdefault(round(sample.bucket_start.timestamp()), {}).update({
            "gpus_allocated": sample.gpus_busy, "gpus_idle": sample.gpus_idle, "gpus_stale": sample.gpus_stale,
            "gpus_down": sample.gpus_down, "queued": _round(queued),
            "wait_max_s": _round(max((t.get("wait_max_s", 0.0) for t in teams), default=0.0)),
            "wait_avg_s": _round(waited / queued) if queued else None,
        })
    return {**window.head(), **_columns(rows, CLUSTER_FIELDS)}


TEAM_SERIES = ("allocated", "guaranteed", "borrowed", "quota", "queued", "wait_max_s")


def team_allocation(slug: str, window: Window) -> dict[str, Any]:
    """One team's GPUs held against its quota over time: `guaranteed` within the quota, `borrowed` beyond it
    (preemptible), and its queue. The caller checked the viewer may see the team."""
    rows: dict[int, dict[str, Any]] = {}
    for sample in _samples(window):
        team = sample.teams.get(slug)
        if team is None:
            continue
        allocated, borrowed = team.get("allocated", 0.0), team.get("borrowed", 0.0)
        rows[round(sample.bucket_start.timestamp())] = {
            "allocated": _round(allocated), "guaranteed": _round(allocated - borrowed), "borrowed": _round(borrowed),
            "quota": team.get("quota"), "queued": _round(team.get("queued", 0.0)),
            "wait_max_s": _round(team.get("wait_max_s", 0.0)),
        }
    return {"team": slug, **window.head(), **_columns(rows, TEAM_SERIES)}

"""Telemetry ingest: validate a host's batch, keep the latest state, downsample history, evaluate alerts.

The hot path (one batch per host per second) reads the host's GPU map and the GPU → job map from a short-lived
cache instead of the database, keeps the latest frame in the Django cache (Redis in production), and writes to
the database only when a 10-second bucket closes or an alert changes state.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Greatest

from apps.cluster.models import GPU, Host
from apps.jobs.models import Job, JobAllocation
from apps.telemetry import alerts
from apps.telemetry.models import GpuSampleBucket, JobGpuStats

logger = logging.getLogger(__name__)
BUCKET_S = 10
# Kept long: a frame's age is how a host whose telemetry stopped shows as stale (freshness.py), not its absence.
FRAME_TTL_S = 24 * 3600
MAP_TTL_S = 2.0
NUMERIC_FIELDS = {
    "utilization_pct": (0.0, 100.0),
    "memory_used_mb": (0, 10_000_000),
    "memory_total_mb": (0, 10_000_000),
    "memory_bandwidth_pct": (0.0, 100.0),
    "temperature_c": (-50, 200),
    "power_w": (0.0, 100_000.0),
    "power_limit_w": (0.0, 100_000.0),
    "sm_clock_mhz": (0, 100_000),
    "fan_pct": (0, 100),
    "ecc_errors_volatile": (0, 2**62),
}
FRAME_FIELDS = ("utilization_pct", "memory_used_mb", "memory_total_mb", "memory_bandwidth_pct", "temperature_c",
                "power_w", "power_limit_w", "sm_clock_mhz", "fan_pct", "ecc_errors_volatile")


class TelemetryRejected(ValueError):
    """A batch that does not fit the schema or names GPUs of another host."""


def frame_key(host_name: str) -> str:
    return f"telemetry:frame:{host_name}"


# --- what the hot path needs to know, refreshed every couple of seconds


@dataclass
class GpuInfo:
    gpu_id: int
    index: int
    gpu_type: str
    health: str


@dataclass
class HostMaps:
    loaded_at: float
    gpus: dict[str, GpuInfo]  # uuid -> info
    jobs: dict[int, tuple[int, str]]  # gpu id -> (job id, team slug) of the first job on it
    shares: dict[int, list[tuple[int, str, int]]] = field(default_factory=dict)  # gpu id -> [(job, team, units)]


_maps: dict[int, HostMaps] = {}
_maps_lock = threading.Lock()


def host_maps(host: Host, *, fresh: bool = False) -> HostMaps:
    now = time.monotonic()
    cached = _maps.get(host.pk)
    if cached and not fresh and now - cached.loaded_at < MAP_TTL_S:
        return cached
    gpus = {
        uuid: GpuInfo(gpu_id, index, gpu_type, health)
        for gpu_id, uuid, index, gpu_type, health in GPU.objects.filter(host=host).values_list(
            "pk", "uuid", "index", "gpu_type", "health"
        )
    }
    jobs: dict[int, tuple[int, str]] = {}
    shares: dict[int, list[tuple[int, str, int]]] = {}
    for gpu_id, job_id, team, units in JobAllocation.objects.filter(
        gpu__host=host, released_at__isnull=True, job__state__in=Job.HOLDING_STATES
    ).order_by("job_id").values_list("gpu_id", "job_id", "job__team__slug", "share_units"):
        jobs.setdefault(gpu_id, (job_id, team))
        shares.setdefault(gpu_id, []).append((job_id, team, units))
    maps = HostMaps(now, gpus, jobs, shares)
    with _maps_lock:
        _maps[host.pk] = maps
    return maps


def forget_host_maps() -> None:
    with _maps_lock:
        _maps.clear()


# --- validation


def _number(name: str, value: Any) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TelemetryRejected(f"{name} must be a number or null")
    low, high = NUMERIC_FIELDS[name]
    return min(max(value, low), high)


def _clean_gpu(entry: Any) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise TelemetryRejected("each GPU sample must be an object")
    uuid = entry.get("uuid")
    ts = entry.get("ts")
    if not isinstance(uuid, str) or not isinstance(ts, int | float) or isinstance(ts, bool):
        raise TelemetryRejected("each GPU sample needs a uuid and a ts")
    available = bool(entry.get("available"))
    clean: dict[str, Any] = {"uuid": uuid, "ts": float(ts), "available": available}
    for name in FRAME_FIELDS:
        clean[name] = _number(name, entry.get(name)) if available else None
    reasons = entry.get("throttle_reasons") or []
    clean["throttle_reasons"] = [str(r)[:40] for r in reasons[:16]] if isinstance(reasons, list) else []
    processes = entry.get("processes") or []
    clean["processes"] = [
        {"pid": int(p["pid"]), "memory_mb": _number("memory_used_mb", p.get("memory_mb")),
         "job": p.get("job") if isinstance(p.get("job"), int) else None}
        for p in processes[:256]
        if isinstance(p, dict) and isinstance(p.get("pid"), int)
    ]
    clean["error"] = str(entry["error"])[:200] if entry.get("error") else None
    return clean


def clean_batch(batch: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if not isinstance(batch, dict):
        raise TelemetryRejected("a telemetry batch must be an object")
    gpus, xids = batch.get("gpus", []), batch.get("xid", [])
    if not isinstance(gpus, list) or not isinstance(xids, list) or len(gpus) > 64 or len(xids) > 256:
        raise TelemetryRejected("gpus and xid must be lists (at most 64 GPUs)")
    clean_xids = []
    for event in xids:
        if not isinstance(event, dict) or not isinstance(event.get("uuid"), str) or not isinstance(
            event.get("xid"), int
        ):
            raise TelemetryRejected("each XID event needs a uuid and an integer xid")
        clean_xids.append({"uuid": event["uuid"], "xid": event["xid"], "ts": float(event.get("ts") or time.time())})
    return [_clean_gpu(entry) for entry in gpus], clean_xids


# --- downsampling


@dataclass
class Bucket:
    samples: int = 0
    available: int = 0
    util_sum: float = 0.0
    util_max: float | None = None
    mem_max: int | None = None
    mem_total: int | None = None
    temp_max: float | None = None
    power_sum: float = 0.0
    power_n: int = 0
    energy_j: float = 0.0
    job_id: int | None = None

    def add(self, sample: dict[str, Any], dt: float, job_id: int | None) -> None:
        self.samples += 1
        if job_id is not None:
            self.job_id = job_id
        if not sample["available"]:
            return
        self.available += 1
        util, mem, temp, power = (sample["utilization_pct"], sample["memory_used_mb"], sample["temperature_c"],
                                  sample["power_w"])
        if util is not None:
            self.util_sum += util
            self.util_max = util if self.util_max is None else max(self.util_max, util)
        if mem is not None:
            self.mem_max = mem if self.mem_max is None else max(self.mem_max, mem)
        self.mem_total = sample["memory_total_mb"] or self.mem_total
        if temp is not None:
            self.temp_max = temp if self.temp_max is None else max(self.temp_max, temp)
        if power is not None:
            self.power_sum += power
            self.power_n += 1
            self.energy_j += power * dt


@dataclass
class Accumulator:
    """10-second buckets being filled in this process; closed ones are written on the next ingest."""

    buckets: dict[tuple[int, int], Bucket] = field(default_factory=dict)
    last_ts: dict[int, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, gpu_id: int, sample: dict[str, Any], job_id: int | None) -> None:
        ts = sample["ts"]
        start = int(ts // BUCKET_S) * BUCKET_S
        with self.lock:
            previous = self.last_ts.get(gpu_id)
            dt = min(max(ts - previous, 0.0), 5.0) if previous is not None else 1.0
            self.last_ts[gpu_id] = ts
            self.buckets.setdefault((gpu_id, start), Bucket()).add(sample, dt, job_id)

    def take_closed(self, now: float, *, everything: bool = False) -> dict[tuple[int, int], Bucket]:
        cutoff = int(now // BUCKET_S) * BUCKET_S - BUCKET_S  # keep the current and the previous bucket open
        with self.lock:
            closed = {key: b for key, b in self.buckets.items() if everything or key[1] < cutoff}
            for key in closed:
                del self.buckets[key]
        return closed


accumulator = Accumulator()


def flush_buckets(now: float | None = None, *, everything: bool = False) -> int:
    closed = accumulator.take_closed(now or time.time(), everything=everything)
    if not closed:
        return 0
    rows = []
    per_job: dict[int, dict[str, Any]] = {}
    for (gpu_id, start), bucket in closed.items():
        rows.append(GpuSampleBucket(
            gpu_id=gpu_id, resolution_s=BUCKET_S, bucket_start=datetime.fromtimestamp(start, tz=UTC),
            job_id=bucket.job_id, samples=bucket.samples, available_samples=bucket.available,
            utilization_avg=bucket.util_sum / bucket.available if bucket.available else None,
            utilization_max=bucket.util_max, memory_used_max_mb=bucket.mem_max, memory_total_mb=bucket.mem_total,
            temperature_max=bucket.temp_max, power_avg_w=bucket.power_sum / bucket.power_n if bucket.power_n else None,
            energy_j=bucket.energy_j,
        ))
        if bucket.job_id is not None and bucket.available:
            stats = per_job.setdefault(bucket.job_id, {"samples": 0, "util": 0.0, "util_max": 0.0, "mem": 0,
                                                       "energy": 0.0, "first": start, "last": start})
            stats["samples"] += bucket.available
            stats["util"] += bucket.util_sum
            stats["util_max"] = max(stats["util_max"], bucket.util_max or 0.0)
            stats["mem"] = max(stats["mem"], bucket.mem_max or 0)
            stats["energy"] += bucket.energy_j
            stats["first"] = min(stats["first"], start)
            stats["last"] = max(stats["last"], start + BUCKET_S)
    existing_jobs = set(Job.objects.filter(pk__in=per_job).values_list("pk", flat=True))
    # A GPU removed (its host deleted) while its samples waited here: its buckets have nowhere to go.
    existing_gpus = set(GPU.objects.filter(pk__in={row.gpu_id for row in rows}).values_list("pk", flat=True))
    rows = [row for row in rows if row.gpu_id in existing_gpus]
    with transaction.atomic():
        for row in rows:
            if row.job_id not in existing_jobs:
                row.job_id = None
        GpuSampleBucket.objects.bulk_create(rows)
        for job_id in existing_jobs:
            stats = per_job[job_id]
            JobGpuStats.objects.get_or_create(job_id=job_id)
            JobGpuStats.objects.filter(job_id=job_id).update(
                samples=F("samples") + stats["samples"],
                utilization_sum=F("utilization_sum") + stats["util"],
                utilization_max=Greatest(F("utilization_max"), stats["util_max"]),
                memory_max_mb=Greatest(F("memory_max_mb"), stats["mem"]),
                energy_j=F("energy_j") + stats["energy"],
                last_sample_at=datetime.fromtimestamp(stats["last"], tz=UTC),
            )
            JobGpuStats.objects.filter(job_id=job_id, first_sample_at__isnull=True).update(
                first_sample_at=datetime.fromtimestamp(stats["first"], tz=UTC)
            )
    return len(rows)


# --- ingest


def ingest_batch(host: Host, batch: Any) -> dict[str, int]:
    """Take one batch from `host`'s agent. A host may publish only its own GPUs."""
    gpus, xids = clean_batch(batch)
    maps = host_maps(host)
    unknown = [g["uuid"] for g in gpus + xids if g["uuid"] not in maps.gpus]
    if unknown:
        maps = host_maps(host, fresh=True)  # a GPU registered a moment ago
        unknown = [uuid for uuid in unknown if uuid not in maps.gpus]
        if unknown:
            raise TelemetryRejected(f"GPUs not registered on host {host.name}: {', '.join(sorted(set(unknown)))}")
    now = time.time()
    frame_gpus = []
    for sample in gpus:
        info = maps.gpus[sample["uuid"]]
        job = maps.jobs.get(info.gpu_id)
        accumulator.add(info.gpu_id, sample, job[0] if job else None)
        memory = {}
        for process in sample["processes"]:
            if process["job"] is not None and process["memory_mb"] is not None:
                memory[process["job"]] = memory.get(process["job"], 0) + process["memory_mb"]
        frame_gpus.append({
            "host": host.name, "index": info.index, "uuid": sample["uuid"], "gpu_type": info.gpu_type,
            "simulated": host.simulated, "health": info.health, "job": job[0] if job else None,
            "team": job[1] if job else None,
            # Every job on the GPU with its share and the memory its processes use (shared GPUs hold several).
            "jobs": [{"job": job_id, "team": team, "share": units / 100, "memory_mb": memory.get(job_id)}
                     for job_id, team, units in maps.shares.get(info.gpu_id, [])],
            **{k: sample[k] for k in ("ts", "available", *FRAME_FIELDS)},
            "throttle_reasons": sample["throttle_reasons"], "error": sample["error"],
            "processes": sample["processes"],
        })
    if frame_gpus:
        frame = {"host": host.name, "ts": max(g["ts"] for g in frame_gpus), "received": now,
                 "gpus": sorted(frame_gpus, key=lambda g: g["index"])}
        cache.set(frame_key(host.name), frame, timeout=FRAME_TTL_S)
        alerts.evaluate_gpu_samples(host, frame["gpus"], maps, now)
    for event in xids:
        alerts.fire_xid(host, maps.gpus[event["uuid"]].gpu_id, event["xid"], event["ts"])
    flushed = flush_buckets(now)
    return {"gpus": len(gpus), "xid": len(xids), "buckets_written": flushed}


def latest_frames(host_names: list[str]) -> dict[str, dict[str, Any]]:
    found = cache.get_many([frame_key(name) for name in host_names])
    return {key.split(":", 2)[2]: frame for key, frame in found.items()}

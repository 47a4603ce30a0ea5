"""Prometheus export at /metrics: every GPU's latest values (dcgm-exporter's field names and meanings) and the
console's own gauges (queue length by team, pending time, jobs by state, hosts by state, firing alerts)."""

from __future__ import annotations

import hmac
import time

from django.conf import settings
from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from rest_framework.exceptions import AuthenticationFailed

from apps.accounts import access
from apps.accounts.authentication import BearerTokenAuthentication
from apps.cluster.models import GPU, Host
from apps.jobs.models import Job
from apps.telemetry.freshness import cluster_view, host_facts
from apps.telemetry.models import Alert
from apps.telemetry.services import latest_frames

GPU_LABELS = ["host", "gpu", "uuid", "model", "team", "job"]
# (metric name, help, sample field, scale)
GPU_GAUGES = [
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "utilization_pct", 1.0),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "memory_bandwidth_pct", 1.0),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "memory_used_mb", 1.0),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_c", 1.0),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w", 1.0),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", "power_limit_w", 1.0),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz", 1.0),
    ("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", "fan_pct", 1.0),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", "ecc_errors_volatile", 1.0),
]


class ConsoleCollector:
    def collect(self):
        gpus = {g.uuid: g for g in GPU.objects.select_related("host")}
        facts = host_facts()
        now = time.time()
        # A down or silent host's GPUs are stale (freshness.py): exported with no readings, only their age.
        view = cluster_view(facts, latest_frames([host.name for host in facts]), now)
        families = {name: GaugeMetricFamily(name, help_text, labels=GPU_LABELS) for name, help_text, _, _ in GPU_GAUGES}
        free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=GPU_LABELS)
        no_data = GaugeMetricFamily("console_gpu_no_data", "1 when the GPU did not answer at its last sample.",
                                    labels=GPU_LABELS)
        staleness = GaugeMetricFamily("console_gpu_sample_age_seconds", "Age of the GPU's latest sample.",
                                      labels=GPU_LABELS)
        health = GaugeMetricFamily("console_gpu_schedulable", "1 when the GPU takes new jobs.", labels=GPU_LABELS)
        stale = GaugeMetricFamily("console_gpu_stale", "1 when the GPU's host is down or silent: no live data.",
                                  labels=GPU_LABELS)
        for sample in view.gpus:
            gpu = gpus.get(sample["uuid"])
            model = gpu.model_name if gpu else sample["gpu_type"]
            labels = [sample["host"], str(sample["index"]), sample["uuid"], model or "", sample["team"] or "",
                      str(sample["job"]) if sample["job"] else ""]
            health.add_metric(labels, 1.0 if gpu and gpu.health == GPU.Health.OK else 0.0)
            stale.add_metric(labels, 1.0 if sample["stale"] else 0.0)
            if sample["stale"]:
                if sample["last_seen"] is not None:
                    staleness.add_metric(labels, max(0.0, now - sample["last_seen"]))
                continue
            for name, _, field, scale in GPU_GAUGES:
                value = sample.get(field)
                if value is not None:
                    families[name].add_metric(labels, value * scale)
            if sample["memory_used_mb"] is not None and sample["memory_total_mb"] is not None:
                free.add_metric(labels, sample["memory_total_mb"] - sample["memory_used_mb"])
            no_data.add_metric(labels, 0.0 if sample["available"] else 1.0)
            staleness.add_metric(labels, max(0.0, now - sample["ts"]))
        yield from families.values()
        yield from (free, no_data, staleness, health, stale)

        queued = GaugeMetricFamily("console_queue_length", "Queued jobs by team.", labels=["team"])
        oldest = GaugeMetricFamily("console_oldest_pending_seconds", "Age of the oldest queued job by team.",
                                   labels=["team"])
        for row in (Job.objects.filter(state=Job.State.QUEUED).values("team__slug")
                    .annotate(n=Count("id"), first=Min("created_at"))):
            queued.add_metric([row["team__slug"]], row["n"])
            oldest.add_metric([row["team__slug"]], max(0.0, now - row["first"].timestamp()))
        yield queued
        yield oldest
        jobs = GaugeMetricFamily("console_jobs", "Jobs by state.", labels=["state"])
        counts = dict(Job.objects.values_list("state").annotate(n=Count("id")))
        for state in Job.State.values:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        hosts = GaugeMetricFamily("console_hosts", "Hosts by state.", labels=["state"])
        host_counts = dict(Host.objects.values_list("state").annotate(n=Count("id")))
        for state in Host.State.values:
            hosts.add_metric([state], host_counts.get(state, 0))
        yield hosts
        statuses = GaugeMetricFamily("console_hosts_status", "Hosts by status (stale: silent for a heartbeat "
                                     "timeout, not marked down yet).", labels=["status"])
        for status, n in view.host_counts().items():
            statuses.add_metric([status], n)
        yield statuses
        firing = GaugeMetricFamily("console_alerts_open", "Alerts not yet resolved, by state.", labels=["state"])
        alert_counts = dict(Alert.objects.exclude(state=Alert.State.RESOLVED).values_list("state")
                            .annotate(n=Count("id")))
        for state in (Alert.State.FIRING, Alert.State.ACKNOWLEDGED):
            firing.add_metric([state], alert_counts.get(state, 0))
        yield firing
        yield from _service_metrics()


def _service_metrics():
    from apps.serving.models import InferenceService
    from apps.serving.services import service_stats

    labels = ["team", "service"]
    latency = GaugeMetricFamily("console_service_latency_ms", "Replica latency percentiles (worst replica).",
                                labels=[*labels, "quantile"])
    rps = GaugeMetricFamily("console_service_requests_per_second", "Requests per second over all replicas.",
                            labels=labels)
    errors = GaugeMetricFamily("console_service_error_rate", "Share of requests that failed.", labels=labels)
    replicas = GaugeMetricFamily("console_service_replicas", "Replicas by readiness.", labels=[*labels, "state"])
    for service in InferenceService.objects.filter(state=InferenceService.State.ACTIVE).select_related("team"):
        stats = service_stats(service)
        names = [service.team.slug, service.name]
        for quantile, key in (("0.5", "p50_ms"), ("0.95", "p95_ms"), ("0.99", "p99_ms")):
            if stats.get(key) is not None:
                latency.add_metric([*names, quantile], stats[key])
        rps.add_metric(names, stats.get("rps", 0.0))
        errors.add_metric(names, stats.get("error_rate", 0.0))
        replicas.add_metric([*names, "ready"], stats.get("ready", 0))
        replicas.add_metric([*names, "desired"], service.desired_replicas)
    yield from (latency, rps, errors, replicas)


def _allowed(request: HttpRequest) -> bool:
    header = request.headers.get("Authorization", "")
    token = settings.METRICS_TOKEN
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip(), token):
        return True
    user = request.user if request.user.is_authenticated else None
    if user is None and header:
        try:
            found = BearerTokenAuthentication().authenticate(request)
        except AuthenticationFailed:
            found = None
        user = found[0] if found else None
    return access.can(user, access.Action.ADMINISTER)


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        response = HttpResponse("metrics need an admin or the metrics token\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ConsoleCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

"""Issue 18: time series from the stored history (apps/telemetry/series.py, history.py, history_api.py)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
from django.utils import timezone

from apps.cluster.models import Host
from apps.jobs.models import Job
from apps.telemetry import history, retention, services, tasks
from apps.telemetry.models import ClusterSample, GpuSampleBucket


def _job(team, user, *, state=Job.State.QUEUED, gpus=1, borrowing=False, age_s=0.0) -> Job:
    job = Job.objects.create(name="h", team=team, user=user, gpus=gpus, preset="baseline-fp32",
                             workload={"builtin": "mlp-digits"}, time_limit_minutes=60)
    Job.objects.filter(pk=job.pk).update(state=state, borrowing=borrowing,
                                         created_at=timezone.now() - timedelta(seconds=age_s))
    return job


def _ingest_node_a(start: float, seconds: int, utils: tuple[float, ...]) -> None:
    host = Host.objects.get(name="node-a")
    for k in range(seconds):
        services.ingest_batch(host, {"gpus": [
            {"uuid": f"GPU-node-a-{i}", "ts": start + k, "available": True, "utilization_pct": util,
             "memory_used_mb": 1000, "memory_total_mb": 143771, "temperature_c": 40 + i, "power_w": 100.0}
            for i, util in enumerate(utils)]})
    services.flush_buckets(everything=True)


def test_the_last_hour_reads_10_second_buckets_with_the_cluster_snapshot(world, client_for):
    now = time.time()
    _ingest_node_a(now - 60, 20, (40.0, 60.0))
    _job(world.vision, world.member, age_s=30)
    history.snapshot_cluster()
    body = client_for(world.member).get("/api/v1/metrics/cluster/?range=1h").json()
    assert body["resolution_s"] == 10
    util = [u for u in body["utilization_pct"] if u is not None]
    assert util and all(u == pytest.approx(50.0) for u in util)
    assert all(t % 10 == 0 for t in body["t"]) and body["t"] == sorted(body["t"])
    last = body["t"].index(max(body["t"]))
    assert body["queued"][last] == 1 and body["wait_max_s"][last] >= 30
    # 16 GPUs in the world: node-a's frame is live (idle), node-b never sent one (stale).
    assert body["gpus_idle"][last] + body["gpus_stale"][last] + body["gpus_allocated"][last] == 16

    host = client_for(world.member).get("/api/v1/hosts/node-a/metrics/?range=1h").json()
    assert host["host"] == "node-a" and max(t for t in host["temperature_c"] if t is not None) == 41
    assert {p for p in host["power_w"] if p is not None} == {200.0}  # two GPUs' power summed
    gpu = client_for(world.member).get("/api/v1/gpus/GPU-node-a-1/metrics/?range=24h").json()
    assert gpu["index"] == 1 and {u for u in gpu["utilization_pct"] if u is not None} == {60.0}


def test_a_range_beyond_a_day_reads_1_minute_buckets(world, client_for):
    now = timezone.now()
    minute = (now - timedelta(days=3)).replace(second=0, microsecond=0)
    gpu = world.gpus[0]
    GpuSampleBucket.objects.create(gpu=gpu, resolution_s=60, bucket_start=minute, samples=60, available_samples=60,
                                   utilization_avg=70.0, utilization_max=90.0, temperature_max=55.0)
    GpuSampleBucket.objects.create(gpu=gpu, resolution_s=10, bucket_start=minute, samples=10, available_samples=10,
                                   utilization_avg=10.0)  # a 10 s row the minute query must not read
    ClusterSample.objects.create(resolution_s=60, bucket_start=minute, gpus_busy=3, gpus_idle=13,
                                 teams={"vision": {"allocated": 3, "borrowed": 1, "quota": 8, "queued": 2,
                                                   "wait_max_s": 90, "wait_sum_s": 100}})
    query = urlencode({"from": (now - timedelta(days=4)).timestamp(), "to": (now - timedelta(days=2)).isoformat()})
    body = client_for(world.member).get(f"/api/v1/metrics/cluster/?{query}").json()
    assert body["resolution_s"] == 60
    assert body["t"] == [round(minute.timestamp())]
    assert body["utilization_pct"] == [70.0] and body["utilization_max_pct"] == [90.0]
    assert body["gpus_allocated"] == [3] and body["queued"] == [2] and body["wait_avg_s"] == [50.0]
    week = client_for(world.member).get("/api/v1/teams/vision/allocation/?range=7d").json()
    assert week["resolution_s"] == 60
    assert week["borrowed"] == [1] and week["guaranteed"] == [2] and week["quota"] == [8]


@pytest.mark.parametrize("query, field", [
    ("range=2y", "range"),
    ("range=1h&from=0", "range"),
    ("from=yesterday", "from"),
    ("from=2026-13-45T00:00:00", "from"),
    ("from={ago_60}&to={ago_120}", "to"),
    ("from={ago_40_days}", "from"),
    ("range=7d&resolution=10", "resolution"),
    ("range=1h&resolution=5", "resolution"),
])
def test_a_bad_range_is_a_400_naming_the_field(world, client_for, query, field):
    now = time.time()
    query = query.format(ago_60=now - 60, ago_120=now - 120, ago_40_days=now - 40 * 86400)
    for url in ("/api/v1/metrics/cluster/", "/api/v1/hosts/node-a/metrics/", "/api/v1/gpus/GPU-node-a-0/metrics/",
                "/api/v1/teams/vision/allocation/"):
        response = client_for(world.member).get(f"{url}?{query}")
        assert response.status_code == 400, (url, query)
        assert list(response.json()) == [field]


def test_each_persona_sees_only_its_teams_queue_and_allocation(world, client_for):
    _job(world.vision, world.member, age_s=10)
    _job(world.nlp, world.other, age_s=600)
    _job(world.nlp, world.other, age_s=300)
    _job(world.vision, world.member, state=Job.State.RUNNING, gpus=2)
    _job(world.vision, world.member, state=Job.State.RUNNING, gpus=1, borrowing=True)
    history.snapshot_cluster()

    def last(user, url: str, name: str):
        body = client_for(user).get(url).json()
        return body[name][-1] if body["t"] else None

    cluster = "/api/v1/metrics/cluster/?range=1h"
    assert last(world.member, cluster, "queued") == 1 and last(world.member, cluster, "wait_max_s") < 600
    assert last(world.other, cluster, "queued") == 2 and last(world.other, cluster, "wait_max_s") >= 600
    assert last(world.admin, cluster, "queued") == 3
    assert last(world.noteam, cluster, "queued") is None  # no team: no cluster, no queue
    vision = "/api/v1/teams/vision/allocation/?range=1h"
    assert last(world.viewer, vision, "allocated") == 3 and last(world.viewer, vision, "borrowed") == 1
    assert last(world.viewer, vision, "guaranteed") == 2 and last(world.viewer, vision, "quota") == 8
    assert client_for(world.other).get(vision).status_code == 404
    assert client_for(world.noteam).get("/api/v1/hosts/node-a/metrics/").status_code == 404
    assert client_for(world.noteam).get("/api/v1/gpus/GPU-node-a-0/metrics/").status_code == 404
    assert client_for(None).get(cluster).status_code == 401


def test_roll_up_and_retention_keep_10_s_a_day_and_1_min_a_month(world, settings):
    settings.TELEMETRY_KEEP_10S_HOURS, settings.TELEMETRY_KEEP_1M_DAYS = 24, 31
    now = datetime(2026, 12, 3, 12, 0, 30, tzinfo=UTC)
    minute = datetime(2026, 12, 3, 11, 50, tzinfo=UTC)
    for k, busy in enumerate((2, 4, 6)):
        ClusterSample.objects.create(resolution_s=10, bucket_start=minute + timedelta(seconds=10 * k), gpus_busy=busy,
                                     teams={"vision": {"allocated": busy, "queued": 1, "wait_max_s": 10 * k,
                                                       "wait_sum_s": 10 * k}})
    assert retention.roll_up_cluster_minutes(now) == 1
    rolled = ClusterSample.objects.get(resolution_s=60)
    assert rolled.bucket_start == minute and rolled.gpus_busy == 4 and rolled.snapshots == 3
    assert rolled.teams["vision"]["allocated"] == 4 and rolled.teams["vision"]["wait_max_s"] == 20
    assert retention.roll_up_cluster_minutes(now) == 0  # each minute once

    gpu = world.gpus[0]
    for resolution, age in ((10, timedelta(hours=23)), (10, timedelta(hours=25)), (60, timedelta(days=30)),
                            (60, timedelta(days=32))):
        GpuSampleBucket.objects.create(gpu=gpu, resolution_s=resolution, bucket_start=now - age, samples=1,
                                       available_samples=1)
        ClusterSample.objects.create(resolution_s=resolution, bucket_start=now - age)
    assert retention.prune(now) == 4
    for model in (GpuSampleBucket, ClusterSample):
        kept = set(model.objects.values_list("resolution_s", "bucket_start"))
        assert (10, now - timedelta(hours=23)) in kept and (60, now - timedelta(days=30)) in kept
        assert (10, now - timedelta(hours=25)) not in kept and (60, now - timedelta(days=32)) not in kept


def test_beat_writes_a_snapshot_every_interval_and_housekeeping_rolls_it_up(world, settings):
    from console.celery import app

    app.finalize()
    entry = app.conf.beat_schedule["cluster snapshot"]
    assert entry["task"] == "telemetry.cluster_snapshot"
    assert entry["schedule"] == float(settings.TELEMETRY_SNAPSHOT_S)
    assert tasks.cluster_snapshot() == {"written": 1}
    assert ClusterSample.objects.filter(resolution_s=10).count() == 1
    assert "cluster_rolled_up" in tasks.housekeeping()
